"""Lightning's own distributed strategies, configured for a frozen teacher beside a student.

Nothing here re-implements a strategy: these build Lightning's ``DDPStrategy``, ``FSDPStrategy``
and ``DeepSpeedStrategy`` with the settings a second, frozen model needs.

- DDP: frozen teacher parameters are not in the reducer, so ``find_unused_parameters`` stays off.
- FSDP: FSDP gathers a unit's parameters only while that unit's own forward (or backward) runs,
  and the step calls the models' bodies and reads their output heads directly (the chunked loss
  never runs the heads as modules). So the wrap units are what the step calls: every transformer
  block, and each teacher's body (``base_model``: the main teacher's and every ``teachers``
  entry's run online). The student's embeddings, final norm
  and head stay in the root unit with the projectors, gathered for the whole step (forward and
  backward), where the chunked loss reads the head. Each teacher's output head (its embedding,
  when tied) is left unsharded (FSDP ``ignored_states``), so the loss can read it too. No flat
  parameter mixes a bf16 teacher with an fp32 student ("Must flatten tensors with uniform
  dtype"). Activation checkpointing by policy goes to trainable blocks only: the student's.
  On-policy sampling runs inside the root's forward too (``training_step``), so the student's
  ``generate`` finds its root-unit weights gathered and gathers each block per token; its blocks
  being units is what makes the ranks decode in step (``generation/decoding.decodes_in_step``).
- DeepSpeed: frozen parameters are excluded from checkpoints; the optimizer never sees them.
  Under ZeRO-3 DeepSpeed gathers the partitioned heads the chunked loss reads inside the step
  (tested on CPUs: the step equals the unsharded one). DeepSpeed accumulates gradients itself:
  Lightning then runs the optimizer hooks after every micro-batch and divides each loss by the
  accumulation count, which the engine's backward does again; :func:`window_ends` and
  :func:`loss_divisor` tell the exact accumulation (``accumulation.py``) both.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from lightning_kd.models.quantize import is_quantized
from lightning_kd.utils.compat import FSDPStrategyWithWrapHook
from lightning_kd.utils.refusal import Refused

GPU_ONLY = {"fsdp": "FSDPStrategy", "deepspeed": "DeepSpeedStrategy"}


def is_block(module: nn.Module) -> bool:
    """A transformer block: what Hugging Face models checkpoint layer by layer."""
    return isinstance(module, GradientCheckpointingLayer)


ROLE = "distillation_role"
"""Attribute the LightningModule sets on the module whose forward the step calls for each model
(``"teacher"``/``"student"``: their bodies, ``base_model``): how a wrap policy, which sees one
module at a time, finds them."""


def mark_bodies(distiller: nn.Module) -> None:
    """Mark the body of each model the step calls (``base_model``) with its :data:`ROLE`: the
    student's, and every online teacher's, each a wrap unit of its own (an unmarked ``teachers``
    entry left its embedding in the root unit, beside the fp32 student: with a bf16 entry FSDP
    could not wrap the module at all, probe 39)."""
    extra = distiller.extra_teachers
    teachers = [distiller.teacher, *(() if extra is None else extra.models.values())]
    for role, models in (("teacher", teachers), ("student", [distiller.student])):
        for model in models:
            if model is not None:
                setattr(model.base_model, ROLE, role)


def is_wrap_unit(module: nn.Module) -> bool:
    """FSDP wrap units: each block, and the teacher's body (see the module doc)."""
    return is_block(module) or getattr(module, ROLE, None) == "teacher"


def is_trainable_block(module: nn.Module) -> bool:
    """A block with trainable parameters: a student block (teacher blocks are all frozen)."""
    return is_block(module) and any(p.requires_grad for p in module.parameters())


def _lambda_policy(predicate):
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    return functools.partial(lambda_auto_wrap_policy, lambda_fn=predicate)


def ddp(**kwargs: Any):
    """Lightning's DDPStrategy (gloo on CPU, NCCL on GPU) without unused-parameter search."""
    return DDPStrategy(**{"find_unused_parameters": False, **kwargs})


