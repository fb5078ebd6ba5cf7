"""Cross-tokenizer refusals found before the data is read: a teacher whose tokenizer is not the
student's, asked for what that path cannot serve (``distill.features``, a repair that reads the
teacher, ``distill.chunked=false``, ``distill.on_policy_teacher_top_k``). The run refuses them
when its models are built (``distill/tokenizer_pairs.py``), after the trainer was set up and the
data tokenised; here only the tokenizers load, and only where the config asks any of it."""

from __future__ import annotations

from collections.abc import Mapping

from lightning_kd.distill.tokenizer_pairs import cross_refusal, crossed_tokenizer
from lightning_kd.launch.model_checks import built_specs
from lightning_kd.models.student import run_tokenizer

UNREADABLE = (ValueError, OSError)
"""A tokenizer that does not load: the path checks name it, with the rest."""


def tokenizer_pair_errors(cfg: Mapping) -> list[str]:
    """Why the ``teacher`` group's model, whose tokenizer is not the student's, cannot serve
    what the config asks of it (empty: nothing asked, or the same tokenizer). A ``teachers``
    entry's own model is asked only for the chunked loss, which the teachers' checks refuse
    already (features, the repair and interleaved sampling read the main teacher alone).
    ``cfg``'s model paths are those the path checks pass: ``train_errors`` asks them first, and
    asks this only then (an uncached hub id was looked up again here, retries and all)."""
    specs, errors = built_specs(cfg)
    if errors:  # named by the model checks
        return []
    teacher, student, distill = specs
    # The teacher's tokenizer is the run's unless the student has one of its own.
    own = student.source is not None or student.path is not None
    if not (own or distill.cross_tokenizer == "always"):
        return []
    if (refusal := cross_refusal(distill, student)) is None:
        return []
    try:
        crossed = crossed_tokenizer(teacher, distill, run_tokenizer(teacher, student))
    except UNREADABLE:
        return []
    return [] if crossed is None else [refusal]
