"""Building a :class:`~lightning_kd.distill.distiller.Distiller` from specs: loading the models
it holds and choosing the teacher's side of its step (online, cached, another tokenizer's)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.data.chat_tokens import turn_end_id
from lightning_kd.data.token_bytes import byte_lengths
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.on_policy import scorer_limits
from lightning_kd.distill.spelled_share import judge_first_blocks
from lightning_kd.distill.teacher_domains import ON_POLICY_DOMAINS, DomainTeaching
from lightning_kd.distill.teacher_entries import TeacherEntry, given_entries
from lightning_kd.distill.teachers import ExtraTeachers
from lightning_kd.distill.tokenizer_pairs import teacher_tokenizer_for
from lightning_kd.generation.decoding import stop_and_pad, text_stop
from lightning_kd.models.loading import StudentSpec, TeacherSpec, load_teacher
from lightning_kd.models.quantize import quantize_teacher
from lightning_kd.models.student import build_student, check_vocabularies, student_tokenizer
from lightning_kd.utils.refusal import Refused


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
    ``teachers`` (``teachers.py``): every teacher with its weight, ``teacher`` the main entry's
    (a ``teachers`` list as the config holds it, or :func:`teacher_entries` of it).
    """
    teachers = given_entries(teachers, teacher, distill.chunked)
    teacher_tokenizer = teacher_tokenizer_for(teacher, distill, tokenizer, student)
    teacher_model, models, keep_source = load_models(teacher, student, distill, precision)
    sides = TeacherSides(teacher, student, distill, tokenizer, teacher_tokenizer)
    entry = next((e for e in teachers or () if e.main), None)
    cross = sides.cross(teacher_model, models.student, data, entry)
    main = (entry.name, entry.weight) if entry else ("teacher", 1.0)
    distiller = cls(
        teacher_model,
        models.student,
        distill,
        task=teacher.task,
        layer_map=models.layer_map if student.copies_teacher or keep_source else None,
        cross=cross,
        token_lengths=None if cross else byte_lengths(tokenizer, models.student),
        teacher_weight=main,
        repair_source=models.source,
    )
    stop_at_turn_ends(distiller, tokenizer)
    if distill.teacher_cache is not None:
        open_cache(distiller, teacher.task, teacher_model, tokenizer, data)
    # Held by the distiller now, or released for its cache before another teacher loads.
    del teacher_model
    models.teacher = None
    if teachers:  # after the main teacher's release: cached teachers are never resident at once
        extra = ExtraTeachers.load(teachers, distill, tokenizer, models.student, precision, data)
        attach_teachers(distiller, extra, teacher_domains(teachers, distill, data))
    return distiller


def stop_at_turn_ends(distiller, tokenizer: PreTrainedTokenizerBase | None) -> None:
    """End ``distiller``'s on-policy completions at the run's chat template's end of turn too:
    the student's own config names only its EOS ids (``decoding.stop_and_pad``). A template
    that ends an answer with no special token ends it in text (``plain``'s next ``User:``)."""
    if (sampler := distiller.on_policy) is None or tokenizer is None:
        return
    stops, _ = stop_and_pad(distiller.student, "distill.on_policy", tokenizer)
    ends = text_stop(tokenizer)  # plain's "User:", a marker read as text
    distiller.on_policy = replace(sampler, stop_ids=stops, text_stop=ends)
    # turn_end_id renders the template: asked only where no end was found in text either
    if ends is None and tokenizer.chat_template is not None and turn_end_id(tokenizer) is None:
        warnings.warn(NO_TURN_END.format(stops, sampler.max_new_tokens), stacklevel=2)


NO_TURN_END = (
    "distill.on_policy: the chat template closes an answer with neither a special token of the "
    "tokenizer nor text that shows where it ended (whitespace alone, and no next turn), so the "
    "student's completions end only at its EOS ids {} or after distill.on_policy_tokens={}, and "
    "may run on into turns of their own; a template whose end of turn is a special token (or a "
    "marker, as plain's next 'User:') ends them there"
)
"""Said where on-policy completions cannot stop at the end of their turn."""


