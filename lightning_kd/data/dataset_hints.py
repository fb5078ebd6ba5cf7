"""The fix for a ``data.dataset`` that cannot be opened, where its cause is a common one.

``datasets`` reports these common causes in its own terms, naming none of them: a glob that matches
no file (``StopIteration``), a data file given as the path (the hub was asked for it), a
``datasets`` cache it cannot write (``HF_DATASETS_CACHE`` read-only), and a split of ``datasets``'
slicing syntax.
"""

from __future__ import annotations

import errno
import glob
import zlib
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_kd.data.dataset_files import flatten, local_files, looks_empty
from lightning_kd.data.errors import DataError
from lightning_kd.data.reading import file_format, numbered_documents, read_records

SUFFIX_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
    ".arrow": "arrow",
}
"""The builder that reads a data file, by its suffix."""
FILE_BUILDERS = tuple(dict.fromkeys(SUFFIX_BUILDERS.values()))
"""The builders of ``datasets`` that read ``data_files``."""


def open_hint(source: Any, err: Exception) -> str | None:
    """Why ``source`` (a ``DatasetSource``) could not be opened, with the fix, where its cause
    is one of the module doc's; None otherwise."""
    if (line := bad_line(source)) is not None:
        return line
    if (empty := empty_split(source)) is not None:
        return empty
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
    if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.ENOTDIR):
        return (  # ENOTDIR: the cache is under a file (probe 48)
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


def bad_line(source: Any) -> str | None:
    """The first line of ``source``'s local JSON-lines or text files that cannot be read, named
    as ``data.files`` names it (a byte that is not UTF-8, a line that is no JSON object, a
    compressed file cut short); ``datasets`` named none, or read the bytes as text unchecked
    and failed on the row later, a traceback (probe 46). None where every file reads."""
    for path in local_files(source.path, source.data_files):
        kind = file_format(path)
        try:
            if kind == "jsonl":
                deque(read_records(path), maxlen=0)
            elif kind == "txt":
                deque(numbered_documents(path), maxlen=0)
            elif path.suffix == ".parquet":  # its footer: one cut short is no parquet (probe 52)
                import pyarrow.parquet as pq  # datasets' own dependency

                pq.read_metadata(path)
        except DataError as err:
            return str(err)
        except (EOFError, OSError, ValueError, zlib.error) as err:  # ValueError: ArrowInvalid
            return f"{path} cannot be read ({type(err).__name__}: {err}); check the file"
    return None


def unreadable(source: Any, where: str, err: Exception) -> DataError:
    """The refusal of rows ``datasets`` could not read from ``source``'s files: the line at
    fault, where a local file holds it (a byte that is not UTF-8, which its JSON reader keeps
    unchecked; a line cut short), else :func:`unreadable_row`'s."""
    return DataError(bad_line(source) or unreadable_row(where, err))


def unreadable_row(where: str, err: Exception) -> str:
    """Why the row at ``where`` could not be read from its files (``datasets``' error)."""
    if isinstance(err, UnicodeDecodeError):  # datasets' JSON reader keeps the bytes unchecked
        return (
            f"{where} holds bytes that are not UTF-8 ({err.reason}); re-encode its files as "
            "UTF-8 (e.g. iconv -t utf-8)"
        )
    return (
        f"{where} cannot be read ({type(err).__name__}: {err}); check its files there (a line "
        "cut short, a quote left open, or another format than its name's?)"
    )


def empty_split(source: Any) -> str | None:
    """A split of ``source``'s ``{split: files}`` whose files hold no row: ``datasets`` cannot
    open the dataset then, and the refusal blamed data.dataset.path (probe 46)."""
    if not isinstance(source.data_files, Mapping):
        return None
    for split, files in source.data_files.items():
        if looks_empty(source.path, {split: files}):
            return (
                f"{source.describe()}: split {split!r} ({files}) holds no row, which datasets "
                "cannot open; give it rows, or leave it out of data.dataset.data_files"
            )
    return None
