"""Open a teacher cache for a run: refuse it before training unless it is whole and is the cache
of this run's teacher, tokenizer, data, block size, k, temperature and dtype."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file
from torch import Tensor

from lightning_kd.cache.format import (
    CROSS_NAMES,
    FEATURE_PREFIX,
    FORMAT_VERSION,
    INDEX_NAME,
    READERS_LOCK,
    WRITER_LOCK,
    CacheKey,
    Shard,
)
from lightning_kd.cache.key_mismatch import mismatches
from lightning_kd.cache.shard_files import sha256_file
from lightning_kd.utils.files import blocking_file, current_identity
from lightning_kd.utils.locks import hold_shared, let_go, lock_holder
from lightning_kd.utils.refusal import Refused

REBUILD = (
    "rebuild it for this run with `lightning-kd cache hydra.run.dir=<dir> <this run's "
    "teacher=, student.source (whose tokenizer the data is read with), data=, "
    "distill.temperature and cache.k overrides>`"
)


class CacheError(Refused):
    """A cache directory that is incomplete or whose files are not as the index records."""


class CacheMismatch(CacheError):
    """A whole cache, but of another teacher, tokenizer, data split or setting than the run's."""


class Records(NamedTuple):
    """A batch of blocks' records: ``ids`` ``[blocks, block_size − 1, k]`` int64, ``log_probs``
    the same shape (fp32), ``tail`` and ``target`` ``[blocks, block_size − 1]`` (fp32)."""

    ids: Tensor
    log_probs: Tensor
    tail: Tensor
    target: Tensor | None
    """None in a cross-tokenizer cache."""
    features: dict[str, Tensor]
    """Teacher module path → its outputs ``[blocks, block_size, width]`` (bf16), where cached."""
    cross: dict[str, Tensor]
    """A cross-tokenizer cache's ``CROSS_NAMES`` (else empty)."""


