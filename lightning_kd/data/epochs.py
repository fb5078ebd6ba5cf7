"""Whether a training epoch holds the batches and the accumulation windows a run asks for.

Lightning closes an accumulation window at each epoch's end, and a batch holds what is left of
an epoch. So ``data.batch_size`` above the examples a process reads in an epoch made every batch
smaller than asked, and ``trainer.accumulate_grad_batches`` above the batches of an epoch made
every optimizer step one epoch: a run bit-identical to one without accumulation, said nowhere.
Both are refused before the models load. An epoch whose batches are not a multiple of the window
ends on a shorter one, as Lightning (and Hugging Face's Trainer) do: said once, where the run
reaches an epoch's end.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from lightning_kd.data.errors import DataError
from lightning_kd.data.loaders import ranks


def check_epoch(datamodule) -> None:
    """Refuse a training epoch (of ``datamodule``, under its trainer) smaller than one batch or
    one accumulation window; warn where it ends on a shorter window. Nothing without a trainer,
    or for a stream (its epoch has no length)."""
    trainer = datamodule.trainer
    if trainer is None or datamodule.stream is not None or not datamodule.train_examples:
        return
    _, world_size = ranks(trainer)
    error, note = epoch_problems(
        len(datamodule.train_examples),
        datamodule.batch_size,
        Run(trainer.accumulate_grad_batches, trainer.limit_train_batches, trainer.max_steps),
        world_size,
    )
    if error:
        raise DataError(error)
    if note:
        warnings.warn(note, stacklevel=2)


@dataclass(frozen=True)
class Run:
    """The trainer settings an epoch is judged by."""

    window: int = 1
    """``trainer.accumulate_grad_batches``"""
    limit: int | float | None = None
    """``trainer.limit_train_batches``"""
    max_steps: int | None = -1


def epoch_problems(
    examples: int, batch_size: int, run: Run, world_size: int = 1
) -> tuple[str | None, str | None]:
    """``(refusal, note)`` for an epoch of ``examples`` training examples shared by
    ``world_size`` processes (each padded to the same count)."""
    per_process = math.ceil(examples / world_size)
    each = f"{per_process} training examples" + (" per process" if world_size > 1 else "")
    if batch_size > per_process:
        return (
            f"data.batch_size={batch_size} but an epoch holds {each}, so every batch would hold "
            f"{per_process}; set data.batch_size={per_process} or less, or train on more data"
        ), None
    batches, window = limited(math.ceil(per_process / batch_size), run.limit), run.window
    if window > batches:
        return (
            f"trainer.accumulate_grad_batches={window} but an epoch is {batches} batch(es) "
            f"({each}, data.batch_size={batch_size}), and each epoch's end closes the window: "
            f"every optimizer step would take {batches}, as without accumulation; set "
            f"trainer.accumulate_grad_batches={batches} or less, or a smaller data.batch_size"
        ), None
    steps = run.max_steps
    reaches_an_end = steps is None or steps < 0 or steps * window > batches
    if batches % window and reaches_an_end:
        return None, (
            f"an epoch is {batches} batches, not a multiple of trainer.accumulate_grad_batches="
            f"{window}: each epoch's last optimizer step takes {batches % window} batch(es)"
        )
    return None, None


def limited(batches: int, limit: int | float | None) -> int:
    """The batches of an epoch under ``trainer.limit_train_batches`` (a count, or a share)."""
    if limit is None:
        return batches
    if isinstance(limit, float) and limit <= 1.0:
        return max(1, int(batches * limit))
    return min(batches, int(limit))
