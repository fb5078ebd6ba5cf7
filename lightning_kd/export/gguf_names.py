"""The GGUF types written and where a GGUF goes: names alone, without torch or gguf, so that
``lightning-kd export --help`` answers before the heavy modules load."""

from __future__ import annotations

import os
from pathlib import Path

GGUF_KINDS = ("f16", "q8_0")
"""``export.gguf`` values (``gguf.GGUF_TYPES`` says how each is stored)."""


def gguf_path(directory: Path, kind: str) -> Path:
    """Where the GGUF of the saved model in ``directory`` goes: beside it, as
    ``<directory>.<kind>.gguf`` (``RUN_DIR/student.q8_0.gguf``). ``.`` and ``..`` are the
    folders they stand for (``..`` was taken as a name: the file went inside the student)."""
    directory = Path(os.path.abspath(directory))
    return directory.with_name(f"{directory.name}.{kind}.gguf")
