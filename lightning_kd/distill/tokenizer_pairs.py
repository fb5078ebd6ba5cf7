"""Which teachers a run distils across tokenizers: a teacher whose tokenizer is not the student's
(or any, with ``distill.cross_tokenizer=always``), refused here, before any model loads, when the
config asks of it what that path cannot serve (``distill/cross_tokenizer.py`` runs it;
``launch/tokenizer_checks.py`` asks the same before the data is read)."""

from __future__ import annotations

import logging

from transformers import PreTrainedTokenizerBase

from lightning_kd.models.loading import TeacherSpec, load_tokenizer
from lightning_kd.models.student import how_tokenizers_differ, same_tokenizer
from lightning_kd.utils.refusal import Refused

log = logging.getLogger(__name__)

CROSS_REFUSED = (
    "cross-tokenizer distillation (the student's tokenizer is not the teacher's, or "
    "distill.cross_tokenizer=always) cannot serve this config: "
)


def teacher_tokenizer_for(
    teacher: TeacherSpec,
    distill,
    tokenizer: PreTrainedTokenizerBase | None,
    student=None,
    main: bool = True,
) -> PreTrainedTokenizerBase | None:
    """The teacher's tokenizer when the run distils across tokenizers (the run's ``tokenizer``,
    the student's, is not the teacher's, or ``distill.cross_tokenizer=always``), else None;
    what that path cannot serve is refused here, before any model loads (``main=False``: one
    of several teachers, which features, the repair and interleaved sampling do not read)."""
    teacher_tokenizer = crossed_tokenizer(teacher, distill, tokenizer)
    if teacher_tokenizer is None:
        return None
    if refusal := cross_refusal(distill, student, main):
        raise Refused(refusal)
    if same_tokenizer(tokenizer, teacher_tokenizer):  # distill.cross_tokenizer=always, a check
        log.info(
            "tokenizers: the teacher's is the student's (%s, %d ids); "
            "distill.cross_tokenizer=always takes the cross-tokenizer path, "
            "distill.cross_loss=%s (docs/cross-tokenizer.md)",
            tokenizer.name_or_path or type(tokenizer).__name__,
            len(tokenizer),
            distill.cross_loss,
        )
        return teacher_tokenizer
    log.info(  # the run would otherwise say nothing of it until val/aligned is logged
        "tokenizers: the teacher's (%s, %d ids) is not the student's (%s, %d ids; %s): "
        "cross-tokenizer distillation, distill.cross_loss=%s (docs/cross-tokenizer.md)",
        teacher_tokenizer.name_or_path or type(teacher_tokenizer).__name__,
        len(teacher_tokenizer),
        tokenizer.name_or_path or type(tokenizer).__name__,  # a byte tokenizer has no path
        len(tokenizer),
        how_tokenizers_differ(teacher_tokenizer, tokenizer),
        distill.cross_loss,
    )
    return teacher_tokenizer


def crossed_tokenizer(
    teacher: TeacherSpec, distill, tokenizer: PreTrainedTokenizerBase | None
) -> PreTrainedTokenizerBase | None:
    """The teacher's tokenizer where the run distils across tokenizers from it, else None."""
    if teacher.task != "causal_lm" or tokenizer is None:
        return None
    teacher_tokenizer = load_tokenizer(teacher)
    if distill.cross_tokenizer != "always" and same_tokenizer(tokenizer, teacher_tokenizer):
        return None
    return teacher_tokenizer


def cross_refusal(distill, student=None, main: bool = True) -> str | None:
    """Why the cross-tokenizer path cannot serve ``distill`` (None: it can); ``student``'s
    ``source`` is what a repair of a copied student reads instead of the teacher."""
    copied = student is not None and student.source is not None
    errors = distill.cross_errors(repairs_from_source=copied, main=main)
    return CROSS_REFUSED + "; ".join(errors) if errors else None
