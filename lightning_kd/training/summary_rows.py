"""The rows of a run's summary table: each validation metric's label and decimals, and the
precision row."""

from __future__ import annotations

ROWS = (
    ("val/ppl", "student perplexity (val)", 2),
    ("val/bpb", "student bits per byte (val)", 4),
    ("val/agreement", "top-1 agreement with teacher", 3),
    ("val/aligned", "student positions aligned with the teacher (val)", 3),
    ("val/kl", "KL(teacher ‖ student) per token", 3),
    ("val/features", "feature loss (val)", 4),
    ("val/embedding_cosine", "embedding cosine to teacher (val)", 4),
)
"""Validation metrics shown before/after: key, label, decimals."""


TEACHER_ROWS = {
    "val/agreement": "top-1 agreement with teachers[{}]",
    "val/kl": "KL(teachers[{}] ‖ student) per token",
    "val/aligned": "student positions aligned with teachers[{}] (val)",
}
"""The rows shown per teacher where a run has several (``val/<key>/<name>``)."""

CACHED = {
    "val/kl": "KL(teacher ‖ student) per token, over the cache's top k and the rest in one "
    "(a lower bound)",
}
"""Labels of a run trained from a teacher cache: its KL is the bucketed one (``docs/cache.md``),
which read 0.006 under the online KL's label where the online KL was 0.514 (a flat teacher
whose top 256 held 6 % of its mass; probe 45)."""


CACHED_TEACHER_KL = (
    "KL(teachers[{}] ‖ student) per token, over its cache's top k and the rest in one "
    "(a lower bound)"
)
"""A cached teacher's row among several: its KL is the bucketed one too (it read 0.001 under
the online KL's label where the online KL was 0.008; probe 55)."""


def teacher_rows(after: dict[str, float], cached: set[str] = frozenset()) -> list:
    """One row per teacher of each :data:`TEACHER_ROWS` metric logged for several teachers,
    labelled with its name (the unsuffixed metric is the main teacher's alone); the KL of a
    teacher trained from its cache (``cached``: names) labelled as the bound it is."""
    rows = []
    for base in TEACHER_ROWS:
        for key in after:
            if key.startswith(base + "/"):
                name = key.removeprefix(base + "/")
                bound = base == "val/kl" and name in cached
                label = CACHED_TEACHER_KL if bound else TEACHER_ROWS[base]
                rows.append((key, label.format(name), 3))
    return rows


def per_teacher(key: str, after: dict[str, float]) -> bool:
    """Whether ``key`` is a :data:`TEACHER_ROWS` metric shown per teacher instead."""
    return key in TEACHER_ROWS and any(name.startswith(key + "/") for name in after)


def worse_than_before(before: dict[str, float], after: dict[str, float]) -> str | None:
    """What says the student ended worse on the validation split than it started: its
    perplexity (else its bits per byte) higher after training than before. A diverged run
    (``optimizer.lr=50``: 241 → 321,939) ended with exit 0 and nothing said (probe 47)."""
    key = next((key for key in ("val/ppl", "val/bpb") if key in before and key in after), None)
    if key is None or not after[key] > before[key]:
        return None
    return (
        f"{key} rose over the run, {before[key]:.4g} → {after[key]:.4g}: the student ends worse "
        "than it started (diverged? a lower optimizer.lr, or gradient clipping, may help)"
    )


def precision_text(held: dict[str, str]) -> str:
    """The precision row of ``held`` (``RunSummary.precision``): the trainer's precision, a
    student's dtype of its own, the teacher's dtype, and the teachers held otherwise."""
    parts = [held["trainer.precision"], f"teacher {held['teacher.dtype']}"]
    if held.get("student.dtype"):
        parts.insert(1, f"student {held['student.dtype']}")
    if held.get("quantize"):
        parts.append(f"{held['quantize']} weights")
    parts += [  # a teachers entry held otherwise: dtype[<name>], quantize[<name>]
        f"teachers{key.removeprefix('dtype')} {value}"
        if key.startswith("dtype[")
        else f"teachers{key.removeprefix('quantize')} {value} weights"
        for key, value in held.items()
        if key.startswith(("quantize[", "dtype["))
    ]
    return ", ".join(parts)
