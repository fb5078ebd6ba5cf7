"""A resume that splits each optimizer step's blocks otherwise: ``data.batch_size``,
``trainer.accumulate_grad_batches`` and the process count (``trainer.devices`` ×
``trainer.num_nodes``) changed together, their product — the blocks of one step — the
checkpoint's. Halving the micro-batch and doubling the accumulation to fit a smaller GPU is the
common case; so is moving from two GPUs to one with twice the accumulation.

Every step then trains the very blocks it would have: the epoch's permutation is dealt as one
sequence (rank r takes every N-th block, ``data/loaders.py``), so step s reads the permutation's
s-th run of ``batch × accumulation × processes`` blocks however they are split, and the
token-sum accumulation (``distill/accumulation.py``) gives the gradient of their tokens whatever
the micro-batches. Only the epoch's position has to move: Lightning keeps it as a count of this
process's micro-batches, which the new split reads at another rate. The resume rewrites that
count once Lightning has restored it, before the epoch loop reads it; before, the old count was
read in the new micro-batches and part of the epoch was trained again (probe 47 F27).

Not regrouped (the differences refused, or warned about, as any other, the refusal saying why):
a streamed run (each process reads its own share of the stream), on-policy sampling (its draws
follow the micro-batches), a share of the epoch (``trainer.limit_train_batches``, counted in
batches), a share of validation (``limit_val_batches``) whose batches hold other blocks
(``data.val_batch_size`` × processes: validation read other blocks after the resume, probe 56),
and a checkpoint saved inside an accumulation window (but after an epoch's last
batch). A student with dropout is regrouped, the same blocks in each step, but its masks are
drawn in the new batches: the line says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lightning.pytorch import Trainer
from torch import nn

from lightning_kd.data.provenance import TRAINER_KEYS
from lightning_kd.utils.compat import (
    move_resumed_batches,
    resumed_batches_in_epoch,
    saved_batches_in_epoch,
)

GROUPING = ("batch_size", "accumulate_grad_batches", "processes")
"""The data record's keys whose product is the blocks of one optimizer step."""


def grouping_record(trainer: Trainer) -> dict[str, Any]:
    """The data record's trainer settings: how a step's blocks are grouped, and which share of
    an epoch and of validation is read (with, where validation is counted in batches, their
    size: which blocks it reads; a plain resume with another read other blocks)."""
    found = {
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        # Each process reads its own batches: another count is another global batch and
        # another order (trainer.devices × trainer.num_nodes).
        "processes": trainer.world_size,
        # Another share of an epoch moves its boundaries; of validation, what "after" is
        # measured on (the summary compared 120 blocks before with 10 after; probe 47).
        "limit_train_batches": trainer.limit_train_batches,
        "limit_val_batches": trainer.limit_val_batches,
    }
    if counts_batches(trainer.limit_val_batches):
        found["val_batch_size"] = getattr(trainer.datamodule, "val_batch_size", None)
    return found


