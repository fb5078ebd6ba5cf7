"""``training/progress.py``: the training bar counts the run's optimizer steps."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback

from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.checkpoints import SafeCheckpointIO
from lightning_kd.training.progress import StepProgressBar
from lightning_kd.training.saving import LastCheckpoint
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer


class Seen(Callback):
    """Notes the training bar's count and total after each batch."""

    def __init__(self, bar: StepProgressBar) -> None:
        self.bar, self.seen = bar, []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.seen.append((self.bar.train_progress_bar.n, self.bar.train_progress_bar.total))


def fit(tmp_path: Path, corpus: Path, max_steps: int, ckpt_path: Path | None = None) -> Seen:
    bar = StepProgressBar()
    seen = Seen(bar)
    saver = LastCheckpoint(str(tmp_path / "checkpoints"), every=1)
    trainer = make_trainer(
        tmp_path,
        max_steps=max_steps,
        accumulate_grad_batches=2,
        limit_val_batches=0,
        enable_progress_bar=True,
        plugins=[SafeCheckpointIO()],
        callbacks=[bar, seen, saver],  # after the bar: its count once it has updated
    )
    module = make_module(TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    trainer.fit(module, make_datamodule([corpus]), ckpt_path=ckpt_path)
    return seen


def test_the_bar_counts_optimizer_steps_of_the_run_and_a_resume_goes_on(tmp_path, corpus) -> None:
    """It counted an epoch's batches, two a step here, with no total (``Epoch 0: 9/?``)."""
    first = fit(tmp_path, corpus, max_steps=3)
    assert first.seen == [(0, 3), (1, 3), (1, 3), (2, 3), (2, 3), (3, 3)]
    again = fit(tmp_path, corpus, max_steps=5, ckpt_path=tmp_path / "checkpoints" / "last.ckpt")
    assert again.seen == [(3, 5), (4, 5), (4, 5), (5, 5)]
