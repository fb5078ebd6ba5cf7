"""A folder ``data.dataset.path`` whose files ``datasets`` gives to splits by their names.

``load_dataset(folder)`` reads a file whose name holds ``train``, ``dev``, ``validation`` or
``test`` (``train_2023.jsonl``, ``dev.jsonl``) into that split, and once any name does, a file
whose name holds none (``misc.jsonl``) into no split at all: it was never read, without a word,
and a folder of ``notes.jsonl`` beside ``test_cases.jsonl`` offered its ``test`` split alone
(probe 46). Such a folder is refused, naming the files no split reads and the builder that reads
them all; a folder whose named validation split is left unused is said with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_kd.data.dataset_files import is_saved_folder, local_files
from lightning_kd.data.dataset_hints import SUFFIX_BUILDERS
from lightning_kd.utils.refusal import Refused


def named_splits(folder: Path) -> dict[str, list[Path]]:
    """The files of ``folder`` ``datasets`` reads into each split (resolved paths)."""
    from datasets.data_files import DataFilesDict, get_data_patterns  # read when a dataset is

    found = DataFilesDict.from_patterns(get_data_patterns(str(folder)), base_path=str(folder))
    return {str(split): sorted(Path(f).resolve() for f in files) for split, files in found.items()}


def check_folder_splits(source: Any) -> dict[str, list[Path]] | None:
    """Refuse a folder ``source.path`` (a ``DatasetSource`` read without ``data_files``) some of
    whose data files no split reads; its files by split (None: no such folder, or ``datasets``
    cannot say, which it says when it opens the folder)."""
    folder = Path(str(source.path)).expanduser()
    if source.data_files is not None or not folder.is_dir() or is_saved_folder(source.path):
        return None
    try:
        splits = named_splits(folder)
    except Exception:  # datasets' own failure, said with the fix where the folder is opened
        return None
    read = {file for files in splits.values() for file in files}
    if mixed := mixed_formats(read):
        raise Refused(mixed_message(source.path, mixed))
    kinds = {file.suffix for file in read}
    unread = [f for f in local_files(source.path, None) if f.suffix in kinds]
    unread = [file for file in unread if file.resolve() not in read]
    if unread:
        raise Refused(unread_message(source.path, splits, unread))
    return splits


def mixed_formats(files: set[Path]) -> dict[str, list[Path]]:
    """``files`` by the builder that reads them, where more than one builder would: ``datasets``
    reads a folder with one, its commonest format's, and the others' files go unread without a
    word (a folder of a.jsonl, b.txt and c.csv trained on a.jsonl alone: probe 52)."""
    by_builder: dict[str, list[Path]] = {}
    for file in sorted(files):
        if (builder := SUFFIX_BUILDERS.get(file.suffix)) is not None:
            by_builder.setdefault(builder, []).append(file)
    return by_builder if len(by_builder) > 1 else {}


def mixed_message(path: str, by_builder: dict[str, list[Path]]) -> str:
    kinds = "; ".join(
        f"{builder}: {', '.join(file.name for file in files[:3])}{' …' if len(files) > 3 else ''}"
        for builder, files in by_builder.items()
    )
    return (
        f"data.dataset.path={path} holds files of {len(by_builder)} formats ({kinds}): datasets "
        "reads a folder with one builder, its commonest format's, and leaves the other files "
        "unread; give each format a folder of its own and read one, convert the files to one "
        "format, or name one format's files: data.dataset.path=<builder> "
        f"'data.dataset.data_files={path}/*<suffix>'"
    )


def known_splits(source: Any) -> tuple[list[str], str] | None:
    """The splits ``source`` names before it opens, and how: a folder's by its files' names
    (a file no split reads refused), a ``{split: files}``'s keys; None where only opening says."""
    if (by_names := check_folder_splits(source)) is not None:
        return list(by_names), f" (by their names: {named(by_names)})"
    if isinstance(source.data_files, Mapping):
        return list(source.data_files), ""
    return None


def unread_message(path: str, splits: dict[str, list[Path]], unread: list[Path]) -> str:
    suffix = unread[0].suffix
    builder = SUFFIX_BUILDERS.get(suffix, "json")
    return (
        f"data.dataset.path={path}: datasets gives a folder's files to splits by their names "
        f"({named(splits)}) and reads {len(unread)} file(s) into none: "
        f"{', '.join(file.name for file in unread[:5])}{' …' if len(unread) > 5 else ''}; read "
        f"them all with data.dataset.path={builder} 'data.dataset.data_files={path}/*{suffix}' "
        "(validation held out of them), or give the splits their files: "
        "data.dataset.data_files={train: [...], validation: [...]}"
    )


VALIDATION = ("validation", "valid", "val", "dev", "eval")
"""Split names a dataset gives its validation data (``test`` is not offered: it is held out)."""


def say_unread_validation(source: Any, names: list[str], how: str = "") -> None:
    """Warn where ``source`` (read without ``data.dataset.val_split``) has a validation split
    of its own, which goes unread while validation is held out of the training split: its
    own was unused without a word (probe 46). ``how``: how its splits were found."""
    own = [name for name in names if name in VALIDATION and name != source.split]
    if source.val_split is None and own:
        warnings.warn(
            f"{source.describe()} has a split {own[0]!r}{how}, which goes unread: validation "
            f"is held out of data.dataset.split={source.split}; set "
            f"data.dataset.val_split={own[0]} to validate on it",
            stacklevel=3,
        )


def named(splits: dict[str, list[Path]]) -> str:
    """``train: a.jsonl, b.jsonl; validation: dev.jsonl``."""
    files = {name: ", ".join(file.name for file in found) for name, found in splits.items()}
    return "; ".join(f"{name}: {names}" for name, names in files.items())
