"""A model name that is both a packaged model's and a path here (``smollm2``, with a folder
``smollm2/`` in the working directory): which one a command reads must not be a guess."""

from __future__ import annotations

from pathlib import Path

from lightning_kd.models.packaged import PACKAGED


def shadowing_error(name: str, key: str) -> str | None:
    """Why ``name`` (given as ``key``) is ambiguous, or None: it names a packaged model and a
    file or folder here too. ``evaluate`` read the packaged model and ``export`` the folder, each
    without a word; ``./name`` names the folder, and the packaged name alone elsewhere. (A
    config's ``teacher.path=smollm2`` is the packaged model: the teacher group sets it.)"""
    if name not in PACKAGED or not Path(name).exists():
        return None
    kind = "folder" if Path(name).is_dir() else "file"
    return (
        f"{key}={name} names both the packaged model {name!r} and the {kind} ./{name} here: "
        f"write ./{name} for the {kind}, or run from another directory for the packaged model"
    )