class DistillationFSDPStrategy(FSDPStrategyWithWrapHook):
    """Lightning's FSDPStrategy, told at wrap time which parameters to leave unsharded.

    The models exist only once ``configure_model`` has run, after the strategy was built: this
    asks the module's distiller (``unsharded_parameters()``) just before FSDP wraps it.
    """

    def before_wrap(self, model: nn.Module) -> None:
        """Hand the distiller's ``unsharded_parameters()`` to FSDP as ``ignored_states``."""
        unsharded = getattr(getattr(model, "distiller", None), "unsharded_parameters", None)
        if unsharded is not None and "ignored_states" not in self.kwargs:
            ignored = self.kwargs["ignored_states"] = list(unsharded())
            # FSDP moves only what it manages to its device (``device_id``): the ignored teacher
            # head would stay on the CPU it was loaded on. ``.data`` keeps a tied embedding tied.
            for parameter in ignored:
                parameter.data = parameter.data.to(self.root_device)


def fsdp(activation_checkpointing: bool = False, **kwargs: Any) -> DistillationFSDPStrategy:
    """FSDP with the wrap units and unsharded heads the step needs (see the module doc).

    ``activation_checkpointing=True`` checkpoints the student's blocks by FSDP's policy (use it
    instead of ``student.activation_checkpointing``, not with it).
    """
    options: dict[str, Any] = {
        "auto_wrap_policy": _lambda_policy(is_wrap_unit),
        "state_dict_type": "full",
    }
    if activation_checkpointing:
        options["activation_checkpointing_policy"] = _lambda_policy(is_trainable_block)
    return DistillationFSDPStrategy(**{**options, **kwargs})


def deepspeed(stage: int = 3, **kwargs: Any):
    """Lightning's DeepSpeedStrategy (ZeRO ``stage``) saving no frozen teacher parameters."""
    return DeepSpeedStrategy(**{"stage": stage, "exclude_frozen_parameters": True, **kwargs})


def int8_teachers(distiller: nn.Module, prefix: str = "distiller.") -> list[str]:
    """The state names of every teacher holding int8 weights (the main one's and each
    ``teachers`` entry's), for DDP to leave out: it broadcasts every weight from rank 0 at set-up,
    and torchao's int8 tensors cannot be broadcast. Each rank loads and quantizes the very same
    teacher anyway."""
    models = {"teacher": distiller.teacher}
    if (extra := distiller.extra_teachers) is not None:
        models |= {f"extra_teachers.models.{key}": model for key, model in extra.models.items()}
    return [
        f"{prefix}{role}.{name}"
        for role, model in models.items()
        if model is not None and any(map(is_quantized, model.parameters()))
        for name in model.state_dict()
    ]


def window_ends(trainer) -> bool:
    """Whether this optimizer hook ends an accumulation window.

    A strategy that accumulates itself (DeepSpeed) has Lightning run the optimizer hooks after
    every micro-batch, and its engine steps only at its own boundary; elsewhere Lightning runs
    them once per window.
    """
    if not trainer.strategy.handles_gradient_accumulation:
        return True
    return trainer.model.is_gradient_accumulation_boundary()


def loss_divisor(trainer) -> int:
    """What each micro-batch's loss was divided by before backward: Lightning divides it by
    ``accumulate_grad_batches``, and DeepSpeed's ``engine.backward`` divides it by its
    accumulation steps (the same number, which Lightning sets) once more."""
    accumulate = trainer.accumulate_grad_batches
    return accumulate * accumulate if trainer.strategy.handles_gradient_accumulation else accumulate


def check_accelerator(strategy: str | None, accelerator: str | None) -> None:
    """Refuse a GPU-only strategy without a GPU, naming the alternative."""
    name = (strategy or "").lower()
    kind = next((key for key in GPU_ONLY if key in name), None)
    if kind is None:
        return
    wants_cpu = (accelerator or "auto") == "cpu"
    if wants_cpu or not torch.cuda.is_available():
        raise Refused(
            f"strategy={kind} ({GPU_ONLY[kind]}) needs a CUDA GPU, and this run has "
            f"{'trainer.accelerator=cpu' if wants_cpu else 'none'}; on CPUs use "
            "strategy=ddp (gloo) with trainer.devices=N, or run on a GPU machine"
        )
