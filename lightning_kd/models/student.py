"""Building the student: the teacher's architecture with fewer layers, copied from the teacher.

The default student keeps the teacher's embeddings, final norm, head and an evenly spaced subset of
its decoder layers (first and last included); ``student.layers`` picks them explicitly,
``student.path`` loads a pretrained student and ``student.config`` initialises one at random.
:func:`check_vocabularies` refuses a student that does not score the teacher tokenizer's ids.
This module knows transformers, not Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

try:  # transformers >= 5
    from transformers.initialization import no_init_weights
except ImportError:  # transformers 4.x
    from transformers.modeling_utils import no_init_weights

from lightning_kd.models.copy_check import check_copied_layers
from lightning_kd.models.digests import splitting
from lightning_kd.models.freezing import freeze_embedding_side, freeze_first_layers
from lightning_kd.models.layer_config import decoder_layers, pruned_config, unfitting_layers_error
from lightning_kd.models.loading import (
    DTYPES,
    StudentSpec,
    TeacherSpec,
    auto_class,
    load_teacher,
    load_tokenizer,
    model_from_config,
)
from lightning_kd.models.lora import apply_lora
from lightning_kd.models.sources import checked_model_path
from lightning_kd.models.unreadable import loaded_whole, readable
from lightning_kd.utils.refusal import Refused


@dataclass
class Models:
    """A built teacher/student pair and how the student's layers map onto the teacher's."""

    teacher: PreTrainedModel
    student: PreTrainedModel
    """The student; a ``PeftModel`` around it with ``student.lora``."""
    layer_map: list[int] | None = field(default=None)
    """``layer_map[j]`` is the teacher layer (``source``'s, with one) that student layer j was
    copied from (None if not)."""
    source: PreTrainedModel | None = None
    """``student.source``'s model, kept for the block-wise repair when asked (else None)."""


def evenly_spaced(count: int, total: int) -> list[int]:
    """``count`` indices spread evenly over ``range(total)``, first and last included."""
    if count == 1:
        return [total - 1]
    return [round(j * (total - 1) / (count - 1)) for j in range(count)]


def student_layer_indices(spec: StudentSpec, teacher_layers: int) -> list[int]:
    """The teacher layers a from-teacher student copies, checked against the teacher's depth."""
    if spec.by_importance:
        raise ValueError(
            "student.layers=importance must be resolved to layer indices from calibration data "
            "before the student is built: lightning-kd train does it; from Python, pass the "
            "indices of lightning_kd.launch.importance.rank_for_student(...).kept as "
            "student.layers"
        )
    if spec.layers is not None:
        bad = [i for i in spec.layers if not 0 <= i < teacher_layers]
        if bad:
            raise ValueError(
                f"student.layers has indices {bad} outside the teacher's 0..{teacher_layers - 1}"
            )
        return list(spec.layers)
    count = spec.num_layers
    if count is None:
        raise ValueError("set student.num_layers, student.layers, student.path or student.config")
    check_num_layers(count, teacher_layers)
    return evenly_spaced(count, teacher_layers)


def check_num_layers(count: int, teacher_layers: int, key: str = "student.num_layers") -> None:
    """Raise unless a student of ``count`` copied layers (the setting ``key``) fits a teacher of
    ``teacher_layers``."""
    if not 1 <= count <= teacher_layers:
        raise ValueError(
            f"{key}={count} is "
            + ("larger than" if count > teacher_layers else "outside")
            + f" the teacher's {teacher_layers} layers; choose 1..{teacher_layers}"
        )


def student_from_teacher(teacher: PreTrainedModel, indices: list[int]) -> PreTrainedModel:
    """A copy of ``teacher`` keeping only layers ``indices`` (in that order), in fp32.

    Embeddings, final norm and head are copied too; with tied embeddings the head stays tied.
    """
    config = pruned_config(teacher.config, indices)  # what hangs on a layer's index, moved
    config.use_cache = True  # the exported student is a normal model; training turns it off
    with no_init_weights():  # every weight is overwritten below: skip the random init
        student = type(teacher)(config).to(torch.float32)
    path, teacher_blocks = decoder_layers(teacher)
    prefix = f"{path}."
    state = {k: v for k, v in teacher.state_dict().items() if not k.startswith(prefix)}
    for j, i in enumerate(indices):
        for key, value in teacher_blocks[i].state_dict().items():
            state[f"{prefix}{j}.{key}"] = value
    try:
        student.load_state_dict(state, strict=True)  # copies: no storage shared with the teacher
    except RuntimeError as error:
        raise unfitting_layers_error(type(teacher).__name__, indices, error, prefix) from error
    student.tie_weights()
    return student


def build_student(
    spec: StudentSpec, teacher: PreTrainedModel, task: str, keep_source: bool = False
) -> Models:
    """The student described by ``spec``, trainable, with activation checkpointing if asked; with
    ``spec.lora`` a ``PeftModel`` whose adapters alone train; ``keep_source``: ``spec.source``'s
    model is returned too (frozen, for the block-wise repair)."""
    layer_map, kept = None, None
    if spec.path is not None:
        location = checked_model_path(spec.path, "student.path")
        with readable(location, "student.path"):
            student = loaded_whole(
                auto_class(task).from_pretrained,
                location,
                "student.path",
                trust_remote_code=spec.trust_remote_code,
                dtype=torch.float32,
            )
    elif spec.config is not None:
        student = model_from_config(
            spec.config, task, teacher.config, "student.config", spec.trust_remote_code
        )
        student.config.use_cache = True  # not the loaded teacher's false: an exported model
    elif spec.source is not None:
        source = load_teacher(TeacherSpec(path=spec.source, dtype="float32", task=task))
        layer_map, student = copied_student(spec, source)
        kept = source if keep_source else None
    else:
        layer_map, student = copied_student(spec, teacher)
    student = student.to(DTYPES[spec.dtype])
    student.requires_grad_(True)
    if spec.frozen_embeddings:
        freeze_embedding_side(student)
    if spec.freeze_layers:
        freeze_first_layers(student, spec.freeze_layers)
    student.train()  # from_pretrained returns eval mode: dropout and checkpointing would stay off
    if spec.activation_checkpointing:
        enable_activation_checkpointing(student)
    if spec.lora is not None:
        student = apply_lora(student, spec.lora_spec)
    return Models(teacher=teacher, student=student, layer_map=layer_map, source=kept)


def copied_student(spec: StudentSpec, source: PreTrainedModel) -> tuple[list[int], PreTrainedModel]:
    """The layers of ``source`` that ``spec`` keeps, and the student copied from them, each
    checked to compute what it computed in ``source``."""
    layer_map = student_layer_indices(spec, source.config.num_hidden_layers)
    student = student_from_teacher(source, layer_map)
    check_copied_layers(source, student, layer_map)
    return layer_map, student


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Hugging Face's non-reentrant activation checkpointing on every decoder/encoder layer.

    transformers 5.x renamed ``gradient_checkpointing_enable`` (deprecated, removed in v6);
    older releases have only the old name.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# ----------------------------------------------------------------------------- vocabulary


def student_tokenizer(spec: StudentSpec) -> PreTrainedTokenizerBase | None:
    """The student's own tokenizer: its ``source``'s, or the one saved with a pretrained
    student if it has one (None: the student reads the teacher's)."""
    if spec.source is not None:
        return load_tokenizer(TeacherSpec(path=spec.source))
    if spec.path is None:
        return None
    try:
        return AutoTokenizer.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError):
        return None  # weights without a tokenizer: check_vocabularies compares sizes only


