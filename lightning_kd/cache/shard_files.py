"""A cache's shard files on disk: each written whole (to a temporary name, then moved into place)
with a receipt of its size and sha256 beside it, and found whole again by that receipt — what
lets a killed writer resume with the shards it completed (``cache/format.py`` lays them out)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from lightning_kd.cache.format import Shard
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.files import file_digest

sha256_file = file_digest
"""sha256 of a shard's bytes (the receipt's checksum)."""


WRITE_AGAIN = "run the same command again (the shards already written whole are kept)"
"""What follows a cache file the disk had no room for: the writer resumes from whole shards."""


def write_json(path: Path, value: dict[str, Any]) -> None:
    text = json.dumps(value, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(path, text.encode(), WRITE_AGAIN)


def write_shard(
    directory: Path, shard: Shard, tensors: dict[str, Tensor], extra: dict[str, Any]
) -> dict[str, Any]:
    """Write one shard, then its receipt (size, sha256 and ``extra``); returns the receipt."""
    data = safetensors_bytes({name: t.contiguous() for name, t in tensors.items()})
    atomic_write_bytes(directory / shard.file, data, WRITE_AGAIN)
    receipt = (
        dataclasses.asdict(shard)
        | {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        | extra
    )
    write_json(directory / shard.receipt, receipt)
    return receipt


def completed(directory: Path, shard: Shard) -> dict[str, Any] | None:
    """The receipt of ``shard`` if the shard is on disk whole (size and sha256 as receipted)."""
    receipt_path, path = directory / shard.receipt, directory / shard.file
    if not receipt_path.is_file() or not path.is_file():
        return None
    try:
        receipt = json.loads(receipt_path.read_text())
    except json.JSONDecodeError:
        return None
    if {k: receipt.get(k) for k in ("name", "split", "start", "blocks")} != dataclasses.asdict(
        shard
    ):
        return None
    if path.stat().st_size != receipt.get("bytes") or sha256_file(path) != receipt.get("sha256"):
        return None
    return receipt


def kept_mass(tensors: dict[str, Tensor]) -> tuple[int, float]:
    """``(scored positions, Σ over them of the mass the top k hold)`` of one shard."""
    positions = tensors["tail"].shape[1]
    scored = torch.arange(positions) < (tensors["lengths"] - 1).unsqueeze(-1)
    if "aligned" in tensors:  # cross-tokenizer: only aligned positions hold records
        scored = tensors["aligned"].bool()
    mass = -torch.expm1(tensors["tail"].double())[scored]
    return int(scored.sum()), float(mass.sum())


@dataclass
class WriteStats:
    """Where one rank's writing time went, and how much mass the top k held."""

    tokens: int = 0
    forward_seconds: float = 0.0
    top_k_seconds: float = 0.0
    write_seconds: float = 0.0
    shards_written: int = 0
    shards_kept: int = 0
    bytes_written: int = 0
    cross: bool = False
    """A teacher of another tokenizer: its alignment, forward and top k are timed as one."""

    def line(self, rank: int) -> str:
        total = self.forward_seconds + self.top_k_seconds + self.write_seconds
        rate = self.tokens / total if total else 0.0
        teacher = f"teacher forward {self.forward_seconds:.1f} s, top-k {self.top_k_seconds:.1f} s"
        if self.cross:  # one pass of the cross-tokenizer path (distill/cross_tokenizer.py)
            teacher = f"teacher alignment, forward and top-k {self.forward_seconds:.1f} s"
        return (
            f"cache rank {rank}: {self.shards_written} shards written, {self.shards_kept} kept "
            f"from an earlier run; {self.tokens} tokens in {total:.1f} s ({rate:.0f} tok/s): "
            f"{teacher}, writing {self.write_seconds:.1f} s"
        )