def attach_teachers(distiller, extra: ExtraTeachers, domains: DomainTeaching) -> None:
    """Give ``distiller`` its other teachers and who teaches which rows; they score its
    on-policy completions too, so the sampler's room is theirs as well."""
    distiller.extra_teachers, distiller.domains = extra, domains
    if (sampler := distiller.on_policy) is not None:
        distiller.on_policy = replace(sampler, scorer_limits=scorer_limits(extra))


def teacher_domains(teachers: list[TeacherEntry], distill: DistillConfig, data) -> DomainTeaching:
    """Which teacher teaches which data domain's rows (``teacher_domains.py``), the weights known
    from the set-up ``data``; without it (a model loaded from its checkpoint, for inference or
    before its trainer's data is set up) a training step asks for them."""
    found = DomainTeaching(tuple(teachers))
    if found.named and distill.on_policy:
        raise Refused(ON_POLICY_DOMAINS)
    if data is not None:
        found.know_data(data)
    return found


def open_cache(distiller, task: str, teacher_model, tokenizer, data) -> None:
    """Replace ``distiller``'s teacher by the cache ``distill.teacher_cache`` names, opened
    against ``teacher_model``, ``tokenizer`` and the set-up ``data``."""
    # The repair's states are checked when it runs: a resume skips it, and its cache may hold
    # none of them (cache.keep_repair_states).
    paths = tuple(sorted({pair.teacher for pair in distiller.layer_pairs}))
    args = (distiller.distill, task, teacher_model, tokenizer, data, paths, distiller.cross)
    distiller.replace_teacher(CachedTeacher.for_distiller(*args))


def load_models(teacher: TeacherSpec, student: StudentSpec, distill, precision):
    """The teacher (as its cache's writer loaded it, with one) and the student built from it or
    ``student.source`` (whose model is kept for a block-wise repair), the teacher quantized
    after the student copied full-precision layers; and whether the source was kept."""
    if distill.teacher_cache is not None:
        teacher = replace(teacher, dtype=CachedTeacher.stored_dtype(distill.teacher_cache))
    teacher_model = load_teacher(teacher, precision)
    keep_source = student.source is not None and distill.blockwise_passes > 0
    models = build_student(student, teacher_model, teacher.task, keep_source)
    if teacher.quantize is not None:
        quantize_teacher(teacher_model, teacher.quantize)
    return teacher_model, models, keep_source


@dataclass
class TeacherSides:
    """What :func:`assemble` knows when it chooses the step's teacher sides."""

    teacher: TeacherSpec
    student: StudentSpec
    distill: DistillConfig
    tokenizer: PreTrainedTokenizerBase | None
    teacher_tokenizer: PreTrainedTokenizerBase | None

    def cross(self, teacher_model, student_model, data=None, entry=None) -> CrossTokenizer | None:
        """The cross-tokenizer path where the tokenizers differ, judged on the first training
        blocks of ``data`` (of the main ``entry``'s domains) before its cache opens or step 0
        (else their vocabularies are checked against each other)."""
        if self.teacher_tokenizer is not None:
            cross = CrossTokenizer.for_models(
                self.tokenizer, self.teacher_tokenizer, student_model, teacher_model, self.distill
            )
            if data is not None:
                judge_first_blocks(cross, data, *((entry.domains, entry.name) if entry else ()))
            return cross
        if self.teacher.task == "causal_lm" and self.tokenizer is not None:
            own = student_tokenizer(self.student)
            check_vocabularies(teacher_model, student_model, self.tokenizer, own)
        return None


