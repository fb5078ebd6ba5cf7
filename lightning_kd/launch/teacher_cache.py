"""``distill.teacher_cache=auto``: run the teacher once per block when the run would run it more.

A run that passes over its training blocks E times runs the teacher E times on each. With ``auto``
it runs once per block instead: the teacher's top-k records of every training and validation block
(``cache.k`` entries per position; with ``distill.features`` or the block-wise repair, the mapped
teacher modules' outputs too) are written once into the shared cache directory (``cache.dir``),
under a name derived from the cache's key — teacher weights and config, tokenizer (and the
teacher's own where it reads another), the blocks of each split, block size, k, temperature,
features — and the run trains from them. A second run with
the same key (the same command again, another learning rate, a resume) finds that cache whole and
runs no teacher forward; an interrupted write is completed shard by shard. Writers of one key take
a file lock, so two runs never write the same cache at once.

``auto`` keeps the teacher online — and says why — where a cache saves nothing or cannot serve:
fewer than :data:`MIN_READS_PER_BLOCK` teacher reads per block a cache would hold, an objective
without the teacher's logits, on-policy KD, the full-logit loss, a teacher that is not a causal
LM, chat data, a streamed corpus. Several processes resolve it as one does: the first to take the
key's lock writes the cache with one process (a DDP launch's rank 0, before it starts the
others), and the rest find it whole. The choice reads the config alone, never what the shared
directory holds: the same command trains the same objective on any machine.
Elsewhere (the notebooks, the benchmark, ``DistillConfig`` itself) an unresolved ``auto`` is the
online teacher: only a run resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from lightning_kd.cache.format import (
    INDEX_NAME,
    META_NAME,
    CacheKey,
    CacheSpec,
    cache_key,
)
from lightning_kd.cache.key_mismatch import mismatches
from lightning_kd.cache.reader import CacheError, read_index, verify_shard
from lightning_kd.cache.writer import write_cache
from lightning_kd.launch.cache import cached_teacher, cross_path, fabric_for, report
from lightning_kd.launch.online_reasons import AUTO, why_online
from lightning_kd.launch.teacher_reads import passes, repair_passes, validation_reads
from lightning_kd.models.cache_places import cache_root
from lightning_kd.utils.locks import waiting_lock
from lightning_kd.utils.records import DamagedRecord, read_record

SHARED_DIRECTORY = "teacher_caches"
"""The shared cache directory's name under ``cache_root()`` (when ``cache.dir`` is null)."""
MIN_READS_PER_BLOCK = 1.5
"""Teacher reads per block a cache would hold from which caching pays: it costs one teacher
forward per block of both splits (and the top-k of its logits), online KD one per block read."""


@dataclass(frozen=True)
class CacheChoice:
    """What ``distill.teacher_cache`` resolved to, and why."""

    path: str | None
    """The cache trained from; None: the teacher runs online (or not at all in training)."""
    reason: str
    in_training: bool = True
    """False where the objective needs no teacher in training (CE-only): only validation runs it."""
    caches: bool = False
    """Whether the run trains from a cache (its path is known once :func:`prepare` found or
    wrote it)."""
    written_bytes: int = 0
    """What this run wrote into the cache: 0 where it found the cache whole."""

    @property
    def where(self) -> str:
        if not self.in_training:
            return "not run in training"
        return "cached once" if self.path else "online"

    def line(self) -> str:
        where = f"cached once in {self.path}" if self.path else self.where
        return f"teacher: {where} ({self.reason})"

    def as_dict(self) -> dict[str, str | int | None]:
        return {
            "distill.teacher_cache": self.path,
            "reason": self.reason,
            "in_training": self.where,
            "written_bytes": self.written_bytes,
        }


def given_cache(path: object, key: str) -> CacheChoice | None:
    """The choice of a cache the command named (``key=DIR``): the summary says what trained
    from a cache as it does for ``auto`` (it said nothing of a named one)."""
    if path in (None, AUTO):
        return None
    return CacheChoice(str(path), f"given ({key})", caches=True)


