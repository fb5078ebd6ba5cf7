"""The training progress bar in optimizer steps of the run, not batches of an epoch.

Lightning's bar counts the current epoch's batches: ``Epoch 0: 9/?`` where the loader has no
length (no total, no time left), restarting at each epoch, and under
``trainer.accumulate_grad_batches`` a count of micro-batches read as steps. A run is planned in
optimizer steps (``trainer.max_steps``): one bar of those for the whole run, with its rate and
time left, a resume's starting where its checkpoint is.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar


def total_steps(trainer: Trainer) -> int | None:
    """The optimizer steps the run ends at: ``trainer.max_steps``, else Lightning's estimate
    from the epochs (None where it has none: a stream without an end)."""
    if trainer.max_steps > 0:
        return trainer.max_steps
    estimate = trainer.estimated_stepping_batches
    return int(estimate) if math.isfinite(estimate) else None


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, training counted in optimizer steps of the run (see the module
    doc); validation bars as Lightning's."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        bar = self.train_progress_bar
        bar.reset(total=total_steps(trainer))
        bar.n = bar.initial = trainer.global_step  # a resume's rate: this launch's steps
        self.on_train_epoch_start(trainer)  # a resume mid-epoch names its epoch too

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        """One bar for the run: each epoch named on it, not a new count."""
        epoch = trainer.current_epoch
        self.train_progress_bar.set_description(
            f"Training (epoch {epoch})" if epoch else "Training"
        )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        bar, step = self.train_progress_bar, trainer.global_step
        if step != bar.n and self._should_update(step, bar.total):  # a step taken
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes it

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
