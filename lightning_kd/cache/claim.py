"""Taking a cache directory for writing: one writer at a time, and only into a directory that
holds nothing, a part of this very cache, or (``overwrite``) a cache to replace.

Two writers into one directory would each report a cache the other had replaced or mixed shards
into. :func:`claim` holds an exclusive ``flock`` on ``DIR/.writer.lock`` for the whole write
(released by the kernel when the writer ends, ``kill -9`` included) and refuses a second writer
at once, naming the holder's pid. :func:`prepare` refuses a directory holding a cache of other
settings (teacher, tokenizer, data blocks, k, temperature, features, layout), naming each one.

A writer that replaces a cache (``overwrite``) is refused while a training run reads it: readers
hold ``DIR/.readers.lock`` shared. The two sides take their own lock before they look at the
other's (the writer claims, then looks for readers; a reader holds shared, then looks for a
writer), so of a writer and a reader starting together at least one finds the other.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_kd.cache.format import (
    INDEX_NAME,
    META_NAME,
    READERS_LOCK,
    SHARD_DIR,
    WRITER_LOCK,
    CacheKey,
)
from lightning_kd.cache.key_mismatch import mismatches
from lightning_kd.cache.reader import CacheError
from lightning_kd.cache.shard_files import write_json
from lightning_kd.utils.locks import in_use_elsewhere, writer_lock
from lightning_kd.utils.records import read_record


@contextmanager
def claim(directory: Path, replacing: bool = False) -> Iterator[None]:
    """Hold ``directory``'s writer lock for the block, or raise ``WriterLocked`` naming the
    process that holds it; ``replacing`` (``overwrite``): or :class:`CacheError` while a run
    reads the cache. Re-entrant in one process: ``lightning-kd cache`` takes it before it
    launches its ranks (a refused second writer fails before any rank starts), then
    :func:`~lightning_kd.cache.writer.write_cache` takes it again on rank 0."""
    with writer_lock(
        Path(directory) / WRITER_LOCK,
        f"teacher cache {directory}",
        "wait for that writer to end (this command then reuses the cache, or completes it if "
        "that writer stopped early), or write this cache into another directory "
        "(hydra.run.dir=...)",
    ):
        if replacing and in_use_elsewhere(Path(directory) / READERS_LOCK):
            # Replaced under it, the run would stop at its next shard read: refused before
            # anything is removed.
            raise CacheError(
                f"{directory} holds a teacher cache that a training run is reading now: "
                "overwrite=true would replace its shards under that run. Wait for the run to "
                "end, or write this cache into another directory (hydra.run.dir=...; "
                "cache.dir=... for distill.teacher_cache=auto)"
            )
        yield


def prepare(
    directory: Path,
    meta: dict[str, Any],
    rank: int,
    barrier: Callable[[], None],
    overwrite: bool,
) -> None:
    """Check what ``directory`` holds, then (rank 0) write ``meta.json`` and drop the index:
    the cache counts as incomplete until this write finishes."""
    check_earlier(directory, meta, overwrite)
    barrier()  # every rank has looked at the earlier meta.json before rank 0 replaces it
    if rank == 0:
        if overwrite:
            shutil.rmtree(directory / SHARD_DIR, ignore_errors=True)
        (directory / INDEX_NAME).unlink(missing_ok=True)
        write_json(directory / META_NAME, meta)
    barrier()


def check_earlier(directory: Path, meta: dict[str, Any], overwrite: bool) -> None:
    """Refuse to add shards to a directory that holds a cache written for other settings."""
    path = directory / META_NAME
    if overwrite:
        return
    if not path.is_file():
        # Shard receipts name no settings: without the record of the cache's, the writer kept
        # shards of other settings (a T=1 cache relabelled T=2, every shard kept).
        if any((directory / SHARD_DIR).glob("*.safetensors")):
            raise CacheError(
                f"{directory} holds cache shards but no {META_NAME}, the record of the settings "
                "they were written for: they cannot be completed or reused. Pass overwrite=true "
                "to replace them, or write this cache into another hydra.run.dir"
            )
        return
    again = "pass overwrite=true to write the cache anew, or write it into another hydra.run.dir"
    earlier = read_record(path, again)
    # No shard yet: a writer refused after recording its settings (a module its teacher lacks)
    # left nothing to keep, and the corrected command was refused as "other settings".
    if earlier == meta or not any((directory / SHARD_DIR).glob("*.safetensors")):
        return
    raise CacheError(
        f"{directory} holds a teacher cache written for other settings:\n  "
        + "\n  ".join(writer_mismatches(earlier, meta))
        + "\nWrite this one into another hydra.run.dir, or pass overwrite=true to replace it"
    )


def writer_mismatches(earlier: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """Each way the ``meta.json`` found differs from the one this writer would write. A writer
    adds shards to its own cache only: a cache holding more teacher modules than this writer
    stores serves a run (:func:`mismatches` lets it pass), but its shards cannot be completed by
    this writer, so that difference is named here (it was "format or fields differ")."""
    same_fields = earlier.get("key", {}).keys() == meta["key"].keys()
    found = mismatches(CacheKey(**earlier["key"]), CacheKey(**meta["key"])) if same_fields else []
    stored, storing = (
        sorted(earlier.get("key", {}).get("features", [])),
        sorted(meta["key"]["features"]),
    )
    if stored != storing and not any(line.startswith("features:") for line in found):
        found.append(f"features: the cache stores teacher modules {stored}, this writer {storing}")
    if earlier.get("layout") != meta["layout"]:
        found.append(f"layout: the cache has {earlier.get('layout')}, this run {meta['layout']}")
    if earlier.get("format") != meta.get("format"):
        found.append(
            f"format: the cache is {earlier.get('format')!r}, this writer's {meta['format']!r}"
        )
    return found or ["the fields of its key differ (written by another version of the package)"]
