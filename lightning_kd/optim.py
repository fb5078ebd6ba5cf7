"""Learning-rate schedules and parameter groups for the student's optimizer."""

from __future__ import annotations

import math
from collections.abc import Iterable

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(
    optimizer: Optimizer,
    total_steps: int,
    warmup_fraction: float = 0.05,
    final_lr_fraction: float = 0.1,
) -> LambdaLR:
    """Linear warmup over ``warmup_fraction`` of the steps, then cosine decay.

    The rate ends at ``final_lr_fraction`` of its peak.

    ``total_steps`` counts optimizer steps (Lightning's ``estimated_stepping_batches``).
    """
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"scheduler.warmup_fraction={warmup_fraction} must lie in [0, 1)")
    warmup = max(1, round(warmup_fraction * total_steps)) if warmup_fraction > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return final_lr_fraction + (1 - final_lr_fraction) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    return LambdaLR(optimizer, factor)


def decay_groups(params: Iterable[nn.Parameter]) -> list[dict]:
    """Trainable parameters split into a decayed group (matrices) and an undecayed one.

    Biases and norm gains (1-D) get no weight decay, as in GPT-style training; the decayed group
    takes the optimizer's own ``weight_decay``.
    """
    decay, no_decay = [], []
    for param in params:
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
