"""Run the teacher once over the training and validation blocks and write its top-k cache.

Blocks are read in the data module's order (``train_examples``, then ``val_examples``), a batch
at a time; logits are computed from the final hidden states a chunk of tokens at a time (never
``[batch, seq, vocab]`` at once), reduced to top-k log-probs and the tail's log-mass
(:func:`~lightning_kd.losses.topk.teacher_records`) and written a shard at a time. Rank r of N
writes shards r, r + N, ...; a shard whose receipt and checksum are on disk is not written
again, so a killed writer resumes with what it completed. Rank 0 writes ``index.json`` last.
One writer at a time: rank 0 holds the directory's writer lock (``claim.py``) throughout, and a
second writer into the directory is refused, the first one's pid named.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lightning_kd.cache.claim import claim, prepare
from lightning_kd.cache.cross_shards import CrossTokenizer, cross_shard_records
from lightning_kd.cache.format import (
    INDEX_NAME,
    LOG_PROB_DTYPE,
    TAIL_DTYPE,
    CacheKey,
    CacheSpec,
    Layout,
    Shard,
    cache_key,
    ids_dtype,
    metadata,
    plan_shards,
)
from lightning_kd.cache.hidden_states import FeatureRecorder
from lightning_kd.cache.reader import CacheError
from lightning_kd.cache.shard_files import WriteStats, completed, kept_mass, write_json, write_shard
from lightning_kd.losses.chunked import OutputHead, auto_chunk_size, matmul_dtype
from lightning_kd.losses.topk import teacher_records
from lightning_kd.models.heads import check_head, final_hidden, output_head
from lightning_kd.utils.stopping import STOP


@torch.no_grad()
def shard_records(
    teacher: nn.Module,
    blocks: list[Tensor],
    collate: Callable[[list[Tensor]], dict[str, Tensor]],
    spec: CacheSpec,
    block_size: int,
    device: torch.device,
    stats: WriteStats,
    recorder: FeatureRecorder | None = None,
) -> dict[str, Tensor]:
    """The stored tensors of one shard's ``blocks`` (see ``cache.format``)."""
    head = output_head(teacher)
    vocab = head.weight.shape[0]
    positions = block_size - 1
    out = {  # filled in int64 / fp32, stored as the layout says
        "ids": torch.zeros(len(blocks), positions, spec.k, dtype=torch.int64),
        "log_probs": torch.zeros(len(blocks), positions, spec.k),
        "tail": torch.zeros(len(blocks), positions),
        "target": torch.zeros(len(blocks), positions),
        "lengths": torch.tensor([len(block) for block in blocks], dtype=torch.int32),
    }
    for first in range(0, len(blocks), spec.batch_size):
        batch = collate(blocks[first : first + spec.batch_size])
        batch = {key: value.to(device) for key, value in batch.items()}
        started = time.perf_counter()
        with recorder.armed() if recorder else nullcontext():
            hidden = final_hidden(teacher, batch, logits=False)[:, :-1]
        if recorder:
            recorder.store(out, first, block_size)
        rows, length = hidden.shape[:2]
        flat = hidden.reshape(rows * length, -1)
        stats.forward_seconds += time.perf_counter() - started
        started = time.perf_counter()
        targets = batch["input_ids"][:, 1:].reshape(-1)
        parts = top_k_chunks(head, flat, targets, spec)
        for name, values in zip(
            ("ids", "log_probs", "tail", "target"), zip(*parts, strict=True), strict=True
        ):
            out[name][first : first + rows, :length] = (
                torch.cat(values).view(rows, length, *out[name].shape[2:]).cpu()
            )
        stats.top_k_seconds += time.perf_counter() - started
        stats.tokens += int(batch["attention_mask"].sum())
    # Positions past a short block's end are padding: zeros, whatever the teacher said there.
    scored = torch.arange(positions) < (out["lengths"] - 1).unsqueeze(-1)
    out["ids"] = out["ids"].masked_fill(~scored.unsqueeze(-1), 0).to(ids_dtype(vocab))
    out["log_probs"] = out["log_probs"].masked_fill(~scored.unsqueeze(-1), 0).to(LOG_PROB_DTYPE)
    out["tail"] = out["tail"].masked_fill(~scored, 0).to(TAIL_DTYPE)
    out["target"] = out["target"].masked_fill(~scored, 0).to(TAIL_DTYPE)
    return out


def top_k_chunks(
    head: OutputHead, hidden: Tensor, targets: Tensor, spec: CacheSpec
) -> list[tuple[Tensor, ...]]:
    """``teacher_top_k`` of ``hidden`` ``[tokens, width]`` and the log-probability (T = 1) of
    each next token ``targets`` ``[tokens]``, the logits a chunk at a time."""
    chunk = auto_chunk_size(head.weight.shape[0], hidden.shape[0])
    parts = []
    for start in range(0, hidden.shape[0], chunk):
        logits = head.logits(hidden[start : start + chunk], matmul_dtype(hidden))
        targets_of = targets[start : start + chunk]
        parts.append(teacher_records(logits, targets_of, spec.k, spec.temperature))
    return parts


