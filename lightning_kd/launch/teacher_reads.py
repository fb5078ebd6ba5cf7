"""How often a run reads its teacher, from the config alone: training's passes over the
training blocks, the block-wise repair's, and the validations' reads, on every process the run
trains on (each reads its own share of the blocks): what ``distill.teacher_cache=auto`` weighs
(``teacher_cache.py``)."""

from __future__ import annotations

import math

from omegaconf import DictConfig

from lightning_kd.launch.nodes import process_count
from lightning_kd.utils.refusal import is_number


def processes(cfg: DictConfig) -> int:
    """The processes the run trains on (``launch/nodes.py``), each reading its own batches."""
    trainer = cfg.trainer
    return process_count(
        trainer.get("devices", 1), trainer.get("num_nodes") or 1, trainer.get("accelerator")
    )


def passes(cfg: DictConfig, train_examples: int) -> float:
    """How many times the run reads the teacher over its ``train_examples`` training blocks:
    its training passes and its block-wise repair's (:func:`repair_passes`)."""
    return training_passes(cfg, train_examples) + repair_passes(cfg, train_examples)


def training_passes(cfg: DictConfig, train_examples: int) -> float:
    """Passes over the ``train_examples`` blocks that training's steps read, on every process:
    each reads its own batches (a step of 2 processes reads twice the blocks of one)."""
    trainer, world = cfg.trainer, processes(cfg)
    # A batch cannot read more blocks than there are: data.batch_size=100000 over 180 blocks
    # reads the 180 once a batch, not 555 times.
    per_batch = min(cfg.data.batch_size * world, train_examples)
    per_step = per_batch * (trainer.get("accumulate_grad_batches") or 1)
    if trainer.max_steps not in (None, -1):
        return trainer.max_steps * per_step / train_examples
    # An epoch reads its batches' blocks: all of them, or trainer.limit_train_batches' share.
    read = epoch_batches(cfg, train_examples) * cfg.data.batch_size * world
    return (trainer.get("max_epochs") or 1) * min(train_examples, read) / train_examples


def repair_passes(cfg: DictConfig, train_examples: int) -> float:
    """``distill.blockwise_passes`` in passes over the blocks: a repair pass reads at most as many
    blocks as training does (``loaders.FullBatchShare``). None of the teacher's where the student
    is copied from ``student.source``, whose own model the repair runs."""
    if cfg.student.get("source") is not None:
        return 0.0
    repair = cfg.distill.get("blockwise_passes") or 0
    return repair * min(1.0, training_passes(cfg, train_examples))


def validation_reads(cfg: DictConfig, val_examples: int, train_examples: int) -> float:
    """The validation blocks the run's validations read, each of its ``val_examples`` blocks
    as often as read: before training (``validate_before``), every ``val_check_interval``
    optimizer steps (a fraction: of an epoch's; none: once an epoch) and after the last step
    (``trainer.limit_val_batches`` batches each, where set)."""
    trainer = cfg.trainer
    limit, per = trainer.get("limit_val_batches"), float(val_examples)
    if isinstance(limit, int) and not isinstance(limit, bool):  # batches of each process
        batch = cfg.data.get("val_batch_size") or cfg.data.batch_size
        per = min(per, limit * batch * processes(cfg))
    elif isinstance(limit, float):
        per *= limit
    epoch = epoch_steps(cfg, train_examples)
    steps, interval = trainer.max_steps, trainer.get("val_check_interval")
    if steps in (None, -1):
        steps = epoch * (trainer.get("max_epochs") or 1)
    if not is_number(interval) or interval <= 0:
        interval = epoch
    elif isinstance(interval, float):
        interval = max(1.0, epoch * interval)
    return per * (math.ceil(steps / interval) + bool(cfg.get("validate_before", True)))


def epoch_steps(cfg: DictConfig, train_examples: int) -> int:
    """The optimizer steps of an epoch over ``train_examples`` blocks (at least one)."""
    batches = epoch_batches(cfg, train_examples)
    return max(1, math.ceil(batches / (cfg.trainer.get("accumulate_grad_batches") or 1)))


def epoch_batches(cfg: DictConfig, train_examples: int) -> int:
    """The batches each process reads in an epoch over ``train_examples`` blocks (its share of
    them: Lightning's distributed sampler): every one, or ``trainer.limit_train_batches`` of
    them (a count, or a share of the epoch)."""
    share = math.ceil(train_examples / processes(cfg))
    batches = math.ceil(share / max(1, cfg.data.batch_size))
    limit = cfg.trainer.get("limit_train_batches")
    if not is_number(limit) or limit <= 0:
        return batches
    return min(batches, limit) if isinstance(limit, int) else min(batches, int(batches * limit))
