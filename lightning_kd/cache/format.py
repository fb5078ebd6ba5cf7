"""The teacher cache on disk: what it is valid for, how it is laid out, how a shard is written.

A cache directory holds

- ``meta.json``: the :class:`CacheKey` (what the cache is valid for: teacher weights and config,
  tokenizer, the token blocks of each split, block size, k, temperature, teacher dtype) and the
  :class:`Layout` (stored dtypes, blocks per shard), written before any shard;
- ``shards/<split>-<nnnnn>.safetensors``: for ``blocks`` consecutive blocks of one split,
  ``ids`` ``[blocks, block_size − 1, k]`` (uint16 when the vocabulary fits, else int32),
  ``log_probs`` ``[blocks, block_size − 1, k]`` fp16, ``tail`` ``[blocks, block_size − 1]`` fp32
  (the log of the mass outside the top k), ``target`` ``[blocks, block_size − 1]`` fp32 (the
  teacher's log-probability at T = 1 of the token that follows: its exact perplexity, which the
  top k alone do not give when that token is outside them) and ``lengths`` ``[blocks]`` (tokens
  in each block); with ``cache.features``, ``features.<module path>``
  ``[blocks, block_size, width]`` bf16 for each teacher module that ``distill.features`` maps
  (every position; zeros past a short block's end). A cross-tokenizer cache (the teacher reads
  its own tokenisation of each block, ``distill/cross_tokenizer.py``) holds the teacher's top k in
  *its* vocabulary at the student's positions aligned with one of its own, ``aligned``
  ``[blocks, block_size − 1]`` (uint8: which those are; zeros elsewhere), and per block the
  teacher's NLL over the block's text, ``teacher_nll`` (fp64, nats), and that text's bytes,
  ``teacher_bytes``: its bits per byte; ``span`` ``[blocks, block_size − 1]`` fp32: at each
  aligned position, the teacher's log-probability of the text up to the next one
  (``losses/cross_spans.py``; NaN where none counts; caches written before it lack it);
  ``target`` is not stored (a student position's next token is not a teacher token).
  Position t of a block holds the teacher's distribution for the token at t + 1 (the causal
  shift): the last position is never scored, so a block of ``block_size`` tokens stores
  ``block_size − 1`` positions. A block shorter than ``block_size`` (``data.pack=false``) is
  stored padded: its positions from ``length − 1`` on hold zeros and are never read as scored;
- ``shards/<name>.json`` beside each shard: its size and sha256, written once the shard is in
  place (a killed writer resumes from these);
- ``index.json``: ``meta.json`` plus the list of every shard with its size and sha256, written
  last: its presence means the cache is complete.

Every file is written to a temporary name beside its target and moved into place, so a crash
leaves a whole file or none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_kd.data import alignment
from lightning_kd.models.digests import (
    config_digest,
    tokenizer_digest,
    vocab_digest,
    weights_digest,
)

FORMAT_VERSION = 2
META_NAME = "meta.json"
INDEX_NAME = "index.json"
SHARD_DIR = "shards"
WRITER_LOCK = ".writer.lock"
"""The lock file a writer holds inside the cache directory (holding its pid)."""
READERS_LOCK = ".readers.lock"
"""The lock file every run reading the cache holds shared, while a run about to replace the
directory (``drop_repair_states``) finds it."""
SPLITS = ("train", "val")
LOG_PROB_DTYPE = torch.float16
"""fp16 keeps 11 significant bits down to ±65504: log-probs in [−20, 0] to within 0.008
(a relative probability error under 1 %); bf16 keeps 8 bits (0.06 at −20)."""
TAIL_DTYPE = torch.float32
FEATURE_DTYPE = torch.bfloat16
"""Cached hidden states: bf16 keeps fp32's range (residual streams hold outliers in the
thousands) at half the bytes; a bf16-mixed run's teacher computes them in bf16 anyway."""
FEATURE_PREFIX = "features."
CROSS_NAMES = ("aligned", "teacher_nll", "teacher_bytes", "span")
"""What a cross-tokenizer cache stores besides the top k (see above)."""