class TeacherCache:
    """A verified cache: every shard present, of its recorded size and sha256, and its key the
    run's. Use :meth:`open`; :meth:`records` reads blocks."""

    def __init__(self, directory: Path, index: dict[str, Any]) -> None:
        self.directory = directory
        self.key = CacheKey(**index["key"])
        self.layout = index["layout"]
        self.stats = index.get("stats", {})
        self.shards = [
            Shard(s["name"], s["split"], s["start"], s["blocks"]) for s in index["shards"]
        ]
        self.shard_blocks = self.layout["shard_blocks"]
        self.verified: dict[Path, dict] = {}  # each shard's file_identity when open checked it

    @classmethod
    def open(cls, directory: str | Path, expect: CacheKey | None = None) -> TeacherCache:
        """The cache in ``directory``, checked whole and (given ``expect``) matching the run.

        Reads every shard once to check its sha256: a truncated shard or a flipped byte is an
        error naming the shard, found here rather than mid-training.
        """
        directory = Path(directory)
        index = read_index(directory)
        cache = cls(directory, index)
        if expect is not None:
            found = mismatches(cache.key, expect)
            if found:
                raise CacheMismatch(
                    f"the teacher cache in {directory} was not written for this run:\n  "
                    + "\n  ".join(found)
                    + f"\nUse the cache written for these settings, or {REBUILD}"
                )
        # Held before it looks for a writer, as a writer claims before it looks for readers
        # (claim.py): of the two starting together, at least one finds the other.
        hold_shared(directory / READERS_LOCK)  # drop_repair_states leaves it as it is, then
        try:
            no_writer(directory, "holds a teacher cache")
        except CacheError:
            let_go(directory / READERS_LOCK)
            raise
        for entry in index["shards"]:
            path, found = verify_shard(directory, entry)
            cache.verified[path] = found
        return cache

    # Reading records is I/O, not compute: a bf16-mixed run on the CPU calls this under CPU
    # autocast, whose torch.stack refuses the fp16 log-probs ("Unexpected floating ScalarType").
    @torch.autocast("cpu", enabled=False)
    def records(self, split: str, block_indices: list[int] | Tensor) -> Records:
        """The records of ``block_indices`` (indices into the data module's ``train_examples`` or
        ``val_examples``), stacked in the order given."""
        blocks = self.key.splits[split]["blocks"]
        rows = []
        for index in [int(i) for i in block_indices]:
            if not 0 <= index < blocks:
                raise IndexError(f"block {index} of split {split!r}: the cache holds {blocks}")
            shard = self._shard(split, index // self.shard_blocks)
            rows.append({name: tensor[index % self.shard_blocks] for name, tensor in shard.items()})
        return Records(
            torch.stack([row["ids"] for row in rows]).to(torch.int64),
            torch.stack([row["log_probs"] for row in rows]).float(),
            torch.stack([row["tail"] for row in rows]).float(),
            torch.stack([row["target"] for row in rows]).float() if "target" in rows[0] else None,
            {
                name.removeprefix(FEATURE_PREFIX): torch.stack([row[name] for row in rows])
                for name in rows[0]
                if name.startswith(FEATURE_PREFIX)
            },
            {
                name: torch.stack([row[name] for row in rows])
                for name in CROSS_NAMES
                if name in rows[0]
            },
        )

    @lru_cache(maxsize=8)  # noqa: B019 (the cache lives as long as the TeacherCache)
    def _shard(self, split: str, number: int) -> dict[str, Tensor]:
        # Read again whenever the LRU let it go: a cache rewritten meanwhile (overwrite=true)
        # gave records of other settings, unchecked, or a FileNotFoundError mid-write.
        path = self.directory / Shard(f"{split}-{number:05d}", split, 0, 0).file
        if path in self.verified and current_identity(path) != self.verified[path]:
            raise CacheError(
                f"teacher cache shard {path} was rewritten or removed while this run read the "
                "cache: its records now are not the ones checked against this run. Leave a "
                "cache in use as it is (write another into a directory of its own), then resume"
            )
        return load_file(path)


TRAINING_OUTPUTS = ("checkpoints", "logs", "student", "summary.json")
"""What ``lightning-kd train`` writes into its run directory (``training.rundir.OUTPUTS``, which
this layer cannot import): a directory holding any is a run's, not a cache."""


def training_outputs(directory: Path) -> list[str]:
    """The entries of ``directory`` that only a training run writes."""
    return [name for name in TRAINING_OUTPUTS if (directory / name).exists()]


def no_writer(directory: Path, state: str) -> None:
    """A :class:`CacheError` while another process writes ``directory`` (``state``: what it
    holds meanwhile)."""
    if holder := lock_holder(directory / WRITER_LOCK):
        raise CacheError(
            f"{directory} {state}: it is being written (pid {holder}); start this run once "
            "that writer has finished"
        )


def missing_directory_error(directory: Path) -> str | None:
    """Where ``directory`` is no directory: a file (or under one), or nothing at all, with the
    directory a relative path was read from. Both were said to hold "no complete teacher cache",
    with advice to write one there: at a mistyped ``cache.source``, or a file (probes 58, 59)."""
    if (place := blocking_file(directory)) is not None:
        where = "is a file" if place == directory else f"is under {place}, a file"
        return f"{directory} {where}, not a teacher cache directory"
    if directory.exists():
        return None
    relative = "" if directory.is_absolute() else f" (read from {Path.cwd()})"
    return (
        f"{directory} does not exist{relative}: check the path, or write one with `lightning-kd "
        f"cache hydra.run.dir={directory} <this run's teacher=, data=, distill.temperature and "
        "cache.k overrides>`"
    )


def read_index(directory: Path) -> dict[str, Any]:
    """``index.json`` of a complete cache, or a :class:`CacheError` saying what is missing."""
    path = directory / INDEX_NAME
    if not path.is_file() and (found := training_outputs(directory)):
        raise CacheError(
            f"{directory} is a training run's directory ({', '.join(found)}), not a teacher "
            "cache; write the cache into a directory of its own (`lightning-kd cache "
            "hydra.run.dir=DIR`) and pass distill.teacher_cache=DIR"
        )
    if not path.is_file():
        if error := missing_directory_error(directory):
            raise CacheError(error)
        no_writer(directory, "holds no complete teacher cache yet")
        partial = ": its writer stopped before finishing; run it again to complete it"
        raise CacheError(
            f"{directory} holds no complete teacher cache (no {INDEX_NAME})"
            + (partial if (directory / "meta.json").is_file() else "")
            + f"; write one with `lightning-kd cache hydra.run.dir={directory} <this run's "
            "teacher=, data=, distill.temperature and cache.k overrides>`"
        )
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CacheError(f"{path} is not valid JSON ({err}); {REBUILD}") from None
    if index.get("format") != FORMAT_VERSION:
        raise CacheError(
            f"{path} is format {index.get('format')!r}; this version reads format "
            f"{FORMAT_VERSION}: {REBUILD}"
        )
    return index


def written_dtype(directory: object) -> str | None:
    """The teacher dtype the complete cache in ``directory`` was written with (None: not a
    cache directory, or one that does not read, which :func:`read_index` names where it is
    opened)."""
    if not isinstance(directory, str | Path) or not (Path(directory) / INDEX_NAME).is_file():
        return None
    try:
        return read_index(Path(directory))["key"]["teacher_dtype"]
    except (CacheError, KeyError, TypeError, OSError, ValueError):
        return None


_CHECKED: set[tuple[tuple, str]] = set()
"""Shard files whose sha256 was found right in this process, by identity: read once each."""


def verify_shard(directory: Path, entry: dict[str, Any]) -> tuple[Path, dict]:
    """The shard's path and identity; :class:`CacheError` unless it has its recorded size and
    sha256 (read once per version of the file in a process: ``auto`` checks, then opens)."""
    path = directory / Shard(entry["name"], entry["split"], entry["start"], entry["blocks"]).file
    fix = (
        f"run the writer again on {directory} (it rewrites every shard that fails its checksum "
        "and keeps the rest)"
    )
    if (found := current_identity(path)) is None:
        raise CacheError(f"teacher cache shard {path} is missing; {fix}")
    if (size := found["size"]) != entry["bytes"]:
        raise CacheError(
            f"teacher cache shard {path} has {size} bytes, the index records {entry['bytes']}: "
            f"it is truncated or was replaced; {fix}"
        )
    checked = (tuple(found.values()), entry["sha256"])
    if checked not in _CHECKED and sha256_file(path) != entry["sha256"]:
        raise CacheError(
            f"teacher cache shard {path} fails its checksum (sha256 differs from the index's): "
            f"its bytes are corrupt; {fix}"
        )
    _CHECKED.add(checked)
    return path, found
