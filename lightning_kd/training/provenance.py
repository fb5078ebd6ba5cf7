"""What a student learns from, recorded in every checkpoint and checked on resume.

Checkpoints leave the teacher out (it comes from ``teacher.path``), so a resume could silently
continue against another teacher. Each checkpoint records the teacher (path, config digest, a
digest of sampled weights, ``init_seed`` for a config-built one), the tokenizer (a digest of its
vocabulary), the distillation objective and, for a LoRA student, a digest of its frozen base
(rebuilt on load too); a resume whose teacher, tokenizer, objective or base differs is refused
with the differences named, or only warned about with ``resume_mismatch=warn``.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_kd.models.digests import vocab_digest

KEY = "provenance"
"""Checkpoint entry holding the record."""
MODES = ("error", "warn")
OBJECTIVE_FIELDS = (
    "divergence",
    "temperature",
    "kd_weight",
    "ce_weight",
    "beta",
    "skew",
    "features",
    "feature_loss",
    "feature_weight",
    "projector",
)
"""The ``DistillConfig`` fields that define what is optimised (not how it is computed)."""


class ProvenanceMismatch(ValueError):
    """A resume whose teacher, tokenizer or objective differs from the checkpoint's."""


def record(module: LightningModule) -> dict[str, Any]:
    """The provenance of ``module``'s training: teacher, tokenizer, objective."""
    spec = module.teacher_spec
    teacher = {
        "path": spec.path,
        "gguf_file": spec.gguf_file,
        "task": spec.task,
        "dtype": spec.dtype,
        "quantize": spec.quantize,
        "init_seed": spec.init_seed if spec.config is not None else None,
        "config": module.teacher_config,
        "weights": module.teacher_digest,
    }
    tokenizer = module.tokenizer
    distill = dataclasses.asdict(module.distill)
    found = {
        "teacher": teacher,
        "tokenizer": {"vocab": vocab_digest(tokenizer) if tokenizer is not None else None},
        "distill": json.loads(json.dumps({k: distill[k] for k in OBJECTIVE_FIELDS}, default=str)),
    }
    if module.student_base_digest is not None:  # LoRA: the base is not in the checkpoint either
        found["student"] = {"base": module.student_base_digest}
    return found


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``part.key: saved → now`` for each recorded value that differs (the teacher's path only
    matters when its weights or config differ too: a moved copy is the same teacher)."""
    found = []
    for part, values in current.items():
        for key, now in values.items():
            then = saved.get(part, {}).get(key)
            if then != now and not (part == "teacher" and key == "path"):
                found.append(f"{part}.{key}: checkpoint {then!r}, this run {now!r}")
    if any(line.startswith("teacher.") for line in found):
        paths = (saved.get("teacher", {}).get("path"), current["teacher"]["path"])
        found.append(f"teacher.path: checkpoint {paths[0]!r}, this run {paths[1]!r}")
    return found


class Provenance(Callback):
    """Writes the record into each checkpoint and checks it when a run resumes."""

    def __init__(self, on_mismatch: str = "error") -> None:
        if on_mismatch not in MODES:
            raise ValueError(f"resume_mismatch={on_mismatch!r}: choose one of {list(MODES)}")
        self.on_mismatch = on_mismatch
        self._record: dict[str, Any] | None = None

    def current(self, module: LightningModule) -> dict[str, Any]:
        if self._record is None:  # the teacher and objective never change within a run
            self._record = record(module)
        return self._record

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        checkpoint[KEY] = self.current(pl_module)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        saved = checkpoint.get(KEY)
        where = trainer.ckpt_path or "the checkpoint"
        if saved is None:
            warnings.warn(
                f"{where} records no teacher, tokenizer or distill config (saved by an older "
                "version): resuming without checking them",
                stacklevel=2,
            )
            return
        found = differences(saved, self.current(pl_module))
        if not found:
            return
        message = (
            f"{where} was trained with a different teacher, tokenizer or objective:\n  "
            + "\n  ".join(found)
        )
        if self.on_mismatch == "warn":
            warnings.warn(message + "\n(resume_mismatch=warn: continuing)", stacklevel=2)
            return
        raise ProvenanceMismatch(
            message + "\nResume with the same settings, start a new run, or pass "
            "resume_mismatch=warn to continue anyway"
        )