@dataclass
class CacheSpec:
    """The ``cache`` config group: what ``lightning-kd cache`` writes."""

    k: int = 32
    """Teacher tokens kept per scored position (most probable first); the rest is one tail."""
    temperature: float = 1.0
    """Temperature of the stored distribution (``conf/cache/default.yaml``: distill.temperature).
    A run at another temperature cannot use the cache: the tail's logits are not stored."""
    shard_blocks: int = 64
    """Blocks per shard file: the unit of resuming and of the work split between ranks."""
    batch_size: int = 8
    """Blocks per teacher forward."""
    source: str | None = None
    """A cache of this run at a larger k to derive this one from, without running the teacher
    (``lightning_kd/cache/narrow.py``); null: run the teacher."""
    dir: str | None = None
    """Where ``distill.teacher_cache=auto`` keeps its caches, one directory per key (teacher,
    tokenizer, data blocks, k, temperature, features), shared by every run: a run whose key
    was written before reads that cache and runs no teacher forward. null:
    ``$LIGHTNING_KD_CACHE/teacher_caches`` (default ``~/.cache/lightning_kd/teacher_caches``)."""
    keep_repair_states: bool = False
    """Keep, after the run, the teacher hidden states that only the block-wise repair reads (not
    ``distill.features``) in the cache ``distill.teacher_cache=auto`` wrote. false: once the run
    is done, that cache is rewritten without them (smaller on disk; a resume needs none of them,
    a new identical run writes them again). The default run's features are the repair's own."""
    features: bool | None = None
    """Also store the outputs of the teacher modules ``distill.features`` maps and the block-wise
    repair reads (for the run's student), so that a run from the cache needs no teacher for them.
    None: whenever the run's ``distill.features`` or ``distill.blockwise_passes`` is set (the
    default run's are); false: logits only."""

    def __post_init__(self) -> None:
        if self.k < 1 or self.shard_blocks < 1 or self.batch_size < 1:
            raise ValueError(
                f"cache.k={self.k}, cache.shard_blocks={self.shard_blocks}, cache.batch_size="
                f"{self.batch_size}: each must be at least 1"
            )
        if self.temperature <= 0:
            raise ValueError(f"cache.temperature={self.temperature}; it must be positive")


