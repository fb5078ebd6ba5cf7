"""``train/grad_norm``: the L2 norm of an optimizer step's gradient, before clipping.

A long run's first sign of trouble (a spike before the loss moves) was not logged (probe 47).
It is the norm of the window's mean gradient (``on_before_optimizer_step``, after the exact
rescaling and before ``gradient_clip_val``), where each process holds whole gradients (one
device, DDP: all-reduced, alike on every rank). Where they are sharded (FSDP, DeepSpeed) a
process's norm would be its shard's, so none is logged.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel


def gradient_norm(trainer, params: Iterable[nn.Parameter]) -> dict[str, float]:
    """``{"train/grad_norm": norm}`` of ``params``' gradients, or ``{}`` where they are sharded
    or there are none."""
    if isinstance(trainer.model, FullyShardedDataParallel):
        return {}
    if trainer.strategy.handles_gradient_accumulation:  # DeepSpeed partitions them
        return {}
    grads = [p.grad for p in params if p.grad is not None]
    return {"train/grad_norm": float(torch.nn.utils.get_total_norm(grads))} if grads else {}