def choose(
    cfg: DictConfig, train_examples: int, val_examples: int = 0, shares=(1.0, 1.0)
) -> CacheChoice:
    """Cache or online, for a run of ``cfg`` over ``train_examples`` and ``val_examples``
    blocks, of which the teacher reads ``shares`` (a teacher of some data domains: theirs);
    writes nothing. A cache holds every block of both splits."""
    reason = why_online(cfg)
    if reason is not None:
        distill = instantiate(cfg.distill, _convert_="all")
        return CacheChoice(None, f"auto: {reason}", in_training=distill.uses_teacher_in_training)
    count, repair = passes(cfg, train_examples), repair_passes(cfg, train_examples)
    per = f"{count:.2f} passes over {train_examples} training blocks"
    per += f" ({repair:.2f} of them the block-wise repair's)" if repair else ""
    per += f", {shares[0]:.0%} of them its domains'" if shares[0] < 1 else ""
    val = validation_reads(cfg, val_examples, train_examples) * shares[1]
    reads = count * train_examples * shares[0] + val
    each = reads / max(1, train_examples + val_examples)
    if val_examples:
        held = f"{train_examples} training, {val_examples} validation"
        per += f"; {reads:.0f} teacher reads ({val:.0f} validation's) of the blocks a cache holds"
        per += f" ({held}): {each:.2f} a block"
    if each < MIN_READS_PER_BLOCK:
        return CacheChoice(None, f"auto: {per}; a cache pays from {MIN_READS_PER_BLOCK}")
    return CacheChoice(None, f"auto: {per}, one teacher forward per block", caches=True)


def shared_directory(spec: CacheSpec) -> Path:
    """Where ``auto``'s caches live: ``cache.dir``, else ``cache_root()/teacher_caches``."""
    return Path(spec.dir).expanduser() if spec.dir else cache_root() / SHARED_DIRECTORY


def prepare(
    cfg: DictConfig, datamodule, tokenizer, choice: CacheChoice, resuming: bool = False
) -> CacheChoice:
    """``choice`` with its cache's path: the shared cache of this run's key, found holding what
    the run reads or written (completed) now with one process (of several, the first to take
    the lock: the others wait for it, then find it whole); the teacher is released when this
    returns. A resume reads no repair states (its checkpoint's student was repaired)."""
    teacher_spec = instantiate(cfg.teacher, _convert_="all")
    spec = instantiate(cfg.cache, _convert_="all")
    crossing = cross_path(cfg, teacher_spec, tokenizer)
    teacher, needed, training = cached_teacher(cfg, teacher_spec, spec, repairs=not resuming)
    device = fabric_for(cfg).device
    teacher = teacher.to(device)
    cross = None if crossing is None else crossing.build(tokenizer, teacher)
    theirs = None if cross is None else cross.teacher_tokenizer
    args = (teacher, tokenizer, datamodule, spec.k, spec.temperature, tuple(needed), theirs)
    key = cache_key(*args)
    # Named without the repair's own hidden states, which a cache may hold or have dropped
    # (cache.keep_repair_states): a resume and a fresh run find the same directory.
    directory = shared_directory(spec) / replace(key, features=tuple(training)).digest()
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Runs of one key wait for each other here (the second then finds the cache whole); the
    # writer lock write_cache takes inside is another file, DIR/.writer.lock, so holding this one
    # cannot deadlock with it: it refuses only a `lightning-kd cache` writing into DIR meanwhile.
    with waiting_lock(lock_of(directory), f"for the teacher cache {directory.name}"):
        if holds(directory, key):
            return replace(choice, path=str(directory), reason=f"{choice.reason}; {FOUND}")
        stats = write_cache(
            teacher,
            tokenizer,
            datamodule,
            spec,
            directory,
            device=device,
            features=needed,
            overwrite=stale(directory, key),
            cross=cross,
        )
    print(stats.line(0), flush=True)
    report(directory, spec, 0)
    reason = f"{choice.reason}; written to the shared cache"
    return replace(choice, path=str(directory), reason=reason, written_bytes=stats.bytes_written)


FOUND = "found whole in the shared cache"


def lock_of(directory: Path) -> Path:
    """The file lock writers of ``directory`` take (beside it: the directory may be replaced)."""
    return directory.parent / f"{directory.name}.lock"


def holds(directory: Path, key: CacheKey) -> bool:
    """Whether ``directory`` holds a whole cache a run of ``key`` can read: its key, and every
    shard as the index records it. A damaged shard was "found whole", then refused with advice
    to run a writer that ``auto`` users never ran; the writer now rewrites it, keeping the rest."""
    if not (directory / INDEX_NAME).is_file():
        return False
    try:
        index = read_index(directory)
    except CacheError:  # damaged: the shared cache is the package's to write again
        return False
    if mismatches(CacheKey(**index["key"]), key):
        return False
    try:
        for entry in index["shards"]:
            verify_shard(directory, entry)
    except CacheError:
        return False
    return True


def stale(directory: Path, key: CacheKey) -> bool:
    """Whether ``directory`` holds a cache (whole or begun) of the same teacher and data with
    other hidden states than ``key``'s (its repair states dropped, say), or a damaged record of
    its settings (a raw JSONDecodeError in every later run of the key; probe 59): written anew."""
    meta = directory / META_NAME
    if not meta.is_file():
        return False
    try:
        return CacheKey(**read_record(meta, "")["key"]) != key
    except (DamagedRecord, KeyError, TypeError):  # a damaged record: the cache written anew
        return True
