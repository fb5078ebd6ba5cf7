"""``trainer.precision`` choices that would fail, or run other than recorded, after the models load.

- ``16-mixed`` on a CPU: Lightning runs bf16-mixed instead (CPUs have no fp16 autocast), while the
  run records 16-mixed.
- ``16-true``: the student's weights and the optimizer's state in fp16, without loss scaling or
  fp32 master weights. AdamW's ``eps`` (1e-8) is 0 in fp16, so the first update divides by zero
  and writes NaN into the weights (on a GPU as on a CPU); the run stopped at step 2 advising a
  lower learning rate, which cannot help.
- ``bf16-true`` / ``64-true``: Lightning casts the whole module, the frozen teacher included, to
  that dtype once the models are built; a ``teacher.dtype`` of another dtype was cast silently
  while the summary recorded it as set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.models.precision import AUTO, TEACHER_DTYPE_OF

CAST_ALL = {"bf16-true": "bfloat16", "64-true": "float64", "64": "float64"}
"""Precisions whose plugin casts every module of the LightningModule to one dtype."""
MIXED_OF = {"bf16-true": "bf16-mixed", "64-true": "32-true", "64": "32-true"}
"""The precision that keeps a teacher in its own dtype, for each of those."""


def precision_errors(cfg: Mapping) -> list[str]:
    """Why ``cfg``'s ``trainer.precision`` would not run as recorded (empty when it would)."""
    raw = lookup(cfg, "trainer.precision")
    if raw in (None, ABSENT):
        return []
    precision, accelerator = str(raw), lookup(cfg, "trainer.accelerator")
    named = f"trainer.precision={precision}"
    if errors := choice_errors(precision, named):
        return errors
    on_cpu = _on_cpu(accelerator)
    where = f"{named} on a CPU (trainer.accelerator={accelerator})"
    errors = fp16_autocast_errors(precision, on_cpu, where, "trainer.precision=")
    return errors + _fp16_weights_errors(precision) + _cast_teacher_errors(cfg, precision)


def choice_errors(precision: str, named: str) -> list[str]:
    """A precision Lightning does not have (``named``: how it was given, for the message)."""
    if precision in (AUTO, *TEACHER_DTYPE_OF):
        return []
    return [f"{named}: choose one of {', '.join([AUTO, *TEACHER_DTYPE_OF])}"]


def fp16_autocast_errors(precision: str, on_cpu: bool, where: str, setting: str) -> list[str]:
    """fp16 autocast on a CPU (``where``: how it was given, ``setting``: how the fix is given)."""
    if precision not in ("16-mixed", "16") or not on_cpu:
        return []
    return [
        f"{where}: CPUs have no fp16 autocast, so Lightning would run bf16-mixed while the run "
        f"records 16-mixed; use {setting}bf16-mixed (or 32-true)"
    ]


def _fp16_weights_errors(precision: str) -> list[str]:
    if precision != "16-true":
        return []
    return [
        "trainer.precision=16-true keeps the student's weights and the optimizer's state in fp16, "
        "without loss scaling: the optimizer's eps (1e-8) is 0 in fp16 and its first update "
        "writes NaN into the weights; use trainer.precision=16-mixed (a GPU), bf16-mixed or "
        "bf16-true"
    ]


def _cast_teacher_errors(cfg: Mapping, precision: str) -> list[str]:
    """A ``teacher.dtype`` (or a ``teachers`` entry's ``dtype``) that ``precision`` would cast."""
    if (dtype := CAST_ALL.get(precision)) is None:
        return []
    found = teacher_dtypes(cfg)
    return [
        f"{key}={value} with trainer.precision={precision}: Lightning casts every module to "
        f"{dtype}, the teacher too; set {key}={dtype} (or auto), or keep the teacher in "
        f"{value} with trainer.precision={MIXED_OF[precision]}"
        for key, value in found.items()
        if value not in (None, ABSENT, "auto", dtype)
    ]


def teacher_dtypes(cfg: Mapping) -> dict[str, Any]:
    """``teacher.dtype`` and each ``teachers`` entry's ``dtype``, by the key that sets it."""
    entries = lookup(cfg, "teachers")
    entries = entries if isinstance(entries, Sequence) and not isinstance(entries, str) else []
    found = {"teacher.dtype": lookup(cfg, "teacher.dtype")}
    return found | {
        f"teachers[{index}].dtype": entry.get("dtype")
        for index, entry in enumerate(entries)
        if isinstance(entry, Mapping)
    }


def zero3_dtype_errors(cfg: Mapping, strategy: Any) -> list[str]:
    """float64 under DeepSpeed ZeRO-3 (``strategy``: ``trainer.strategy``, a name or a config).
    Its ``zero.Init``, in which the models are built, casts every floating tensor to float32 (or
    bf16 / fp16) and cannot hold float64: the run would record float64 and train float32."""
    if not is_zero3(strategy):
        return []
    found = {"student.dtype": lookup(cfg, "student.dtype"), **teacher_dtypes(cfg)}
    named = [f"{key}=float64" for key, value in found.items() if value == "float64"]
    if str(lookup(cfg, "trainer.precision")) in ("64-true", "64"):
        named.append(f"trainer.precision={lookup(cfg, 'trainer.precision')}")
    return [
        f"{setting} with strategy=deepspeed (ZeRO-3): DeepSpeed holds ZeRO-3 weights in float32, "
        "bfloat16 or float16 only; use float32 there, or keep float64 with strategy=deepspeed_zero2"
        ", strategy=fsdp or strategy=ddp"
        for setting in named
    ]


def is_zero3(strategy: Any) -> bool:
    """Whether ``trainer.strategy`` is DeepSpeed's stage 3: ``strategy=deepspeed``'s config (stage
    3 unless it says otherwise) or a Lightning name (``deepspeed_stage_3``, ``..._offload``)."""
    if isinstance(strategy, Mapping):
        target = str(strategy.get("_target_", ""))
        return "deepspeed" in target and strategy.get("stage", 3) == 3
    return isinstance(strategy, str) and strategy.startswith("deepspeed_stage_3")


def _on_cpu(accelerator: Any) -> bool:
    if accelerator == "cpu":
        return True
    no_gpu = not torch.cuda.is_available() and not torch.backends.mps.is_available()
    return accelerator in ("auto", None, ABSENT) and no_gpu
