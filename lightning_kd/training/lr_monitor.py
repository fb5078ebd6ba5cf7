"""The learning rates logged once per optimizer step."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor


class StepLearningRates(LearningRateMonitor):
    """Lightning's learning-rate monitor, once per optimizer step: it logs at every batch whose
    step is due a log, so each batch of an accumulation window logged the same rates at the same
    step again (16 rows a step at ``trainer.accumulate_grad_batches=16``). Nor for a step a stop
    will not train: TensorBoard and MLflow held a rate at a step that process never trained,
    logged again by the resume (probe 47)."""

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        stopping = any(getattr(callback, "stopping", False) for callback in trainer.callbacks)
        if batch_idx % trainer.accumulate_grad_batches == 0 and not stopping:  # a window's first
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
