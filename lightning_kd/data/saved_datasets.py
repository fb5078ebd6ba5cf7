"""A ``data.dataset.path`` folder written by ``save_to_disk``: opened a split at a time.

``load_from_disk`` opens a saved split dict whole, and cannot open one holding a split saved
with no row (``IndexError: list index out of range``, from a split folder of no shard): the
refusal blamed ``data.dataset.path`` (probe 46), though the split the run reads was whole. Here
only the split read is opened, and a split of no row is named when it is the one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_kd.utils.refusal import Refused

STREAM_SHARDS = 64
"""Shards a saved folder is streamed in: whole shards divide among 1, 2, 4 … 64 ranks."""


def saved_split_names(path: Any) -> list[str] | None:
    """The splits of a saved split dict at ``path`` (``dataset_dict.json``'s), None for a saved
    dataset of one split."""
    index = Path(str(path)).expanduser() / "dataset_dict.json"
    return json.loads(index.read_text())["splits"] if index.is_file() else None


def open_saved(datasets, path: Any, split: str, describe: str) -> Mapping[str, Any]:
    """The saved dataset at ``path`` as ``{split name: dataset}``: a split dict's ``split``
    opened alone (the others that hold rows stand as None, named for a refusal or the unread
    validation split's warning), or the one dataset under its own split's name (else train).
    A ``split`` saved with no row is refused."""
    folder = Path(str(path)).expanduser()
    names = saved_split_names(folder)
    if names is None:
        loaded = datasets.load_from_disk(str(folder))
        return {str(loaded.split or "train"): loaded}
    if split in names and saved_empty(folder / split):
        raise Refused(
            f"{describe}: split {split!r} was saved with no row ({folder / split}), which "
            "datasets cannot open; save it with rows, or read another split "
            "(data.dataset.split, data.dataset.val_split)"
        )
    opened = {split: datasets.load_from_disk(str(folder / split))} if split in names else {}
    return {name: opened.get(name) for name in names if not saved_empty(folder / name)}


def saved_empty(folder: Path) -> bool:
    """Whether the split ``save_to_disk`` wrote in ``folder`` holds no row (no data file)."""
    state = folder / "state.json"
    return state.is_file() and not json.loads(state.read_text()).get("_data_files")


def streamed(dataset):
    """``dataset`` (a saved split) streamed in :data:`STREAM_SHARDS` shards."""
    return dataset.to_iterable_dataset(num_shards=max(1, min(STREAM_SHARDS, len(dataset))))
