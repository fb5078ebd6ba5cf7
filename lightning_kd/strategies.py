"""Lightning's own distributed strategies, configured for a frozen teacher beside a student.

Nothing here re-implements a strategy: these functions only build Lightning's ``DDPStrategy``,
``FSDPStrategy`` and ``DeepSpeedStrategy`` with the settings a second, frozen model needs.

- DDP: frozen teacher parameters are not in the reducer, so ``find_unused_parameters`` stays off.
- FSDP: every transformer block, and each whole model, is a wrap unit of its own, so a bf16
  teacher and an fp32 student never share a flat parameter ("Must flatten tensors with uniform
  dtype"), and the teacher is sharded too. Activation checkpointing by policy goes to trainable
  blocks only: the student's, never the teacher's (which keeps no activations anyway).
- DeepSpeed: frozen parameters are excluded from checkpoints; the optimizer never sees them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

GPU_ONLY = {"fsdp": "FSDPStrategy", "deepspeed": "DeepSpeedStrategy"}


def is_block(module: nn.Module) -> bool:
    """A transformer block: what Hugging Face models checkpoint layer by layer."""
    return isinstance(module, GradientCheckpointingLayer)


ROLE = "distillation_role"
"""Attribute the LightningModule sets on its teacher and student (``"teacher"``/``"student"``):
how a wrap policy, which sees one module at a time, tells a whole model from its inner base model
(wrapping both would split a tied embedding and head across two units)."""


def is_wrap_unit(module: nn.Module) -> bool:
    """FSDP wrap units: each block, and each whole model (teacher, student)."""
    return is_block(module) or getattr(module, ROLE, None) is not None


def is_trainable_block(module: nn.Module) -> bool:
    """A block with trainable parameters: a student block (teacher blocks are all frozen)."""
    return is_block(module) and any(p.requires_grad for p in module.parameters())


def _lambda_policy(predicate):
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    return functools.partial(lambda_auto_wrap_policy, lambda_fn=predicate)


def ddp(**kwargs: Any):
    """Lightning's DDPStrategy (gloo on CPU, NCCL on GPU) without unused-parameter search."""
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(**{"find_unused_parameters": False, **kwargs})


def fsdp(activation_checkpointing: bool = False, **kwargs: Any):
    """Lightning's FSDPStrategy with teacher and student in separate units (see module doc).

    ``activation_checkpointing=True`` checkpoints the student's blocks by FSDP's policy (use it
    instead of ``student.activation_checkpointing``, not with it).
    """
    from lightning.pytorch.strategies import FSDPStrategy

    options: dict[str, Any] = {
        "auto_wrap_policy": _lambda_policy(is_wrap_unit),
        "state_dict_type": "full",
    }
    if activation_checkpointing:
        options["activation_checkpointing_policy"] = _lambda_policy(is_trainable_block)
    return FSDPStrategy(**{**options, **kwargs})


def deepspeed(stage: int = 3, **kwargs: Any):
    """Lightning's DeepSpeedStrategy (ZeRO ``stage``) saving no frozen teacher parameters."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return DeepSpeedStrategy(**{"stage": stage, "exclude_frozen_parameters": True, **kwargs})


def check_accelerator(strategy: str | None, accelerator: str | None) -> None:
    """Refuse a GPU-only strategy without a GPU, naming the alternative."""
    name = (strategy or "").lower()
    kind = next((key for key in GPU_ONLY if key in name), None)
    if kind is None:
        return
    wants_cpu = (accelerator or "auto") == "cpu"
    if wants_cpu or not torch.cuda.is_available():
        raise ValueError(
            f"strategy={kind} ({GPU_ONLY[kind]}) needs a CUDA GPU, and this run has "
            f"{'trainer.accelerator=cpu' if wants_cpu else 'none'}; on CPUs use "
            "strategy=ddp (gloo) with trainer.devices=N, or run on a GPU machine"
        )
