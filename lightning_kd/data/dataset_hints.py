"""The fix for a ``data.dataset`` that cannot be opened, where its cause is a common one.

``datasets`` reports these common causes in its own terms, naming none of them: a glob that matches
no file (``StopIteration``), a data file given as the path (the hub was asked for it), a
``datasets`` cache it cannot write (``HF_DATASETS_CACHE`` read-only), and a split of ``datasets``'
slicing syntax.
"""

from __future__ import annotations

import errno
import glob
from pathlib import Path
from typing import Any

from lightning_kd.data.dataset_files import flatten

SUFFIX_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
    ".arrow": "arrow",
}
"""The builder that reads a data file, by its suffix."""
FILE_BUILDERS = tuple(dict.fromkeys(SUFFIX_BUILDERS.values()))
"""The builders of ``datasets`` that read ``data_files``."""


def open_hint(source: Any, err: Exception) -> str | None:
    """Why ``source`` (a ``DatasetSource``) could not be opened, with the fix, where its cause
    is one of the module doc's; None otherwise."""
    path = Path(str(source.path)).expanduser()
    if path.is_file():
        builder = SUFFIX_BUILDERS.get(path.suffix, "json")
        return (
            f"data.dataset.path={source.path} is a file; a file is read by a builder: "
            f"data.dataset.path={builder} data.dataset.data_files={source.path}"
        )
    base = path if path.is_dir() else Path()
    local = path.is_dir() or source.path in FILE_BUILDERS  # not a hub repository's files
    patterns = flatten(source.data_files) if local else []
    unmatched = [p for p in patterns if not glob.glob(str(base / p), recursive=True)]
    if unmatched:
        return (
            f"data.dataset.data_files {unmatched} match(es) no file here (relative to "
            f"{base.resolve()}); give existing files or a glob that matches some"
        )
    if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES):
        return (
            f"{source.describe()}: datasets cannot write its cache ({err.strerror}: "
            f"{err.filename}); set HF_DATASETS_CACHE to a directory you can write"
        )
    return None


def split_hint(split: str) -> str:
    """For a split in ``datasets``' slicing syntax (``train[:50]``, ``train+validation``): what
    the run takes instead; empty for any other name."""
    if "[" in split or "+" in split:
        return (
            " (slices and sums of splits are not read: name one split, and cap its rows with "
            "data.max_train_examples)"
        )
    return ""
