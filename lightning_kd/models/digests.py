"""Digests that say which teacher, tokenizer or config a record was made with: checkpoints'
provenance and the teacher cache's key compare them. Torch and transformers objects only (no
Lightning), so the plain-PyTorch distiller can use them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container
from typing import Any

import torch
from torch import nn

from lightning_kd.models.quantize import plain

SAMPLES_PER_TENSOR = 4096

VOLATILE_CONFIG_KEYS = (
    "_name_or_path",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "use_cache",
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def weights_digest(model: nn.Module, names: Container[str] | None = None) -> str:
    """A digest of ``model``'s parameter names, shapes and up to 4096 evenly strided values each
    (of the state-dict entries ``names`` only, if given).

    Cheap (milliseconds for a 135M model) and sensitive to any retraining, fine-tune or
    different initialisation; not to an edit of a single unsampled weight. A quantized weight
    (``teacher.quantize``) is sampled as the values it computes with, dequantized.
    """
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if names is not None and name not in names:
                continue
            flat = plain(tensor).detach().reshape(-1)
            stride = max(1, flat.numel() // SAMPLES_PER_TENSOR)
            sample = flat[::stride].to(device="cpu", dtype=torch.float32).contiguous()
            digest.update(f"{name}:{tuple(tensor.shape)}:".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def config_digest(config: Any) -> str:
    """A digest of a Hugging Face config, without the keys that say where or how it was loaded."""
    values = {k: v for k, v in config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS}
    return _sha(json.dumps(values, sort_keys=True, default=str).encode())


def vocab_digest(tokenizer: Any) -> str:
    """A digest of the tokenizer's token → id map."""
    return _sha(json.dumps(sorted(tokenizer.get_vocab().items())).encode())


def chat_template_digest(tokenizer: Any) -> str | None:
    """A digest of the tokenizer's chat template (None: it has none)."""
    template = tokenizer.chat_template
    return _sha(template.encode()) if template else None


def tokenizer_digest(tokenizer: Any) -> str:
    """A digest of everything that decides how ``tokenizer`` splits text: a fast tokenizer's
    whole definition (normalizer, pre-tokenizer, model and merges, added tokens), else its class,
    vocabulary and special tokens. A call's truncation and padding settings, which transformers
    leaves on the backend after a call that asked for them, are not part of it."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
        return _sha(json.dumps(definition, sort_keys=True).encode())
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    return _sha(f"{type(tokenizer).__name__}:{vocab_digest(tokenizer)}:{special}".encode())


def splitting(tokenizer: Any) -> dict | None:
    """What decides how a fast ``tokenizer`` cuts text into its ids: its normalizer, its
    pre-tokenizer and its model (vocabulary and merges); None for a slow one. Its post-processor
    (a BOS it adds) and decoder change no id of a text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    definition = json.loads(backend.to_str())
    return {key: definition.get(key) for key in ("normalizer", "pre_tokenizer", "model")}
