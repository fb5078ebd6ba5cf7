"""After a run: the shared cache it wrote, without the hidden states only its block-wise repair
read (``cache.keep_repair_states`` keeps them); left whole while another run reads it."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

from filelock import FileLock

from lightning_kd.cache.format import READERS_LOCK, SHARD_DIR, CacheKey
from lightning_kd.cache.narrow import without_features
from lightning_kd.cache.reader import CacheError, read_index
from lightning_kd.launch.teacher_cache import CacheChoice, lock_of
from lightning_kd.utils.atomic import replaced_directory
from lightning_kd.utils.locks import in_use_elsewhere

IN_USE = "the repair's own hidden states kept: another run reads the cache"
NOT_NARROWED = "the repair's own hidden states not dropped: the cache was gone or damaged"


def drop_repair_states(choice: CacheChoice, training: set[str], keep: bool) -> CacheChoice:
    """After the run: the cache this run wrote, rewritten without the hidden states only the
    block-wise repair read (unless ``keep``); ``choice`` with what the run wrote there now."""
    if keep or choice.path is None or not choice.written_bytes:
        return choice
    try:
        return narrowed(choice, training)
    except (CacheError, OSError) as error:  # removed or damaged under the finished run
        warnings.warn(
            f"the teacher cache {choice.path} could not be narrowed after the run "
            f"({error}); the run's outputs are written whole",
            stacklevel=2,
        )
        return replace(choice, reason=f"{choice.reason}; {NOT_NARROWED}")


def narrowed(choice: CacheChoice, training: set[str]) -> CacheChoice:
    """:func:`drop_repair_states`' work, on a cache that is there whole. It failed a finished
    run (exit 2, no summary, advising ``overwrite=true``) where the cache had been removed
    under it (probe 48)."""
    directory = Path(choice.path)
    with FileLock(lock_of(directory)):
        features = CacheKey(**read_index(directory)["key"]).features
        if set(features) <= training:
            return choice
        if in_use_elsewhere(directory / READERS_LOCK):  # another run of the key reads them
            return replace(choice, reason=f"{choice.reason}; {IN_USE}")
        with replaced_directory(directory) as smaller:
            without_features(directory, smaller, tuple(training))
    written = sum(p.stat().st_size for p in (directory / SHARD_DIR).glob("*.safetensors"))
    dropped = sorted(set(features) - training)
    reason = f"{choice.reason}; the repair's own hidden states {dropped} dropped after the run"
    return replace(choice, reason=reason, written_bytes=written)
