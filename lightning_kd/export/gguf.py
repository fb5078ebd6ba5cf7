"""A Llama-family student as one GGUF file llama.cpp loads, in f16 or q8_0 (``export.gguf``).

It follows llama.cpp's own converter (``convert_hf_to_gguf.py``, class ``LlamaModel``): tensor
names from gguf-py's ``TensorNameMap``, the query and key rows permuted into the rotary layout
llama.cpp's kernels expect (transformers' GGUF loader permutes them back), the ``llama.*``
hyperparameters, the vocabulary of ``gguf_vocab.py``, and the same storage rule: every 1-D tensor
and every norm in f32, the rest in the chosen type (a q8_0 tensor whose rows are not whole
32-value blocks in f16, as llama.cpp falls back). Tied embeddings are written once, as
``token_embd``; there is no ``output.weight`` then.

Other architectures are refused by name before anything is written (:func:`gguf_architecture_errors`
reads a config alone, so a run refuses before it trains), and the file appears whole or not at
all: it is written under a temporary name beside its target and renamed when complete.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import (
    GGML_QUANT_SIZES,
    GGML_QUANT_VERSION,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    GGMLQuantizationType,
    GGUFReader,
    LlamaFileType,
    get_tensor_name_map,
    quants,
)
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from lightning_kd.export.gguf_names import GGUF_KINDS, gguf_path
from lightning_kd.export.gguf_vocab import GGUFFile, add_vocabulary, gguf_vocabulary
from lightning_kd.models.unreadable import loaded_whole, own_code_type, readable
from lightning_kd.utils.atomic import replaced_whole
from lightning_kd.utils.disk import disk_errors
from lightning_kd.utils.refusal import Refused, refuse

GGUF_TYPES = dict(
    zip(
        GGUF_KINDS,
        [
            (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
            (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
        ],
        strict=True,
    )
)
"""Each of ``GGUF_KINDS``: how the weight matrices are stored, and the file type recorded."""
ARCHITECTURES = ("llama",)
"""``model_type`` values written (SmolLM2, the default teacher, is one)."""
FIX = (
    "keep the Hugging Face export (the save_pretrained directory, a run's student/), or convert "
    "it with llama.cpp's convert_hf_to_gguf.py"
)
AGAIN = "export again"
"""What follows a full disk, by default."""
SKIPPED = ("rotary_emb.inv_freq",)
"""State-dict entries with no tensor in a GGUF (llama.cpp computes them)."""


def type_errors(kind: object, key: str = "export.gguf") -> list[str]:
    """The message refusing ``key``'s ``kind`` when it is not a GGUF type written here."""
    if isinstance(kind, str) and kind in GGUF_TYPES:
        return []
    return [f"{key}={kind!r}: choose one of {', '.join(GGUF_TYPES)} (or null: no GGUF)"]


def gguf_architecture_errors(config: PretrainedConfig) -> list[str]:
    """One message for each part of ``config`` a Llama GGUF cannot express (none: writable)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        return [
            f"the student is a {model_type} model (model_type={model_type!r}): the GGUF export "
            f"writes {', '.join(ARCHITECTURES)} models only (SmolLM2's architecture); {FIX}"
        ]
    found = {
        "rope type": rope(config)[1],
        "attention_bias": bool(getattr(config, "attention_bias", False)),
        "mlp_bias": bool(getattr(config, "mlp_bias", False)),
        "hidden_act": getattr(config, "hidden_act", "silu"),
    }
    expected = {"rope type": "default", "attention_bias": False, "mlp_bias": False}
    expected["hidden_act"] = "silu"
    return [
        f"the student's {key} is {found[key]!r}, which the Llama GGUF export does not write "
        f"(it writes {expected[key]!r}); {FIX}"
        for key in expected
        if found[key] != expected[key]
    ]


def rope(config: PretrainedConfig) -> tuple[float, str]:
    """The rotary base and kind of ``config`` (transformers 5's ``rope_parameters``, or 4's
    ``rope_theta`` and ``rope_scaling``)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    # A scaling given through student.config leaves rope_parameters without its base (and the
    # attribute None): transformers' default base, not float(None).
    theta = parameters.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
    kind = parameters.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    return float(theta), kind or "default"


