"""Whether a checkpoint file is whole and intact, and reading one safely.

A crash or a full disk leaves a file cut short (no zip directory at its end); bit rot, a bad copy
or a partial overwrite in place leaves one whose directory reads but whose bytes changed inside a
tensor. ``torch.load`` checks neither the CRC-32 each zip member records nor, with
``weights_only=True``, tells a damaged pickle from a foreign one. Both are checked here, once per
version of the file, before anything loads: a damaged tensor resumed silently (zeros in a
weight), or stopped a step later on a NaN.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from lightning_kd.utils.files import file_identity
from lightning_kd.utils.refusal import Refused

REPAIR_NAME = "repair.pt"
"""Beside ``last.ckpt``: a stopped block-wise repair's progress, until the first checkpoint."""


def afresh(path: Path) -> str:
    """The way on from a damaged ``path``: an earlier checkpoint, or a fresh start, by the
    settings that give them (a damaged ``repair.pt`` has no earlier copy: it was told to resume
    from one, and given no command; probe 59)."""
    if path.name == REPAIR_NAME:
        return "the repair's progress has no earlier copy: start the run afresh (overwrite=true)"
    return "resume from an earlier checkpoint (ckpt_path=PATH) or start afresh (overwrite=true)"


_INTACT: set[tuple] = set()
"""The :func:`file_identity` of each file whose members' CRCs were checked in this process."""


class CheckpointError(Refused):
    """A checkpoint path that is refused, missing, or a file that is not a whole checkpoint."""


def check_whole(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is a complete torch zip archive whose
    members match their recorded CRC-32s (read once per version of the file: a resume reads it
    whole anyway)."""
    stat = path.stat()
    if stat.st_size == 0:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes): a write of it was interrupted; {afresh(path)}"
        )
    key = tuple(file_identity(path).values())
    if key in _INTACT:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(
            f"checkpoint {path} ({stat.st_size} bytes) is truncated or corrupt ({err}); "
            + afresh(path)
        ) from None
    if damaged is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its part {damaged} does not match the checksum "
            f"written with it (the file changed on disk or in a copy); {afresh(path)}"
        )
    _INTACT.add(key)


def load_local(path: Path, map_location: Any = None, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint loaded with ``weights_only=True``; a bad file is a :class:`CheckpointError`."""
    path = Path(path)
    check_whole(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be read with weights_only=True: it holds objects other "
            f"than tensors and plain data, which could run code when unpickled "
            f"({unpickler_reason(err)}). Only checkpoints written by lightning-kd are resumed from"
        ) from None
    except (EOFError, RuntimeError, OSError, zipfile.BadZipFile) as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is truncated "
            f"or corrupt: {afresh(path)}"
        ) from None


def unpickler_reason(err: pickle.UnpicklingError) -> str:
    """torch's reason for refusing a pickle, without its advice to load it with
    ``weights_only=False`` (which would run whatever code it holds)."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        return text[text.index(marker) :].splitlines()[0].strip()
    return text.splitlines()[0] if text else type(err).__name__
