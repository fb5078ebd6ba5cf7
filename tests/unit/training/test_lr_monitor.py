"""``training/lr_monitor.py``: the learning rates logged once per optimizer step."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.loggers import CSVLogger

from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.lr_monitor import StepLearningRates
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer


def test_the_rates_are_logged_once_a_step_with_accumulation(tmp_path: Path, corpus: Path) -> None:
    """Each batch of a window logged them again at the same step."""
    logger = CSVLogger(tmp_path, name="", version="")
    trainer = make_trainer(
        max_steps=3,
        accumulate_grad_batches=2,
        log_every_n_steps=1,
        logger=logger,
        callbacks=[StepLearningRates(logging_interval="step")],
        limit_val_batches=0,
    )
    module = make_module(TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    trainer.fit(module, make_datamodule([corpus]))
    with open(Path(logger.log_dir) / "metrics.csv") as handle:
        steps = [row["step"] for row in csv.DictReader(handle) if row.get("lr-AdamW/pg1")]
    assert steps == ["0", "1", "2"]


class Stopping(Callback):
    """Stands for the checkpoint callback once the ranks agreed to stop after step 2."""

    def __init__(self) -> None:
        self.stopping = False

    def on_train_batch_end(self, trainer, *args) -> None:
        self.stopping = trainer.global_step >= 2


def test_no_rate_is_logged_for_a_step_a_stop_will_not_train(tmp_path: Path, corpus: Path) -> None:
    """TensorBoard and MLflow held a rate at the step a SIGTERM stopped before, which that
    process never trained (probe 47)."""
    logger = CSVLogger(tmp_path, name="", version="")
    trainer = make_trainer(
        max_steps=4,
        log_every_n_steps=1,
        logger=logger,
        callbacks=[Stopping(), StepLearningRates(logging_interval="step")],
        limit_val_batches=0,
    )
    module = make_module(TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    trainer.fit(module, make_datamodule([corpus]))
    with open(Path(logger.log_dir) / "metrics.csv") as handle:
        steps = [row["step"] for row in csv.DictReader(handle) if row.get("lr-AdamW/pg1")]
    assert steps == ["0", "1"]