EXPORTED_BY = "lightning_kd.version"
"""The GGUF key an export writes (the package's version): how a later export into the same path
tells a file it may replace (its own earlier export) from one it must not (a model of yours)."""


def exported_here(path: Path) -> bool:
    """Whether ``path`` is a GGUF that lightning-kd exported (it holds :data:`EXPORTED_BY`)."""
    try:
        return EXPORTED_BY in GGUFReader(path).fields
    except Exception:  # not a GGUF, or not one gguf reads: not an export of ours
        return False


def write_gguf(
    model, tokenizer, path: Path, kind: str, name: str | None = None, then: str = AGAIN
) -> Path:
    """Write ``model`` (a Llama ``PreTrainedModel``) and ``tokenizer`` to ``path`` as a GGUF of
    ``kind`` (``f16`` or ``q8_0``), named ``name`` inside; returns ``path``. Whatever cannot be
    written is refused before the file is begun; a full disk is named with ``then``, the step
    after freeing space."""
    refuse(type_errors(kind) + gguf_architecture_errors(model.config))
    vocabulary = gguf_vocabulary(tokenizer, model.config.vocab_size, model.config)
    tensors = list(gguf_tensors(model, GGUF_TYPES[kind][0]))
    with replaced_whole(path) as temp, disk_errors(path, then):
        writer = GGUFFile(temp, MODEL_ARCH_NAMES[MODEL_ARCH.LLAMA])
        try:
            writer.add_name(name or path.name.split(".")[0])
            writer.add_string(EXPORTED_BY, version("lightning-kd"))  # what a rerun may replace
            add_hyperparameters(writer, model.config, GGUF_TYPES[kind][1])
            add_vocabulary(writer, vocabulary)
            for tensor_name, data, stored in tensors:
                writer.add_tensor(tensor_name, data, raw_dtype=stored)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.flush()
            for handle in writer.fout or ():
                os.fsync(handle.fileno())
        finally:
            writer.close()
    return path


