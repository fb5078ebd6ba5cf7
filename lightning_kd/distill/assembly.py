"""Building a :class:`~lightning_kd.distill.distiller.Distiller` from specs: loading the models
it holds and choosing the teacher's side of its step (online, cached, another tokenizer's)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.data.token_bytes import byte_lengths
from lightning_kd.distill.cross_tokenizer import CrossTokenizer, teacher_tokenizer_for
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.teachers import ExtraTeachers, TeacherEntry
from lightning_kd.models.loading import StudentSpec, TeacherSpec, load_teacher
from lightning_kd.models.quantize import quantize_teacher
from lightning_kd.models.student import build_student, check_vocabularies, student_tokenizer


def assemble(
    cls: type,
    teacher: TeacherSpec,
    student: StudentSpec,
    distill: DistillConfig,
    tokenizer: PreTrainedTokenizerBase | None = None,
    precision: str | None = None,
    data: Any = None,
    teachers: list[TeacherEntry] | None = None,
):
    """Load the teacher, build the student from it (or from ``student.source``), quantize the
    teacher if ``teacher.quantize`` says so, and check their vocabularies against ``tokenizer``
    (the run's: the student's own where it has one) — or, where ``tokenizer`` is not the
    teacher's, distil across tokenizers (``cross_tokenizer.py``); ``precision`` (a Lightning
    precision) resolves ``teacher.dtype=auto``. ``cls`` is the Distiller class to build.

    With ``distill.teacher_cache`` the teacher is loaded as the cache's writer loaded it (its
    dtype, its quantization), the cache is opened against it, ``tokenizer`` and ``data`` (the
    set-up data module), and the teacher is released: the distiller holds the records instead.
    ``teachers`` (``teachers.py``): every teacher with its weight, ``teacher`` the main entry's.
    """
    if teachers and not distill.chunked:
        raise ValueError("teachers: several teachers need the chunked loss (distill.chunked=true)")
    teacher_tokenizer = teacher_tokenizer_for(teacher, distill, tokenizer)
    if distill.teacher_cache is not None:
        teacher = replace(teacher, dtype=CachedTeacher.stored_dtype(distill.teacher_cache))
    teacher_model = load_teacher(teacher, precision)
    models = build_student(student, teacher_model, teacher.task)
    if teacher.quantize is not None:  # after the student copied full-precision layers
        quantize_teacher(teacher_model, teacher.quantize)
    cross = None
    if teacher_tokenizer is not None:
        cross = CrossTokenizer.for_models(
            tokenizer, teacher_tokenizer, models.student, teacher_model, distill
        )
    elif teacher.task == "causal_lm" and tokenizer is not None:
        check_vocabularies(teacher_model, models.student, tokenizer, student_tokenizer(student))
    extra, main = None, ("teacher", 1.0)
    if teachers:
        extra = ExtraTeachers.load(teachers, distill, tokenizer, models.student, precision)
        main = next((entry.name, entry.weight) for entry in teachers if entry.main)
    distiller = cls(
        teacher_model,
        models.student,
        distill,
        task=teacher.task,
        layer_map=models.layer_map,
        cross=cross,
        token_lengths=None if cross else byte_lengths(tokenizer, models.student),
        extra=extra,
        teacher_weight=main,
    )
    if distill.teacher_cache is not None:
        # The repair's states are checked when it runs: a resume skips it, and its cache may
        # hold none of them (cache.keep_repair_states).
        paths = tuple(sorted({pair.teacher for pair in distiller.layer_pairs}))
        args = (distill, teacher.task, teacher_model, tokenizer, data, paths)
        distiller.replace_teacher(CachedTeacher.for_distiller(*args))
    return distiller


def check_teacher_source(
    teacher: PreTrainedModel | None, cache: CachedTeacher | None, distill: DistillConfig
) -> None:
    """A distiller learns from a teacher model or from a teacher cache, never both or neither."""
    if (teacher is None) == (cache is None):
        raise ValueError("a Distiller takes a teacher model or a teacher cache (one of them)")
    if teacher is None and distill.features:
        raise ValueError(
            "distill.features from a teacher cache: the pairs are resolved on the teacher's "
            "modules; build with Distiller.from_specs (which loads it, then drops it)"
        )