def run_tokenizer(teacher: TeacherSpec, student: StudentSpec) -> PreTrainedTokenizerBase:
    """The tokenizer the run's data is read with and the student is saved with: the student's
    own where it has one (a ``source``, a pretrained student's), else the teacher's."""
    own = student_tokenizer(student)
    return own if own is not None else load_tokenizer(teacher)


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether two tokenizers map every string to the same ids: the same vocabulary, split the
    same way (:func:`~lightning_kd.models.digests.splitting`). A vocabulary alike under another
    normalizer (a lower-casing one) split the text otherwise, and read the student's ids as its
    own: "Hello World" as ids its own tokenizer gives "hello world" no more."""
    if a is b:
        return True
    if a.get_vocab() != b.get_vocab():
        return False
    mine, theirs = splitting(a), splitting(b)
    return mine is None or theirs is None or mine == theirs  # a slow one: its vocabulary alone


def how_tokenizers_differ(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> str:
    """What :func:`same_tokenizer` found different between ``a`` and ``b``, said where a run
    goes across tokenizers: two of one vocabulary (49,152 ids each) gave no reason (probe 45)."""
    if a.get_vocab() != b.get_vocab():
        return "another vocabulary"
    kinds = f"{type(a).__name__} and {type(b).__name__}"
    return f"the same vocabulary, split otherwise (its normalizer or pre-tokenizer; {kinds})"


def check_vocabularies(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    student_tokenizer: PreTrainedTokenizerBase | None = None,
) -> None:
    """Raise unless both models score the teacher tokenizer's ids in the same vocabulary.

    Sizes may differ by padding rows (logits are then compared over the shared range); a student
    with its own, different tokenizer cannot be distilled on logits.
    """
    if student_tokenizer is not None and student_tokenizer.get_vocab() != tokenizer.get_vocab():
        diff = set(student_tokenizer.get_vocab().items()) ^ set(tokenizer.get_vocab().items())
        example = sorted(diff, key=str)[:3]
        raise Refused(
            "the student's tokenizer differs from the teacher's (e.g. "
            f"{example}); logit distillation needs one shared tokenizer. Use a student of the "
            "teacher's family, or build it from the teacher (student.num_layers=...)"
        )
    needed = len(tokenizer)
    for role, model in (("teacher", teacher), ("student", student)):
        size = model.get_input_embeddings().num_embeddings
        if size < needed:
            raise Refused(
                f"the {role}'s vocabulary has {size} rows but the tokenizer has {needed} tokens: "
                "the two do not belong together"
                + (past_rows(tokenizer, size) or " (different tokenizers)")
            )


def past_rows(tokenizer: PreTrainedTokenizerBase, rows: int) -> str:
    """Which of ``tokenizer``'s tokens have no row, where all are tokens added to it: what
    transformers' GGUF reader does to a byte-level vocabulary without ``<|endoftext|>`` (a
    smoke student's, Llama 3's), so that an exported GGUF read back as a teacher was refused
    as "different tokenizers" with no way on (probe 52)."""
    past = sorted((i, token) for token, i in tokenizer.get_vocab().items() if i >= rows)
    added = set(tokenizer.get_added_vocab())
    if not past or any(token not in added for _, token in past):
        return ""
    names = ", ".join(repr(token) for _, token in past[:5])
    return (
        f"; the tokens past its rows, {names}, were added to the tokenizer (transformers' GGUF "
        "reader adds <|endoftext|> to a byte-level vocabulary without one): for a model read "
        "from a GGUF, give the directory it was exported from instead"
    )
