"""A resume that splits each step's blocks otherwise (another micro-batch and accumulation, the
same product) trains the steps the uninterrupted run trains; another product is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.provenance import Provenance, ProvenanceMismatch
from lightning_kd.training.regrouping import Regrouping, regrouping
from lightning_kd.training.saving import LastCheckpoint
from tests.conftest import TEXT, TINY_LLAMA, make_datamodule, make_module, make_trainer

TEACHER = TeacherSpec(path=None, config=dict(TINY_LLAMA))


class StepBlocks(Callback):
    """The blocks (rows of ``input_ids``) each optimizer step trained on, by step."""

    def __init__(self) -> None:
        self.steps: dict[int, list[tuple[int, ...]]] = {}
        self.counts: list[tuple[int, int, int]] = []
        """Lightning's counts at each batch: (optimizer step, batch of the epoch, of the run)."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        rows = [tuple(row.tolist()) for row in batch["input_ids"]]
        self.steps.setdefault(trainer.global_step, []).extend(rows)
        run_wide = trainer.fit_loop.epoch_loop.total_batch_idx
        self.counts.append((trainer.global_step, batch_idx, run_wide))


def fit(
    where: Path, batch: int, accumulate: int, steps: int, ckpt: Path | None = None, mode="error"
):
    """Train to ``steps`` on 10 blocks (3 steps of 4 an epoch), a checkpoint every step; the
    student, each step's blocks, and ``last.ckpt``."""
    module = make_module(TEACHER)
    blocks = StepBlocks()
    callbacks = [LastCheckpoint(str(where / "checkpoints"), every=1), Provenance(mode), blocks]
    trainer = make_trainer(
        max_steps=steps,
        enable_checkpointing=True,
        accumulate_grad_batches=accumulate,
        callbacks=callbacks,
    )
    data = make_datamodule([corpus_file(where)], batch_size=batch, max_train_examples=10)
    trainer.fit(module, data, ckpt_path=ckpt)
    return module.student, blocks, where / "checkpoints" / "last.ckpt"


def corpus_file(where: Path) -> Path:
    path = where.parent / "corpus.txt"
    path.write_text(TEXT)
    return path


def same_steps(whole: dict, first: dict, rest: dict) -> None:
    """The interrupted run's steps, before and after its resume, are the whole run's."""
    resumed = first | rest
    assert sorted(resumed) == sorted(whole)
    for step, rows in whole.items():
        assert sorted(resumed[step]) == sorted(rows), f"step {step} read other blocks"