def write_cache(
    teacher: nn.Module,
    tokenizer: Any,
    datamodule: Any,
    spec: CacheSpec,
    directory: Path,
    *,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    device: torch.device | None = None,
    overwrite: bool = False,
    features: list[str] | tuple[str, ...] = (),
    cross: CrossTokenizer | None = None,
) -> WriteStats:
    """Write (or complete) the cache of ``teacher`` over ``datamodule``'s blocks in
    ``directory`` (with the outputs of the teacher modules ``features``; with ``cross``, a
    teacher reading its own tokenisation of them); this process is ``rank`` of ``world_size``
    (each calls this with the same arguments). Returns this rank's timings."""
    directory = Path(directory)
    device = device or next(teacher.parameters()).device
    splits = {"train": datamodule.train_examples, "val": datamodule.val_examples}
    key, meta = describe(teacher, tokenizer, datamodule, spec, features, cross)
    # The ranks of one launch are one writer: rank 0 holds the lock for them all.
    with claim(directory, overwrite) if rank == 0 else nullcontext():
        prepare(directory, meta, rank, barrier, overwrite)
        recorder = FeatureRecorder(teacher, list(key.features))
        if cross is None:  # the cross path checks the head on the teacher's own ids
            with torch.no_grad():
                sample = datamodule.collate(splits["train"][:1])
                sample = {k: v.to(device) for k, v in sample.items()}
                check_head(teacher, sample, "teacher", "the cache would hold other logits")
        shards = plan_shards(key.splits, spec.shard_blocks)
        mine = shards[rank::world_size]
        todo = [shard for shard in mine if completed(directory, shard) is None]
        stats = WriteStats(shards_kept=len(mine) - len(todo))
        write = ShardWriter(teacher, datamodule, spec, device, stats, recorder, cross)
        write.all(directory, todo, rank, world_size)
        recorder.remove()
        barrier()
        if rank == 0:
            write_index(directory, meta, shards, key)
        barrier()
    return stats


@dataclass
class ShardWriter:
    """Computes and writes one shard at a time, adding to ``stats``."""

    teacher: nn.Module
    datamodule: Any
    spec: CacheSpec
    device: torch.device
    stats: WriteStats
    recorder: FeatureRecorder
    cross: CrossTokenizer | None = None

    def all(self, directory: Path, shards: list[Shard], rank: int, world_size: int) -> None:
        """Write ``shards`` in order, with a progress bar (on rank 0) in tokens."""
        label = f"teacher cache (rank {rank})" if world_size > 1 else "teacher cache"
        tokens = sum(len(block) for shard in shards for block in self.blocks(shard))
        with tqdm(total=tokens, unit="tok", unit_scale=True, desc=label, disable=rank != 0) as bar:
            for done, shard in enumerate(shards):
                # Between shards: each written one is complete and kept; a new run adds the rest.
                kept = kept_detail(self.stats.shards_kept + done, rank, world_size)
                STOP.check("writing the teacher cache", detail=kept)
                before = self.stats.tokens
                self(directory, shard)
                bar.update(self.stats.tokens - before)

    def blocks(self, shard: Shard) -> list[Tensor]:
        examples = getattr(self.datamodule, f"{shard.split}_examples")
        return examples[shard.start : shard.start + shard.blocks]

    def __call__(self, directory: Path, shard: Shard) -> None:
        args = (
            self.teacher,
            self.blocks(shard),
            self.datamodule.collate,
            self.spec,
            self.datamodule.block_size,
            self.device,
            self.stats,
        )
        if self.cross is not None:
            tensors = cross_shard_records(*args, self.cross)
        else:
            tensors = shard_records(*args, self.recorder)
        started = time.perf_counter()
        scored, mass = kept_mass(tensors)
        receipt = write_shard(directory, shard, tensors, {"scored": scored, "top_k_mass": mass})
        self.stats.bytes_written += receipt["bytes"]
        self.stats.write_seconds += time.perf_counter() - started
        self.stats.shards_written += 1


def describe(
    teacher: nn.Module,
    tokenizer: Any,
    datamodule: Any,
    spec: CacheSpec,
    features: list[str] | tuple[str, ...] = (),
    cross: CrossTokenizer | None = None,
) -> tuple[CacheKey, dict[str, Any]]:
    """The key of the cache to write and its ``meta.json``."""
    teacher_tokenizer = None if cross is None else cross.teacher_tokenizer
    args = (teacher, tokenizer, datamodule, spec.k, spec.temperature, tuple(features))
    key = cache_key(*args, teacher_tokenizer=teacher_tokenizer)
    ids = str(ids_dtype(teacher.get_output_embeddings().weight.shape[0])).removeprefix("torch.")
    return key, metadata(key, Layout(ids, shard_blocks=spec.shard_blocks))


def write_index(directory: Path, meta: dict[str, Any], shards: list[Shard], key: CacheKey) -> None:
    """``index.json``: the metadata, every shard's receipt and what the cache holds."""
    receipts = [completed(directory, shard) for shard in shards]
    missing = [
        shard.name for shard, receipt in zip(shards, receipts, strict=True) if receipt is None
    ]
    if missing:
        raise CacheError(f"shards {missing} of {directory} were not written whole; run again")
    scored = sum(r["scored"] for r in receipts)
    entries = scored * key.k
    total_bytes = sum(r["bytes"] for r in receipts)
    stats = {
        "scored_positions": scored,
        "bytes": total_bytes,
        "bytes_per_scored_position": total_bytes / max(scored, 1),
        "bytes_per_entry": total_bytes / max(entries, 1),
        "mean_top_k_mass": sum(r["top_k_mass"] for r in receipts) / max(scored, 1),
    }
    write_json(directory / INDEX_NAME, meta | {"shards": receipts, "stats": stats})


def kept_detail(count: int, rank: int, world_size: int) -> str:
    """What a stopped writer kept: ``count`` shards, its own where several processes write (the
    line of process 0 read as the cache's total, 3 of 5)."""
    whose = f" by process {rank} of {world_size}, each keeping its own" if world_size > 1 else ""
    return f"{count} shards kept{whose}; a new run adds the rest"
