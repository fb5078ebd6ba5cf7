"""When last.ckpt is written: every N steps, at validation, at the end, on the way out."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from lightning_kd.training.checkpoints import SafeCheckpointIO
from lightning_kd.training.finite import NonFiniteError
from lightning_kd.training.saving import LastCheckpoint
from tests.conftest import make_datamodule, make_module, make_trainer


class Record(Callback):
    """Notes the step of each checkpoint written."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.steps.append(checkpoint["global_step"])


class FailInValidation(Callback):
    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 2:
            raise RuntimeError("validation broke")


def fit(tmp_path, teacher, corpus, *callbacks, every=2, **trainer_options) -> LastCheckpoint:
    saver = LastCheckpoint(str(tmp_path / "checkpoints"), every=every)
    options = {
        "max_steps": 5,
        "limit_val_batches": 1,
        "plugins": [SafeCheckpointIO()],
        "enable_checkpointing": True,
    }
    trainer = make_trainer(callbacks=[saver, *callbacks], **options | trainer_options)
    trainer.fit(make_module(teacher), make_datamodule([corpus]))
    return saver


def test_every_n_steps_each_validation_and_the_end(tiny_teacher, corpus, tmp_path) -> None:
    record = Record()
    saver = fit(tmp_path, tiny_teacher, corpus, record, val_check_interval=3)
    assert record.steps == [2, 3, 4, 5]  # every 2; validation after step 3; the end
    assert saver.saved_step == 5
    state = torch.load(saver.path, weights_only=True)
    assert state["global_step"] == 5 and "provenance" not in state  # (a callback adds that)


def test_an_exception_at_a_step_boundary_saves_that_step(tiny_teacher, corpus, tmp_path) -> None:
    with pytest.raises(RuntimeError, match="validation broke"):
        fit(tmp_path, tiny_teacher, corpus, FailInValidation(), val_check_interval=2, every=50)
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2


def test_non_finite_weights_are_never_saved(tiny_teacher, corpus, tmp_path) -> None:
    class Poison(Callback):
        """A NaN weight that step 4's (finite) loss never saw: its update spreads it."""

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            if trainer.global_step == 3:
                with torch.no_grad():
                    next(p for p in pl_module.student.parameters() if p.requires_grad).fill_(
                        float("nan")
                    )

    record = Record()
    with pytest.raises(NonFiniteError, match=r"not finite after optimizer step 4"):
        fit(tmp_path, tiny_teacher, corpus, Poison(), record)
    assert record.steps == [2]


def test_a_validation_inside_an_accumulation_window_saves_nothing(
    tiny_teacher, corpus, tmp_path
) -> None:
    """A Trainer of one's own validating every 6 batches of 4-batch steps: a checkpoint there
    holds half a window, which a resume would skip. Only step boundaries are saved."""

    class Batches(Callback):
        def __init__(self) -> None:
            self.at_save: list[int] = []

        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            self.at_save.append(trainer.fit_loop.epoch_loop.batch_progress.current.completed)

    batches = Batches()
    fit(
        tmp_path,
        tiny_teacher,
        corpus,
        batches,
        every=50,
        max_steps=3,
        accumulate_grad_batches=4,
        val_check_interval=6,
    )
    assert batches.at_save and all(count % 4 == 0 for count in batches.at_save), batches.at_save


def test_a_stop_asked_before_the_first_step_stops_before_it(tiny_teacher, corpus, tmp_path) -> None:
    """SIGTERM while the models loaded was honoured only after a whole first step (a compile of
    the loss, then a checkpoint written), 20 s past a `docker stop`'s grace (probe 33)."""
    import os
    import signal

    from lightning_kd.utils.stopping import STOP, Interrupted

    record = Record()
    with STOP.installed():
        os.kill(os.getpid(), signal.SIGTERM)  # as the launch's handlers record it, models loading
        with pytest.raises(Interrupted, match=r"^SIGTERM received: stopped as training started$"):
            fit(tmp_path, tiny_teacher, corpus, record)
    assert record.steps == [] and not (tmp_path / "checkpoints" / "last.ckpt").exists()


class Blocks(Callback):
    """The first token of each block trained, by optimizer step."""

    def __init__(self) -> None:
        self.steps: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        firsts = batch["input_ids"][:, 0].tolist()
        self.steps.setdefault(trainer.global_step, []).extend(firsts)


def test_a_finished_run_extended_goes_on_inside_the_epoch_it_ended_in(
    tiny_teacher, corpus, tmp_path
) -> None:
    """Lightning closes the epoch as fit ends at trainer.max_steps: the checkpoint then saved
    counted it done, and the extension began the next epoch two batches in, training other
    blocks than the longer run does (probe 56)."""

    def run(where, steps: int, ckpt=None) -> Blocks:
        blocks = Blocks()
        saver = LastCheckpoint(str(where / "checkpoints"), every=10)  # saved at the end alone
        options = {"max_steps": steps, "limit_val_batches": 0, "enable_checkpointing": True}
        trainer = make_trainer(callbacks=[saver, blocks], **options)
        data = make_datamodule([corpus], max_train_examples=10)  # 3 batches an epoch
        trainer.fit(make_module(tiny_teacher), data, ckpt_path=ckpt)
        return blocks

    whole = run(tmp_path / "whole", 5)
    first = run(tmp_path / "run", 2)
    extended = run(tmp_path / "run", 5, ckpt=tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert first.steps | extended.steps == whole.steps