@dataclass(frozen=True)
class CacheKey:
    """What a cache is valid for; a run may use a cache only if its own key is equal."""

    teacher_weights: str
    """``digests.weights_digest`` of the teacher as it ran (its dtype included)."""
    teacher_config: str
    """``digests.config_digest`` of the teacher's Hugging Face config."""
    teacher_dtype: str
    tokenizer: str
    """``digests.vocab_digest`` of the tokenizer the data was tokenized with."""
    block_size: int
    pack: bool
    k: int
    temperature: float
    splits: dict[str, dict[str, Any]]
    """``split → {"blocks": count, "digest": sha256 of the blocks' tokens in order}``: another
    corpus, seed, validation fraction or block size gives another digest."""
    features: tuple[str, ...] = ()
    """Teacher module paths whose outputs the cache holds (a run may use any of them)."""
    teacher_tokenizer: str = ""
    """``digests.tokenizer_digest`` of the teacher's own tokenizer where it is not the student's
    (a cross-tokenizer cache: the teacher's top k at the student's positions, ``CROSS_NAMES``
    beside them); empty: the teacher read the student's tokens."""
    alignment: int = 0
    """``data.alignment.RULE`` a cross-tokenizer cache paired positions by; 0 for the same
    tokenizer (and for cross caches written before the rule was recorded)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(sorted(self.features)))  # JSON gives a list

    @property
    def cross(self) -> bool:
        return bool(self.teacher_tokenizer)

    def as_dict(self) -> dict[str, Any]:
        """Every field; a same-tokenizer key without ``teacher_tokenizer``, as written before
        that field existed (its digest, the shared cache's directory name, unchanged)."""
        fields = dataclasses.asdict(self)
        if not self.teacher_tokenizer:
            del fields["teacher_tokenizer"]
        if not self.alignment:
            del fields["alignment"]
        return fields

    def digest(self) -> str:
        """A name for the cache of this key: equal keys, equal names (the shared cache
        directory keeps one cache per key)."""
        text = json.dumps(self.as_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Layout:
    """How the records are stored."""

    ids_dtype: str
    log_probs_dtype: str = str(LOG_PROB_DTYPE).removeprefix("torch.")
    tail_dtype: str = str(TAIL_DTYPE).removeprefix("torch.")
    shard_blocks: int = 64


@dataclass(frozen=True)
class Shard:
    """``blocks`` consecutive blocks of ``split`` from ``start``, stored in one file."""

    name: str
    split: str
    start: int
    blocks: int

    @property
    def file(self) -> str:
        return f"{SHARD_DIR}/{self.name}.safetensors"

    @property
    def receipt(self) -> str:
        return f"{SHARD_DIR}/{self.name}.json"


def ids_dtype(vocab: int) -> torch.dtype:
    """uint16 when every id fits in 16 bits, else int32."""
    return torch.uint16 if vocab <= 2**16 else torch.int32


def blocks_digest(blocks: list[Tensor]) -> str:
    """sha256 of the blocks' lengths and token ids, in order."""
    digest = hashlib.sha256()
    for block in blocks:
        tokens = block.to(torch.int64).contiguous()
        digest.update(len(tokens).to_bytes(8, "little"))
        digest.update(tokens.numpy().tobytes())
    return digest.hexdigest()


def plan_shards(splits: dict[str, dict[str, Any]], shard_blocks: int) -> list[Shard]:
    """Every shard of the cache, train first: the same list wherever and however often asked."""
    shards = []
    for split in SPLITS:
        count = splits[split]["blocks"]
        for number, start in enumerate(range(0, count, shard_blocks)):
            shards.append(
                Shard(f"{split}-{number:05d}", split, start, min(shard_blocks, count - start))
            )
    return shards


def metadata(key: CacheKey, layout: Layout) -> dict[str, Any]:
    """``meta.json``'s content, as JSON reads it back (tuples as lists: comparable to a file's)."""
    meta = {"format": FORMAT_VERSION, "key": key.as_dict(), "layout": dataclasses.asdict(layout)}
    return json.loads(json.dumps(meta))


def cache_key(
    teacher: torch.nn.Module,
    tokenizer: Any,
    datamodule: Any,
    k: int,
    temperature: float,
    features: tuple[str, ...] = (),
    teacher_tokenizer: Any = None,
) -> CacheKey:
    """The key of a cache of ``teacher`` over ``datamodule``'s blocks (its ``train_examples`` and
    ``val_examples`` after ``setup()``), read with ``tokenizer`` (the student's) and by the
    teacher with ``teacher_tokenizer`` where that is another: what the writer records, and what a
    run that reads the cache must match."""
    splits = {"train": datamodule.train_examples, "val": datamodule.val_examples}
    if not all(isinstance(block, Tensor) for blocks in splits.values() for block in blocks):
        raise ValueError(
            f"a teacher cache holds plain text blocks; {type(datamodule).__name__} (data=chat) "
            "is not cached yet: train with the teacher online (no distill.teacher_cache)"
        )
    return CacheKey(
        teacher_weights=weights_digest(teacher),
        teacher_config=config_digest(teacher.config),
        teacher_dtype=str(next(teacher.parameters()).dtype).removeprefix("torch."),
        tokenizer=vocab_digest(tokenizer),
        block_size=datamodule.block_size,
        pack=datamodule.pack,
        k=k,
        temperature=float(temperature),
        splits={
            split: {"blocks": len(blocks), "digest": blocks_digest(blocks)}
            for split, blocks in splits.items()
        },
        features=tuple(features),
        teacher_tokenizer="" if teacher_tokenizer is None else tokenizer_digest(teacher_tokenizer),
        alignment=0 if teacher_tokenizer is None else alignment.RULE,
    )