@pytest.mark.parametrize(
    ("then", "now", "stop"),
    [
        ((4, 1), (2, 2), 2),  # half the batch, twice the accumulation, mid-epoch
        ((4, 1), (2, 2), 3),  # after the epoch's last (partial) batch
        ((2, 2), (4, 1), 1),  # twice the batch
        ((4, 1), (1, 4), 2),
    ],
)
def test_a_resume_with_the_steps_split_otherwise_trains_the_same_steps(
    tmp_path: Path, then: tuple[int, int], now: tuple[int, int], stop: int
) -> None:
    """Before, Lightning's count of micro-batches was read in the new ones: half the batch and
    twice the accumulation trained 32 blocks of the epoch again (probe 47 F27)."""
    whole, whole_blocks, _ = fit(tmp_path / "whole", *then, steps=5)
    _, first, checkpoint = fit(tmp_path / "split", *then, steps=stop)
    student, rest, _ = fit(tmp_path / "split", *now, steps=5, ckpt=checkpoint)
    same_steps(whole_blocks.steps, first.steps, rest.steps)
    for (name, a), b in zip(whole.state_dict().items(), student.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize(("then", "now"), [((2, 2), (4, 1)), ((4, 1), (1, 4))])
def test_a_regrouped_resume_counts_batches_as_a_run_of_its_split_does(tmp_path, then, now):
    """Where Lightning counts batches it validates on its run-wide count: left in the
    checkpoint's batches, a resume into accumulation 1 after the first epoch validated at other
    steps and logged each later step one step early (probe 56)."""
    _, own, _ = fit(tmp_path / "own", *now, steps=5)  # the new split throughout
    _, _, checkpoint = fit(tmp_path / "split", *then, steps=4)  # in the second epoch
    _, resumed, _ = fit(tmp_path / "split", *now, steps=5, ckpt=checkpoint)
    assert resumed.counts == [count for count in own.counts if count[0] >= 4]


def test_the_resume_says_it_reads_the_same_steps_in_other_batches(tmp_path, capsys) -> None:
    _, _, checkpoint = fit(tmp_path / "run", 4, 1, steps=2)
    fit(tmp_path / "run", 2, 2, steps=3, ckpt=checkpoint)
    said = capsys.readouterr().out
    assert (
        "steps computed otherwise from here on: data.batch_size: checkpoint 4, this run 2; " in said
    )
    assert "trainer.accumulate_grad_batches: checkpoint 1, this run 2; the same 4 blocks" in said


def test_another_number_of_blocks_per_step_is_refused_with_the_product_to_keep(tmp_path) -> None:
    _, _, checkpoint = fit(tmp_path / "run", 4, 1, steps=2)
    with pytest.raises(ProvenanceMismatch) as refused:
        fit(tmp_path / "run", 2, 1, steps=3, ckpt=checkpoint)
    assert "data.batch_size: checkpoint 4, this run 2" in str(refused.value)
    assert re.search(r"A step of the checkpoint read 4 blocks .*, this run's 2", str(refused.value))


def record(batch: int, accumulate: int, processes: int = 1, **data) -> dict:
    split = {"batch_size": batch, "accumulate_grad_batches": accumulate, "processes": processes}
    whole = {"limit_train_batches": 1.0, "limit_val_batches": 1.0}
    return {"data": split | whole | data, "distill": {}}


def progress(processed: int, last: bool = False) -> dict:
    counts = {"ready": processed, "completed": processed - 1, "started": processed}
    batch = {"current": counts | {"processed": processed}, "is_last_batch": last}
    batch["total"] = dict(batch["current"])
    return {"loops": {"fit_loop": {"epoch_loop.batch_progress": batch}}}


def test_only_an_exact_move_is_regrouped() -> None:
    """Two processes to one with twice the accumulation is regrouped; a stream, on-policy
    draws, a share of the epoch or a checkpoint inside a window are not (module doc)."""
    two = regrouping(record(4, 1, 2), record(4, 2, 1), progress(6))
    assert two == Regrouping(
        {"batch_size": 4, "accumulate_grad_batches": 1, "processes": 2},
        {"batch_size": 4, "accumulate_grad_batches": 2, "processes": 1},
    )
    assert two.micro_batches(6) == 12
    assert regrouping(record(4, 1), record(4, 1), progress(6)) is None  # nothing to move
    assert regrouping(record(4, 1), record(2, 1), progress(6)) is None  # another step
    assert regrouping(record(4, 1, streaming=True), record(2, 2), progress(6)) is None
    on_policy = record(2, 2) | {"distill": {"on_policy": 0.5}}
    assert regrouping(record(4, 1), on_policy, progress(6)) is None
    assert regrouping(record(4, 1), record(2, 2, limit_train_batches=0.5), progress(6)) is None
    # validation counted in batches: other blocks once they are of another size (probe 56),
    # the same while data.val_batch_size x processes is (it was refused whatever the size)
    counted = {"limit_val_batches": 2, "val_batch_size": 8}
    assert regrouping(record(4, 1), record(2, 2, limit_val_batches=2), progress(6)) is None
    assert regrouping(record(4, 1, **counted), record(2, 2, **counted), progress(6)) is not None
    assert regrouping(record(4, 1, 2, **counted), record(4, 2, 1, **counted), progress(6)) is None
    halved = record(4, 2, 1, limit_val_batches=2, val_batch_size=16)
    assert regrouping(record(4, 1, 2, **counted), halved, progress(6)) is not None
    assert regrouping(record(2, 2), record(4, 1), progress(3)) is None  # inside a window
    assert regrouping(record(2, 2), record(4, 1), progress(3, last=True)) is not None
    assert regrouping(record(2, 2), record(4, 1), {"loops": {}}) is None


def test_a_split_that_keeps_the_step_but_cannot_be_read_so_says_why() -> None:
    """It was refused naming the batch size and accumulation alone, "resume with the same
    settings", where the docs say such a split continues the run (probe 56)."""
    from lightning_kd.training.regrouping import step_hint

    hint = step_hint(record(4, 1), record(2, 2, limit_train_batches=0.5), progress(3))
    assert hint == (
        "\nThe same 4 blocks per optimizer step, but not read as the same steps in other "
        "batches: trainer.limit_train_batches=0.5: a share counted in batches, not blocks"
    )
    assert step_hint(record(4, 1), record(2, 2), progress(6)) == ""  # it is regrouped
    counted = record(2, 2, limit_val_batches=2, val_batch_size=2)
    assert step_hint(record(4, 1, limit_val_batches=2, val_batch_size=4), counted, progress(6)) == (
        "\nThe same 4 blocks per optimizer step, but not read as the same steps in other "
        "batches: trainer.limit_val_batches=2: counted in validation batches of 4 blocks then, "
        "2 now (data.val_batch_size x processes)"
    )
    assert "A step of the checkpoint read 4 blocks" in step_hint(record(4, 1), record(2, 1), {})


def test_a_student_with_dropout_is_said_to_draw_other_masks() -> None:
    """Regrouped, each block gets another dropout mask: the same blocks, not the same numbers
    (a plain resume is bit-identical; probe 56)."""
    split = regrouping(record(4, 1), record(2, 2), progress(6))
    plain, dropping = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Dropout(0.1))
    assert split.lines(plain)[-1].endswith("read in other batches")
    assert split.lines(dropping)[-1].endswith("(the student's dropout draws other masks in them)")


def test_validation_counted_in_batches_records_their_size() -> None:
    """A plain resume with another data.val_batch_size under trainer.limit_val_batches=N read
    other blocks, its "after" measured on another set, without a word (stop 73's open item);
    with every validation batch read, the size is not recorded: any reads the same blocks."""
    from types import SimpleNamespace

    from lightning_kd.training.differences import differences
    from lightning_kd.training.regrouping import grouping_record

    def trainer(limit_val_batches: float | int, val_batch_size: int) -> SimpleNamespace:
        data = SimpleNamespace(val_batch_size=val_batch_size)
        counts = {"accumulate_grad_batches": 1, "world_size": 1, "limit_train_batches": 1.0}
        return SimpleNamespace(limit_val_batches=limit_val_batches, datamodule=data, **counts)

    def data(limit_val_batches: float | int, val_batch_size: int) -> dict:
        return {"data": grouping_record(trainer(limit_val_batches, val_batch_size))}

    assert "val_batch_size" not in data(1.0, 8)["data"]
    assert data(1, 8)["data"]["val_batch_size"] == 8  # one batch, not all of them
    assert differences(data(1.0, 8), data(1.0, 4)) == []
    assert differences(data(2, 8), data(2, 4)) == ["data.val_batch_size: checkpoint 8, this run 4"]
    older = {"data": {k: v for k, v in data(2, 8)["data"].items() if k != "val_batch_size"}}
    assert differences(older, data(2, 4)) == []  # saved before the size was recorded