def check_teacher_source(
    teacher: PreTrainedModel | None,
    cache: CachedTeacher | None,
    distill: DistillConfig,
    student: nn.Module,
    cross: Any = None,
) -> None:
    """A distiller learns from a teacher model or from a teacher cache, never both or neither,
    into a student with weights of its own, of the teacher's vocabulary (``cross``: another's)."""
    if (teacher is None) == (cache is None):
        raise ValueError("a Distiller takes a teacher model or a teacher cache (one of them)")
    check_own_weights(teacher, student)
    if cross is None:
        check_vocabulary_rows(teacher, student)
    if teacher is None and distill.features:
        raise ValueError(
            "distill.features from a teacher cache: the pairs are resolved on the teacher's "
            "modules; build with Distiller.from_specs (which loads it, then drops it)"
        )


PADDING_ROWS = 256
"""Rows by which two models of one tokenizer may differ: their vocabularies padded to another
multiple (Qwen2.5-7B's 152,064 rows, 0.5B's 151,936)."""


def check_vocabulary_rows(teacher: nn.Module | None, student: nn.Module) -> None:
    """Refuse a teacher and a student whose output heads are not one tokenizer's: built by hand,
    a GPT-2 teacher (50,257 rows) and a Llama student (32,000) were distilled over the rows they
    share, without a word (probe 51). Padding rows apart (:data:`PADDING_ROWS`, and 1 %)."""
    heads = [getattr(m, "get_output_embeddings", lambda: None)() for m in (teacher, student)]
    if teacher is None or any(getattr(head, "weight", None) is None for head in heads):
        return  # a cache's records are checked against the run's; an encoder has no head
    rows = [head.weight.shape[0] for head in heads]
    if abs(rows[0] - rows[1]) > max(PADDING_ROWS, 0.01 * max(rows)):
        raise ValueError(
            f"the teacher's head has {rows[0]} rows and the student's {rows[1]}: they are not "
            "one tokenizer's vocabulary, whose logits the loss compares token by token; give a "
            "student of the teacher's tokenizer, or distil across tokenizers "
            "(Distiller.from_specs with distill.cross_tokenizer: docs/cross-tokenizer.md)"
        )


def id_rows(teacher: nn.Module | None, cross: Any) -> int | None:
    """The embedding rows of a ``teacher`` that reads the batch's own ids (online, of the
    student's tokenizer; ``cross``: another's), which bound them as the student's do: an id
    past a smaller teacher's rows was its embedding's bare ``IndexError`` (probe 51)."""
    embedding = None if teacher is None or cross is not None else teacher.get_input_embeddings()
    return getattr(embedding, "num_embeddings", None)


def check_own_weights(teacher: nn.Module | None, student: nn.Module) -> None:
    """Refuse a student holding any of the teacher's parameters (the teacher itself, or layers
    taken from it rather than copied): the teacher is frozen, so they would silently not learn,
    and a LoRA student over the teacher's own model would change the teacher with it."""
    if teacher is None:
        return
    teachers = {id(p) for p in teacher.parameters()}
    shared = [name for name, p in student.named_parameters() if id(p) in teachers]
    if not shared:
        return
    whole = len(shared) == sum(1 for _ in student.parameters())
    what = "is the teacher: it holds" if whole else "shares"  # "is the teacher 21 of" read wrong
    raise ValueError(
        f"the student {what} {len(shared)} of the teacher's parameter tensors ({shared[0]}"
        f"{', ...' if len(shared) > 1 else ''}): the teacher is frozen, so they would not learn. "
        "Give the student weights of its own: copy.deepcopy the teacher's layers you keep, or "
        "build it with Distiller.from_specs / StudentSpec(num_layers=...) (a student copied "
        "from the teacher's layers)"
    )


def learning(
    parameters: Iterable[nn.Parameter], *frozen: nn.Module | None
) -> Iterator[nn.Parameter]:
    """``parameters`` that require a gradient, none of the ``frozen`` models' (the teacher's,
    whatever ``requires_grad`` a caller set on them again)."""
    held = {id(p) for model in frozen if model is not None for p in model.parameters()}
    return (p for p in parameters if p.requires_grad and id(p) not in held)
