"""The models a run reads, checked before anything loads: a mistyped ``teacher.path``,
``student.path`` or ``teachers[i].path`` is refused with the others, each naming its key, rather
than as a traceback from deep inside the set-up (the first tokenizer to load)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.models.sources import PACKAGED, checked_model_path


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
    return [error for key, path, gguf in paths if (error := path_error(key, path, gguf))]


def path_error(key: str, path: Any, gguf_file: Any = None) -> str | None:
    """Why ``<key>.path`` (and its ``gguf_file``) cannot be read, or None. Packaged names and hub
    ids (``org/name``) pass: their own loaders say what is missing."""
    if path is None or path is ABSENT or path in PACKAGED:
        return None
    if gguf_file is not None and gguf_file is not ABSENT:
        gguf = Path(str(path)).expanduser() / str(gguf_file)
        return None if gguf.is_file() else f"{key}.gguf_file: {gguf} does not exist"
    try:
        checked_model_path(str(path), f"{key}.path")
    except FileNotFoundError as error:
        return str(error)
    return None
