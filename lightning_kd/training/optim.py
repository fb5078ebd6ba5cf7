"""Learning-rate schedules and parameter groups for the student's optimizer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import SGD, Optimizer
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_cosine_with_min_lr_schedule_with_warmup


def warmup_cosine(
    optimizer: Optimizer,
    total_steps: int,
    warmup_fraction: float = 0.05,
    final_lr_fraction: float = 0.1,
) -> LambdaLR:
    """Linear warmup over ``warmup_fraction`` of the steps, then cosine decay to
    ``final_lr_fraction`` of the peak (transformers' cosine schedule with a floor).

    ``total_steps`` counts optimizer steps (Lightning's ``estimated_stepping_batches``). Two
    edges differ from transformers, as they always did here:

    - warmup step ``s`` (from 0) trains at ``(s + 1) / warmup`` of the peak, not ``s / warmup``:
      no step trains at 0 (a 1-step run, whose warmup ``max(1, …)`` is that step, would train
      nothing). The peak is reached at the last warmup step and held one more step.
    - steps past ``total_steps`` (Lightning's estimate can fall a step short when each epoch's
      last, partial accumulation window also steps) stay at ``final_lr_fraction``; transformers'
      cosine would rise again.
    """
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"scheduler.warmup_fraction={warmup_fraction} must lie in [0, 1)")
    warmup = max(1, round(warmup_fraction * total_steps)) if warmup_fraction > 0 else 0
    # transformers hands out its factor only inside a LambdaLR (one per parameter group, all
    # alike): take it from there.
    factor = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total_steps,
        min_lr_rate=final_lr_fraction,
    ).lr_lambdas[0]
    # Where the cosine reaches its floor (one step after a warmup as long as the run).
    end = max(total_steps, warmup + 1)
    return LambdaLR(optimizer, lambda step: factor(step + 1 if step < warmup else min(step, end)))


def same_rates_from(scheduler: Callable[..., Any] | None, step: int, then: int, now: int) -> bool:
    """Whether ``scheduler`` (``(optimizer, total_steps) -> LambdaLR``) planned for ``then``
    steps and for ``now`` gives the same learning rate from optimizer step ``step`` on: a run
    extended (a larger ``trainer.max_steps``) past a warmup both plans finished, under a
    schedule that holds its rate (``scheduler=constant``), trains on as it would have. It was
    refused as another schedule, whose only way on discards the optimizer's moments (probe 47).
    Each plan is built on a probe optimizer of its own: the run's is left as it is."""
    if scheduler is None or min(then, now) < 1:
        return False
    rates = []
    for total in (then, now):
        plan = scheduler(SGD([torch.zeros(1, requires_grad=True)], lr=1.0), total_steps=total)
        factors = getattr(plan, "lr_lambdas", None)
        if not factors:  # not a LambdaLR: its rates are not read here
            return False
        rates.append([factor(s) for factor in factors for s in range(step, max(then, now) + 2)])
    return rates[0] == rates[1]


def decay_groups(params: Iterable[nn.Parameter]) -> list[dict]:
    """Trainable parameters split into a decayed group (matrices) and an undecayed one.

    Biases and norm gains (1-D) get no weight decay, as in GPT-style training; the decayed group
    takes the optimizer's own ``weight_decay``.
    """
    decay, no_decay = [], []
    for param in params:
        if param.requires_grad:
            (decay if len(true_shape(param)) >= 2 else no_decay).append(param)
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    # An empty group would be dropped by DeepSpeed's engine, leaving a scheduler with one
    # learning rate more than its optimizer has groups.
    return [group for group in groups if group["params"]]


def true_shape(param: nn.Parameter) -> tuple[int, ...]:
    """``param``'s shape, also under DeepSpeed ZeRO-3, which partitions a parameter built in
    ``configure_model`` to an empty 1-D tensor and keeps the real shape in ``ds_shape`` (read as
    1-D, every matrix would lose its weight decay and the decayed group be empty: on an H200,
    ZeRO-3's first scheduler step then failed on the dropped group)."""
    return tuple(getattr(param, "ds_shape", param.shape))


def optimizer_config(
    optimizer: Callable[..., Optimizer] | None,
    scheduler: Callable[..., Any] | None,
    params: Iterable[nn.Parameter],
    total_steps: Callable[[], int],
) -> dict[str, Any]:
    """What ``configure_optimizers`` returns: ``optimizer`` over ``params`` in decay groups, and
    ``scheduler`` (``(optimizer, total_steps) -> scheduler``, ``total_steps()`` asked only then)
    stepped every optimizer step."""
    if optimizer is None:
        raise ValueError(
            "DistillationModule has no optimizer (a module loaded with load_from_checkpoint "
            "does not store one): pass optimizer=functools.partial(torch.optim.AdamW, lr=...)"
        )
    built = optimizer(decay_groups(params))
    if scheduler is None:
        return {"optimizer": built}
    schedule = scheduler(built, total_steps=total_steps())
    return {"optimizer": built, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