def add_hyperparameters(writer: GGUFFile, config: PretrainedConfig, file_type: int) -> None:
    """The ``llama.*`` keys llama.cpp builds the model from, and the file type."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_type("model")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_rope_freq_base(rope(config)[0])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    if head_dim * heads != config.hidden_size:  # llama.cpp's default is hidden_size / heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(file_type)
    writer.add_quantization_version(GGML_QUANT_VERSION)


F16_LARGEST = {GGMLQuantizationType.F16: 65504.0, GGMLQuantizationType.Q8_0: 65504.0 * 127}
"""The largest magnitude each stored type keeps finite (q8_0: its f16 scale times 127)."""


def gguf_tensors(model, wanted: GGMLQuantizationType):
    """``(GGUF name, data, stored type)`` of each of ``model``'s tensors, in state-dict order;
    a tensor the name map does not know is refused by name."""
    config = model.config
    names = get_tensor_name_map(MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    unknown, too_large, nonfinite = [], [], []
    for key, tensor in model.state_dict().items():
        if key.endswith(SKIPPED) or (tied and key == "lm_head.weight"):
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            unknown.append(key)
            continue
        data = rotary_rows(name, tensor.detach().to(torch.float32).cpu().numpy(), config)
        stored = storage(name, data, wanted)
        largest = float(np.abs(data).max()) if data.size else 0.0
        finite = bool(np.isfinite(data).all())  # "largest > limit" is False for NaN (probe 59)
        if not finite:
            nonfinite.append(key)
        elif largest > F16_LARGEST.get(stored, np.inf):
            too_large.append(f"{key} ({largest:.3g})")
        with np.errstate(invalid="warn" if finite else "ignore"):  # refused below, by name
            quantized = quants.quantize(data, stored)
        yield name, quantized, stored
    if unknown:
        refuse([f"export.gguf: the student has tensors a Llama GGUF has no name for: {unknown}"])
    if nonfinite:  # a file of NaN logits, written as fine
        refuse(
            [
                f"export.gguf: the student's weights {nonfinite} hold NaN or infinity: its "
                "training diverged, or its file is damaged; export an earlier checkpoint or an "
                "intact copy"
            ]
        )
    if too_large:  # f16 turns them into inf: a file whose every logit is NaN, written as fine
        refuse(
            [
                f"export.gguf: the student's weights {too_large} exceed what {wanted.name} "
                "holds (f16: 65504; q8_0 keeps each block's scale in f16); its training "
                "diverged there: export an earlier checkpoint, or keep the safetensors student"
            ]
        )


def rotary_rows(name: str, data: np.ndarray, config: PretrainedConfig) -> np.ndarray:
    """``data`` with a query or key projection's rows in llama.cpp's rotary order: within each
    head, transformers rotates the first half against the second, llama.cpp adjacent pairs."""
    if not name.endswith(("attn_q.weight", "attn_k.weight")):
        return data
    heads = config.num_attention_heads
    if name.endswith("attn_k.weight"):
        heads = getattr(config, "num_key_value_heads", None) or heads
    rows = data.reshape(heads, 2, data.shape[0] // heads // 2, *data.shape[1:])
    return rows.swapaxes(1, 2).reshape(data.shape)


def storage(name: str, data: np.ndarray, wanted: GGMLQuantizationType) -> GGMLQuantizationType:
    """How llama.cpp's converter stores ``name``: 1-D tensors and norms in f32; a q8_0 tensor
    whose rows do not split into 32-value blocks in f16; the rest as ``wanted``."""
    if data.ndim <= 1 or name.endswith("_norm.weight"):
        return GGMLQuantizationType.F32
    block = GGML_QUANT_SIZES[wanted][0]
    return GGMLQuantizationType.F16 if data.shape[-1] % block else wanted


def saved_errors(directory: Path) -> list[str]:
    """Why the model saved in ``directory`` cannot be written as a GGUF, from its config and
    tokenizer alone (no weights): its architecture, or a tokenizer GGUF cannot express, or why
    its config cannot be read (not JSON, no ``model_type``)."""
    if (own := own_code_type(directory)) is not None:  # transformers asked [y/N] (probe 45)
        return gguf_architecture_errors(PretrainedConfig(model_type=own))
    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
    except (OSError, ValueError) as error:
        reason = next(iter(str(error).strip().splitlines()), type(error).__name__)[:200]
        return [
            f"{directory / 'config.json'} is no model config transformers can read ({reason}): "
            "save the model again (model.save_pretrained(path))"
        ]
    return writable_errors(config, lambda: AutoTokenizer.from_pretrained(directory))


def writable_errors(config: PretrainedConfig, tokenizer: Callable[[], Any]) -> list[str]:
    """Why a model of ``config`` cannot be written as a GGUF: its architecture's parts, else
    what its tokenizer (``tokenizer()``, loaded only for a writable architecture) holds that a
    GGUF vocabulary cannot express."""
    if errors := gguf_architecture_errors(config):
        return errors
    try:
        gguf_vocabulary(tokenizer(), config.vocab_size, config)
    except Refused as refused:
        return [str(refused)]
    return []


def export_saved(directory: Path, kind: str, path: Path | None = None, then: str = AGAIN) -> Path:
    """The GGUF of the ``save_pretrained`` directory ``directory`` (model and tokenizer), at
    ``path`` or :func:`gguf_path`; its architecture and tokenizer are checked before the
    weights load."""
    directory = Path(directory)
    refuse(type_errors(kind) + saved_errors(directory))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    with readable(directory, str(directory)):
        model = loaded_whole(
            AutoModelForCausalLM.from_pretrained, directory, str(directory), dtype=torch.float32
        )
    target = gguf_path(directory, kind) if path is None else Path(path)
    return write_gguf(model, tokenizer, target, kind, directory.name, then)
