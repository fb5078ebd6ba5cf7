"""Measure the teacher cache on the default teacher and data, over the first N training blocks.

python scripts/cache_measure.py [N]      # N = 32: times, bytes, top-k mass for k = 8..128

Prints (and writes to cache_measure.json) the seconds of one teacher forward to full logits (what
online KD spends on the teacher) against writing the cache's records, the bytes per scored
position, the mean and 10th-percentile mass of the top k, and the fp16 / bf16 log-prob error.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from lightning_kd.cache.format import CacheSpec, Shard
from lightning_kd.cache.shard_files import kept_mass, write_shard
from lightning_kd.cache.writer import WriteStats, shard_records
from lightning_kd.data.text import TextDataModule
from lightning_kd.models.heads import final_hidden
from lightning_kd.models.loading import TeacherSpec, load_teacher, load_tokenizer


def main(count: int) -> dict[str, float]:
    spec = TeacherSpec(dtype="float32")
    tokenizer = load_tokenizer(spec)
    datamodule = TextDataModule(tokenizer)
    datamodule.setup("fit")
    teacher = load_teacher(spec)
    blocks = datamodule.train_examples[:count]
    out = {"blocks": count, "train_blocks": len(datamodule.train_examples)}
    with torch.no_grad():
        started = time.perf_counter()
        for first in range(0, count, 8):
            batch = datamodule.collate(blocks[first : first + 8])
            final_hidden(teacher, batch, logits=True)
        out["teacher_forward_s"] = time.perf_counter() - started
    stats, cache = WriteStats(), CacheSpec()
    started = time.perf_counter()
    tensors = shard_records(
        teacher, blocks, datamodule.collate, cache, datamodule.block_size, teacher.device, stats
    )
    out |= {"records_s": time.perf_counter() - started, "body_s": stats.forward_seconds}
    started = time.perf_counter()
    scored, mass = kept_mass(tensors)
    shard = Shard("train-00000", "train", 0, count)
    with tempfile.TemporaryDirectory() as directory:
        receipt = write_shard(Path(directory), shard, tensors, {"top_k_mass": mass})
    out |= {"write_s": time.perf_counter() - started, "bytes_per_scored": receipt["bytes"] / scored}
    with torch.no_grad():
        batch = datamodule.collate(blocks[:8])
        logits = final_hidden(teacher, batch, logits=True)[:, :-1]
        log_probs = torch.log_softmax(logits.float(), -1).flatten(0, 1)
    for k in (8, 16, 32, 64, 128):
        top = log_probs.topk(k, -1).values
        kept = top.exp().sum(-1)
        out[f"mass_k{k}"], out[f"mass_k{k}_p10"] = float(kept.mean()), float(kept.quantile(0.1))
        for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            out[f"{name}_error_k{k}"] = float((top.to(dtype).float() - top).abs().max())
    return out


if __name__ == "__main__":
    result = main(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
    Path("cache_measure.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
