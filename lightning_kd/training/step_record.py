"""How a run's steps are computed and clipped: recorded in each checkpoint, compared on resume.

Gradient clipping changes every update from the resumed step on, as the objective does: another
``trainer.gradient_clip_val`` or ``gradient_clip_algorithm`` is a difference the resume names
(refused, or continued with ``resume_mismatch=warn``).

The precision of the student's master weights decides what the checkpoint's weights become: a
``student.dtype`` that cannot hold every value of the checkpoint's (float32 resumed as bfloat16)
rounds the weights and the optimizer's moments as they load, so it is a difference too. A wider
one (bfloat16 resumed as float32) loses nothing, and ``trainer.precision`` and
``student.activation_checkpointing`` change how a step is computed, not what it optimises; a
run on another machine may need another. Those are said in one line when the run resumes, so a
change in the loss curve at the resumed step has its cause on record.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer

CLIPPING = "trainer"
"""Part of the provenance record compared like the objective (``trainer.gradient_clip_val``)."""
COMPUTE = "compute"
"""Part of the provenance record said on resume; only a narrowing ``student.dtype`` refused."""
HOLDS = {
    "float64": {"float64", "float32", "bfloat16", "float16"},
    "float32": {"float32", "bfloat16", "float16"},
    "bfloat16": {"bfloat16"},
    "float16": {"float16"},
}
"""``dtype: the dtypes whose every value it holds``."""
NAMES = {
    "precision": "trainer.precision",
    "student_dtype": "student.dtype",
    "activation_checkpointing": "student.activation_checkpointing",
}
"""The config key each ``compute`` entry comes from."""


def step_record(module: LightningModule, trainer: Trainer) -> dict[str, Any]:
    """The clipping and computation of the steps ``trainer`` runs for ``module``."""
    algorithm = trainer.gradient_clip_algorithm
    student = module.student_spec
    return {
        CLIPPING: {
            "gradient_clip_val": trainer.gradient_clip_val,
            # Lightning takes None for "norm": one setting, not two
            "gradient_clip_algorithm": str(getattr(algorithm, "value", algorithm) or "norm"),
        },
        COMPUTE: {
            "precision": str(trainer.precision),
            "student_dtype": student.dtype,
            "activation_checkpointing": bool(student.activation_checkpointing),
        },
    }


def compute_changes(saved: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(lossy, said)``: a ``student.dtype`` that rounds the checkpoint's weights, and the
    other changed computations, each as ``key: checkpoint X, this run Y``. A checkpoint saved
    before this record (no ``compute`` part, or a key it lacks) is not compared."""
    then, now = saved.get(COMPUTE, {}), current.get(COMPUTE, {})
    lossy, said = [], []
    for key, value in now.items():
        if key not in then or then[key] == value:
            continue
        line = f"{NAMES[key]}: checkpoint {then[key]!r}, this run {value!r}"
        narrows = key == "student_dtype" and then[key] not in HOLDS.get(value, {value})
        (lossy if narrows else said).append(line)
    return lossy, said


def lossy_message(lines: list[str]) -> str:
    """The refusal's paragraph for a narrowing ``student.dtype``."""
    return (
        "the student's master weights would be rounded as they load (and the optimizer's "
        "moments with them):\n  " + "\n  ".join(lines) + "\nResume with the checkpoint's "
        "student.dtype (use trainer.precision for mixed precision), or pass resume_mismatch=warn "
        "to round them on purpose"
    )


def said_line(lines: list[str], where: str) -> str:
    """The line a resume prints for the computations it changes."""
    return f"resuming from {where}, steps computed otherwise from here on: " + "; ".join(lines)
