"""The models a run reads, checked before anything loads: a mistyped ``teacher.path``,
``student.path``, ``student.source`` or ``teachers[i].path``, or a packaged model whose packages
are not installed, is refused with the others, each naming its key, rather than as a traceback
from deep inside the set-up (the first tokenizer to load, maybe after another model loaded)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from huggingface_hub import constants, try_to_load_from_cache

from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.models.packaged import PACKAGED, missing_error
from lightning_kd.models.sources import checked_model_path
from lightning_kd.models.unreadable import saved_model_errors


def model_path_errors(cfg: Mapping) -> list[str]:
    """Why a model path of ``cfg`` cannot be read: missing, or a directory without a model."""
    paths = [
        ("teacher", lookup(cfg, "teacher.path"), lookup(cfg, "teacher.gguf_file")),
        ("student", lookup(cfg, "student.path"), None),
    ]
    teachers = lookup(cfg, "teachers")
    for index, entry in enumerate([] if teachers in (None, ABSENT) else teachers):
        if isinstance(entry, Mapping) and entry.get("path") is not None:
            paths.append((f"teachers[{index}]", entry["path"], entry.get("gguf_file")))
    errors = [error for key, path, gguf in paths if (error := path_error(key, path, gguf))]
    source = lookup(cfg, "student.source")  # its other paths are checked where it loads
    if source in PACKAGED and (error := missing_error(source, "student.source")):
        errors.append(error)
    return errors


def path_error(key: str, path: Any, gguf_file: Any = None) -> str | None:
    """Why ``<key>.path`` (and its ``gguf_file``) cannot be read, or None: a packaged model
    whose packages are missing (a student's is none to give), a local path that is not there
    (hub ids, ``org/name``, pass: the hub says)."""
    if path is None or path is ABSENT:
        return None
    if path in PACKAGED:
        if key == "student":
            return STUDENT_PACKAGED.format(path=path)
        return missing_error(path, f"{key}.path")
    if gguf_file is not None and gguf_file is not ABSENT:
        gguf = Path(str(path)).expanduser() / str(gguf_file)
        return None if gguf.is_file() else f"{key}.gguf_file: {gguf} does not exist"
    try:
        local = checked_model_path(str(path), f"{key}.path")
    except FileNotFoundError as error:
        return str(error)
    if not Path(local).is_dir():
        return hub_error(f"{key}.path", local)
    # A teacher reads its own tokenizer (the run's, or the one its ids are aligned from); one
    # without was transformers' traceback advising sentencepiece, after setup began (probe 52).
    # A student without one is read with the run's.
    errors = saved_model_errors(Path(local), f"{key}.path", tokenizer=key != "student")
    return "\n  ".join(errors) or None


def hub_error(key: str, repo: str) -> str | None:
    """Why the Hugging Face id ``repo`` cannot be had here: not in the local cache and the hub
    out of reach (None: cached, or reachable; the hub names a wrong id). Loading it took a
    minute of retries, then refused without naming the key."""
    try:
        if isinstance(try_to_load_from_cache(repo, "config.json"), str):
            return None
    except ValueError:  # not a valid id: the hub's own message names it
        return None
    if constants.HF_HUB_OFFLINE:
        reason = "HF_HUB_OFFLINE is set"
    else:
        host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
        try:
            socket.create_connection((host, 443), timeout=5).close()
            return None
        except OSError as error:
            reason = f"{host} cannot be reached from here ({error})"
    return (
        f"{key}={repo}: a Hugging Face id that is not in the local cache ({constants.HF_HUB_CACHE})"
        f", and {reason}; download it where there is a network (`hf download {repo}`) and give "
        "its directory, or point HF_HOME at a cache that holds it"
    )


STUDENT_PACKAGED = (
    "student.path={path}: a packaged model is no saved student; copy its layers with "
    "student.source={path} (student.num_layers=N, or every layer), or give student.path a saved "
    "model's directory"
)
"""The refusal of ``student.path`` naming a packaged model (a teacher, or a source of layers)."""
