"""How a streamed split divides among DDP ranks: whole shards, or every N-th row.

Whole shards (each file a shard) cost each rank only its own files, but a rank's share is then
its files' rows: with two files of 1,000 and 20 rows on two ranks, the rank of the short file
loops it fifty times while the other reads its file once, and every global batch is half the
short file — the data mixture changes without a word. So shards are split whole only where
the ranks' shares are known to be alike in size: the split's local files (one shard each),
whose bytes per rank differ by at most :data:`TOLERANCE`, or a saved folder (streamed in
equal shards). Otherwise each rank keeps every N-th row, which holds the mixture for any
files. A hub dataset, whose file sizes are not known here, keeps ``datasets``' own choice
(whole shards where their count divides), as its shards are written alike in size.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from lightning_kd.data.dataset_files import local_files

Strategy = Literal["auto", "shards", "examples"]
"""``datasets.distributed.split_dataset_by_node``'s ``strategy``."""

TOLERANCE = 0.05
"""The most by which one rank's share of a split's bytes may fall short of the largest share
for whole shards to be kept (a rank's passes then differ in length by as much)."""


def strategy_for(source, split: str, num_shards: int, world_size: int) -> Strategy:
    """How ``world_size`` ranks split ``split`` of ``source`` (a ``DatasetSource``) streamed in
    ``num_shards`` shards (see the module doc)."""
    if world_size == 1 or source.saved_folder():
        return "auto"
    files = split_files(source, split)
    if not files:
        return "examples" if Path(str(source.path)).expanduser().exists() else "auto"
    if len(files) != num_shards or num_shards % world_size:
        return "examples"
    return "shards" if alike([f.stat().st_size for f in files], world_size) else "examples"


def split_files(source, split: str) -> list[Path]:
    """The local files ``split`` is read from (``data_files[split]`` where they are given by
    split; all of them otherwise)."""
    data_files = source.data_files
    if isinstance(data_files, Mapping):
        data_files = data_files.get(split)
        if data_files is None:
            return []
    return local_files(source.path, data_files)


def alike(sizes: list[int], world_size: int) -> bool:
    """Whether each rank's whole shards (rank r: shards r, r + N, …, as ``datasets`` assigns
    them) come within :data:`TOLERANCE` of the largest share, in bytes."""
    shares = [sum(sizes[rank::world_size]) for rank in range(world_size)]
    return min(shares) >= (1 - TOLERANCE) * max(shares)


def share(dataset, rank: int, world_size: int, strategy: Strategy = "auto"):
    """Rank ``rank``'s share of a streamed ``dataset``, no row read by two ranks: whole shards
    or every ``world_size``-th row, as ``strategy`` says (``data.stream_shares``)."""
    if world_size == 1:
        return dataset
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(dataset, rank=rank, world_size=world_size, strategy=strategy)