@dataclass(frozen=True)
class Regrouping:
    """The checkpoint's split of a step (``then``) and this run's (``now``), by ``GROUPING``."""

    then: dict[str, int]
    now: dict[str, int]

    def lines(self, student: nn.Module | None = None) -> list[str]:
        """Each changed setting, named as a user sets it, and the step they all keep; where the
        ``student`` trains with dropout, that its masks are drawn otherwise."""
        changed = [
            f"{TRAINER_KEYS.get(key, f'data.{key}')}: checkpoint {self.then[key]!r}, "
            f"this run {self.now[key]!r}"
            for key in GROUPING
            if self.then[key] != self.now[key]
        ]
        blocks = math.prod(self.now.values())
        kept = f"the same {blocks} blocks per optimizer step, read in other batches"
        if student is not None and drops_out(student):  # a plain resume draws the same masks
            kept += " (the student's dropout draws other masks in them)"
        return [*changed, kept]

    def as_saved(self, current: dict[str, Any]) -> dict[str, Any]:
        """``current`` (a provenance record) with the checkpoint's split: compared so, the rest
        of the data record (the examples' digest included) is judged as it would be."""
        return current | {"data": current["data"] | self.then}

    def micro_batches(self, done: int) -> int:
        """This process's micro-batches that read what ``done`` of the checkpoint's did."""
        then = self.then["batch_size"] * self.then["processes"]
        # Exact inside an epoch: a step's blocks divide by the new batch (after its last batch,
        # rounded up, and at most the epoch's batches: see move).
        return -(-done * then // (self.now["batch_size"] * self.now["processes"]))

    def move(self, trainer: Trainer) -> None:
        """Rewrite a resumed fit's count of its epoch's batches in this run's micro-batches
        (``on_train_start``, the loop restored): at most the epoch's, so that one saved after its
        last batch ends it here too."""
        if done := resumed_batches_in_epoch(trainer):
            moved = min(self.micro_batches(done), trainer.num_training_batches)
            move_resumed_batches(trainer, moved)


def drops_out(model: nn.Module) -> bool:
    """Whether ``model`` trains with dropout: a dropout module above 0 (a LoRA adapter's), or a
    config's dropout probability above 0 (applied functionally, as Llama's attention's)."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    settings = vars(config) if config is not None else {}
    return any(
        ("dropout" in name or "pdrop" in name) and isinstance(value, float) and value > 0
        for name, value in settings.items()
    )


def regrouping(
    saved: dict[str, Any], current: dict[str, Any], checkpoint: dict[str, Any]
) -> Regrouping | None:
    """The regrouping from ``saved`` (a checkpoint's provenance record) to ``current``: None where
    the split is the same, the step's blocks differ, or the steps cannot be read in the new
    batches (:func:`blockers`)."""
    split = proposed(saved, current)
    if split is None or blockers(saved, current, checkpoint, split):
        return None
    return split


def proposed(saved: dict[str, Any], current: dict[str, Any]) -> Regrouping | None:
    """The split of the checkpoint's blocks per step otherwise, where only that changed."""
    then, now = saved.get("data"), current.get("data")
    if then is None or now is None or any(key not in then or key not in now for key in GROUPING):
        return None
    split = Regrouping({k: then[k] for k in GROUPING}, {k: now[k] for k in GROUPING})
    if split.then == split.now or math.prod(split.then.values()) != math.prod(split.now.values()):
        return None
    return split


def blockers(
    saved: dict[str, Any], current: dict[str, Any], checkpoint: dict[str, Any], split: Regrouping
) -> list[str]:
    """Why the same blocks per step, split otherwise, are not the same steps (the module doc)."""
    then, now = saved["data"], current["data"]
    found = []
    if then.get("streaming") or now.get("streaming"):
        found.append("data.streaming: each process reads its own share of the stream")
    if current["distill"].get("on_policy"):
        found.append("distill.on_policy: its draws follow the micro-batches")
    shares = then.get("limit_train_batches"), now.get("limit_train_batches")
    if any(map(counts_batches, shares)):  # counted in batches: other ones
        share = f"trainer.limit_train_batches={shares[1]}"
        found.append(f"{share}: a share counted in batches, not blocks")
    if any(counts_batches(record.get("limit_val_batches")) for record in (then, now)):
        sizes = [record.get("val_batch_size", 0) * record["processes"] for record in (then, now)]
        if sizes[0] != sizes[1] or not sizes[0]:  # the same blocks in each validation batch
            found.append(
                f"trainer.limit_val_batches={now.get('limit_val_batches')}: counted in "
                f"validation batches of {sizes[0]} blocks then, {sizes[1]} now "
                "(data.val_batch_size x processes)"
            )
    saved_count = saved_batches_in_epoch(checkpoint)
    if saved_count is None:
        found.append("the checkpoint holds no loop state to move")
    elif saved_count[0] % split.then["accumulate_grad_batches"] and not saved_count[1]:
        found.append("the checkpoint was saved inside an accumulation window")
    return found


def counts_batches(share: Any) -> bool:
    """Whether ``trainer.limit_*_batches`` reads part of its loader, a count of batches or a
    share of them: which blocks then depends on the batches' size (1.0: every block)."""
    return not isinstance(share, float) or share != 1.0


BATCHING = ("data.batch_size", "trainer.accumulate_grad_batches", "processes")
"""Differences that move where in its epoch a resume reads: Lightning keeps the batch index."""


def continuing(lines: list[str]) -> str:
    """The last line of a warned resume: where the batching changed and could not be regrouped
    (another step, or one of the module doc's cases), that the epoch's position is kept as a
    batch index, so this epoch's data is read again or skipped."""
    if any(line.startswith(BATCHING) for line in lines):
        return (
            "\n(resume_mismatch=warn: continuing; the epoch's position is kept as a batch index, "
            "not a sample: part of this epoch's data is read again or skipped)"
        )
    return "\n(resume_mismatch=warn: continuing)"


def step_hint(saved: dict[str, Any], current: dict[str, Any], checkpoint: dict[str, Any]) -> str:
    """Where the blocks of one optimizer step changed, the checkpoint's split of them: keeping
    their product is what lets a resume read the same steps in other batches; where it kept
    them but cannot, why (it said only "resume with the same settings"; probe 56)."""
    then, now = saved.get("data") or {}, current.get("data") or {}
    if any(key not in then or key not in now for key in GROUPING):
        return ""
    blocks = [math.prod(record[key] for key in GROUPING) for record in (then, now)]
    if blocks[0] == blocks[1]:
        split = proposed(saved, current)
        reasons = blockers(saved, current, checkpoint, split) if split else []
        return (
            f"\nThe same {blocks[0]} blocks per optimizer step, but not read as the same steps "
            f"in other batches: {'; '.join(reasons)}"
            if reasons
            else ""
        )
    split = " × ".join(f"{TRAINER_KEYS.get(key, f'data.{key}')} {then[key]}" for key in GROUPING)
    return (
        f"\nA step of the checkpoint read {blocks[0]} blocks ({split}), this run's {blocks[1]}: "
        "a resume whose product is the checkpoint's reads the same steps in other batches"
    )
