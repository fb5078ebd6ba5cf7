"""Smaller caches derived from a larger one, without running the teacher: a smaller k
(``lightning-kd cache cache.k=8 cache.source=DIR_K128 hydra.run.dir=DIR_K8``), or fewer cached
hidden states (:func:`without_features`: the block-wise repair's own, once the repair is done).

The top k of the top K (K ≥ k) are the top k; the new tail is the old tail plus the mass of
entries k+1..K, ``log(e^tail + Σ e^{log p_i})``, summed from the stored fp16 log-probs (each
within 0.008 of the teacher's). Every shard is rewritten with its own receipt; the source is
opened against the run's key first, so only a cache of this very run is narrowed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from lightning_kd.cache.claim import claim, prepare
from lightning_kd.cache.cross_shards import CrossTokenizer
from lightning_kd.cache.format import (
    FEATURE_PREFIX,
    TAIL_DTYPE,
    CacheKey,
    CacheSpec,
    Layout,
    cache_key,
    metadata,
    plan_shards,
)
from lightning_kd.cache.reader import CacheError, TeacherCache, read_index
from lightning_kd.cache.shard_files import completed, kept_mass, write_shard
from lightning_kd.cache.writer import describe, write_index


def narrow_records(tensors: dict[str, Tensor], k: int) -> dict[str, Tensor]:
    """One shard's tensors with only the top ``k`` entries kept and the rest added to the tail
    (positions past a short block's end stay zero)."""
    log_probs = tensors["log_probs"]
    rest = torch.logsumexp(log_probs[..., k:].float(), dim=-1)
    tail = torch.logaddexp(tensors["tail"].float(), rest)
    scored = torch.arange(tail.shape[1]) < (tensors["lengths"] - 1).unsqueeze(-1)
    if "aligned" in tensors:  # across tokenizers: records only where a position had a partner
        scored = tensors["aligned"].bool()
    return tensors | {
        "ids": tensors["ids"][..., :k].contiguous(),
        "log_probs": log_probs[..., :k].contiguous(),
        "tail": tail.masked_fill(~scored, 0).to(TAIL_DTYPE),
    }


def narrow_cache(
    source: str | Path,
    teacher: torch.nn.Module,
    tokenizer: Any,
    datamodule: Any,
    spec: CacheSpec,
    directory: Path,
    *,
    overwrite: bool = False,
    features: tuple[str, ...] = (),
    cross: CrossTokenizer | None = None,
) -> int:
    """Write into ``directory`` the ``spec.k`` cache of this run from ``source``, the run's own
    cache at a larger k (holding the teacher modules ``features``, which are copied with every
    other module it holds; with ``cross``, of a teacher with another tokenizer); returns the
    number of shards written."""
    source = Path(source)
    larger = read_index(source)["key"]["k"]
    if spec.k > larger:
        raise CacheError(
            f"cache.source={source} holds k={larger}: a cache of cache.k={spec.k} cannot be "
            f"derived from it; choose cache.k <= {larger}, or write it from the teacher "
            "(cache.source=null)"
        )
    theirs = None if cross is None else cross.teacher_tokenizer
    args = (teacher, tokenizer, datamodule, larger, spec.temperature, features, theirs)
    cache = TeacherCache.open(source, cache_key(*args))
    spec = replace(spec, shard_blocks=cache.shard_blocks)  # the same shards, narrower
    key, meta = describe(teacher, tokenizer, datamodule, spec, cache.key.features, cross)
    with claim(directory, overwrite):
        prepare(directory, meta, 0, lambda: None, overwrite)
        shards = plan_shards(key.splits, spec.shard_blocks)
        written = 0
        for shard in shards:
            if completed(directory, shard) is not None:
                continue
            tensors = narrow_records(load_file(source / shard.file), spec.k)
            scored, mass = kept_mass(tensors)
            write_shard(directory, shard, tensors, {"scored": scored, "top_k_mass": mass})
            written += 1
        write_index(directory, meta, shards, key)
    return written


def without_features(source: Path, directory: Path, keep: tuple[str, ...]) -> CacheKey:
    """Write into ``directory`` the cache in ``source`` holding, of its teacher modules' outputs,
    only those of ``keep``: the same shards and records otherwise. Returns its key."""
    index = read_index(source)
    key = CacheKey(**index["key"])
    key = replace(key, features=tuple(sorted(set(keep) & set(key.features))))
    layout = Layout(**index["layout"])
    meta = metadata(key, layout)
    with claim(directory):
        prepare(directory, meta, 0, lambda: None, overwrite=False)
        shards = plan_shards(key.splits, layout.shard_blocks)
        kept = {FEATURE_PREFIX + path for path in key.features}
        for shard in shards:
            if completed(directory, shard) is not None:
                continue
            tensors = {
                name: tensor
                for name, tensor in load_file(source / shard.file).items()
                if not name.startswith(FEATURE_PREFIX) or name in kept
            }
            scored, mass = kept_mass(tensors)
            write_shard(directory, shard, tensors, {"scored": scored, "top_k_mass": mass})
        write_index(directory, meta, shards, key)
    return key
