"""The local files a ``data.dataset`` reads: recorded (with their digests) in checkpoints and in
the tokenized cache's key, and looked at to tell an empty dataset from one ``datasets`` cannot
read (it fails on empty data in ways of its own: no features, no batch, no table)."""

from __future__ import annotations

import csv
import glob
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_kd.data.saved_datasets import saved_empty
from lightning_kd.models.cache_places import remembered_file_digest

SAVED_MARKERS = ("state.json", "dataset_dict.json")
"""Files ``save_to_disk`` writes at a dataset's (``state.json``) or a split dict's top."""


def is_saved_folder(path: str | None) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk``."""
    folder = Path(str(path)).expanduser()
    return folder.is_dir() and any((folder / name).is_file() for name in SAVED_MARKERS)


def local_files(path: str | None, data_files: Any) -> list[Path]:
    """The local files a dataset at ``path`` reads: its ``data_files`` (globs expanded, relative
    to a folder ``path``), or every file of a folder ``path``; none for a hub name or a saved
    folder (recorded by its fingerprint)."""
    base = Path(str(path)).expanduser()
    if is_saved_folder(path):
        return []
    patterns = flatten(data_files)
    if not patterns:
        return sorted(p for p in base.rglob("*") if is_data(p, base)) if base.is_dir() else []
    found: list[Path] = []
    for pattern in patterns:
        root = base if base.is_dir() and not Path(pattern).is_absolute() else Path()
        matches = sorted(glob.glob(str(root / pattern), recursive=True))
        found += [Path(m) for m in matches if Path(m).is_file()]
    return found


def content_cache_dir(datasets_cache: str | Path, path: str | None, data_files: Any) -> str | None:
    """Where ``datasets`` keeps the Arrow files it makes of ``path``'s local files: under
    ``datasets_cache``, in a folder named by their contents. ``datasets`` keys its own cache by
    each file's mtime, so an edit in place whose mtime was put back (``cp -p``, ``rsync -t``, a
    tar) was read from the old Arrow files, and trained on silently (probe 37). None where
    there is no local file (a hub name, a saved folder)."""
    files = local_files(path, data_files)
    if not files:
        return None
    digests = "".join(f"{file.resolve()}:{remembered_file_digest(file)}\n" for file in files)
    name = hashlib.sha256(digests.encode()).hexdigest()[:20]
    return str(Path(datasets_cache) / "lightning_kd_by_content" / name)


def is_data(path: Path, base: Path) -> bool:
    """A file under ``base``, not hidden there, not a lock."""
    hidden = any(part.startswith(".") for part in path.relative_to(base).parts)
    return path.is_file() and not hidden and path.suffix != ".lock"


def flatten(data_files: Any) -> list[str]:
    """``data_files`` (a string, a list, or ``{split: files}``) as one list of strings."""
    if data_files is None:
        return []
    if isinstance(data_files, str):
        return [] if "://" in data_files else [data_files]
    if isinstance(data_files, Mapping):
        return [name for value in data_files.values() for name in flatten(value)]
    return [str(name) for name in data_files if "://" not in str(name)]


def looks_empty(path: str | None, data_files: Any) -> bool:
    """Whether the local data of a dataset at ``path`` holds no row: a saved folder without data
    files, or files each empty (no byte, a parquet file of no row, a CSV file of a header)."""
    if is_saved_folder(path):
        return saved_empty(Path(str(path)).expanduser())
    files = local_files(path, data_files)
    return bool(files) and all(rows_at_most_one(path) for path in files)


def rows_at_most_one(path: Path) -> bool:
    """No row in ``path`` (a CSV header is no row)."""
    if path.stat().st_size == 0:
        return True
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # datasets' own dependency, loaded once a dataset is read

        try:
            return pq.ParquetFile(path).metadata.num_rows == 0
        except (OSError, ValueError):  # not a parquet file: named where datasets reads it
            return False
    if path.suffix in (".csv", ".tsv"):
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.strip()) <= 1
    return False


def csv_options(path: str | None, data_files: Any) -> dict[str, Any]:
    """``load_dataset`` options that read a CSV's cells as the text they are: pandas guesses
    each column's type per chunk of rows (a text cell ``1000`` came back an int, ``007`` a 7, an
    empty cell a null), and a CSV has no types to guess. Every column of its header is a
    string, an empty cell an empty string (a blank row, left out as in JSON lines). None for
    other builders, and for CSV files not on this machine (their header cannot be read).
    ``.tsv`` files are read with tabs, as ``datasets`` reads a folder of them: named to the
    ``csv`` builder, they were read with commas, and refused for a missing column (probe 46)."""
    files = local_files(path, data_files)
    suffixes = {file.suffix for file in files}
    if path != "csv" and not (files and suffixes <= {".csv", ".tsv"}):
        return {}
    sep = {"sep": "\t"} if suffixes == {".tsv"} else {}
    header = next((row for file in files[:1] for row in csv_rows(file, **sep)), None)
    if not header:
        return sep
    from datasets import Features, Value  # loaded once a dataset is read (module doc)

    features = Features(dict.fromkeys(header, Value("string")))
    return {"features": features, "na_filter": False} | sep


def text_options(path: str | None, data_files: Any) -> dict[str, Any]:
    """``load_dataset`` options that read each text file as one document, as ``data.files``
    reads it: ``datasets``' text builder makes a row of each line by default, so every line was
    a document ended with EOS, blank lines were dropped, and repeated lines were removed as
    duplicate documents (probe 46). None for other builders."""
    files = local_files(path, data_files)
    if path != "text" and not (files and all(file.suffix == ".txt" for file in files)):
        return {}
    return {"sample_by": "document"}


def builder_options(path: str | None, data_files: Any) -> dict[str, Any]:
    """``load_dataset`` options for the files at ``path``: :func:`csv_options`' and
    :func:`text_options`'."""
    return csv_options(path, data_files) | text_options(path, data_files)


def csv_rows(path: Path, sep: str = ",") -> Iterator[list[str]]:
    """The rows of the CSV file ``path`` (pandas' dialect: ``sep``, double quotes; a BOM
    dropped, as pandas drops it)."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as handle:
        yield from csv.reader(handle, delimiter=sep)


def home(value: Any) -> Any:
    """``value`` (a path, a list of them, ``{split: paths}``) with a leading ``~`` expanded."""
    if isinstance(value, str):
        return str(Path(value).expanduser()) if value.startswith("~") else value
    if isinstance(value, Mapping):
        return {key: home(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [home(item) for item in value]
    return value
