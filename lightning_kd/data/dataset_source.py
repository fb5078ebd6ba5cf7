"""``data.dataset``: a corpus that Hugging Face ``datasets`` opens, read whole or streamed.

``path`` is what ``datasets.load_dataset`` takes — a builder reading ``data_files`` (``parquet``,
``json``, ``csv``, ``arrow``, ``text``), a folder of data files, a hub name (where the hub is
reachable) — or a folder written by ``save_to_disk`` (opened with ``load_from_disk``). Opening
it is refused, before any model loads, with the dataset, what is wrong and the fix: a name that
opens nothing here, a split it does not have (its splits named), a column it lacks (its columns
named), no rows. ``datasets`` is imported only when a dataset is read: runs on ``data.files``
never pay for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from lightning_kd.data.dataset_files import (
    builder_options,
    content_cache_dir,
    home,
    is_saved_folder,
    looks_empty,
)
from lightning_kd.data.dataset_hints import FILE_BUILDERS, open_hint, split_hint
from lightning_kd.data.errors import DataError
from lightning_kd.data.folder_splits import known_splits, say_unread_validation
from lightning_kd.data.saved_datasets import open_saved, saved_split_names, streamed
from lightning_kd.utils.refusal import Refused


@dataclass(frozen=True)
class DatasetSource:
    """Where ``data.dataset`` reads from; each field is a ``data.dataset.<field>`` key."""

    path: str | None = None
    """A ``datasets`` builder (``parquet``, ``json``, ``csv``, ``arrow``, ``text``) reading
    ``data_files``, a folder (of data files, or written by ``save_to_disk``), or a hub name;
    null: no dataset (``data.files`` is read)."""
    name: str | None = None
    """The dataset's configuration (its subset on the hub), where it has several."""
    data_files: Any = None
    """The files a builder reads: a path or glob, a list of them, or ``{split: files}``."""
    split: str = "train"
    """The split trained on."""
    val_split: str | None = None
    """A split to validate on; null: validation is held out of ``split`` (``docs/data.md``)."""

    @classmethod
    def of(cls, value: DatasetSource | Mapping[str, Any] | None) -> DatasetSource:
        """``value`` as a source (a mapping of the keys above, as the config gives it)."""
        if value is None or isinstance(value, DatasetSource):
            return value or cls()
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise DataError(f"data.dataset: unknown key(s) {unknown}; use {sorted(known)}")
        given = dict(value)  # ~ as data.files reads it (datasets looked for a folder named ~)
        return cls(**given | {k: home(given.get(k)) for k in ("path", "data_files") if k in given})

    @property
    def given(self) -> bool:
        """Whether a dataset is named at all."""
        return self.path is not None

    def describe(self, split: str | None = None) -> str:
        """``data.dataset 'parquet' (data_files …) split 'train'``: the dataset in messages."""
        text = f"data.dataset {self.path!r}"
        text += f" (name {self.name!r})" if self.name else ""
        text += f" (data_files {self.data_files!r})" if self.data_files is not None else ""
        return text + (f" split {split!r}" if split is not None else "")

    def saved_folder(self) -> bool:
        """Whether ``path`` is a folder written by ``save_to_disk``."""
        return is_saved_folder(self.path)


def setting_errors(
    source: DatasetSource,
    files: Any,
    streaming: bool,
    max_train_examples: int | None,
    num_workers: int,
) -> list[str]:
    """Data settings that cannot go together, each with the one to change."""
    errors = []
    if files is not None and not files:
        errors.append(
            "data.files is empty; list your files (data.files=[a.txt,'dir/*.jsonl']), or set "
            "data.files=null for the built-in corpus"
        )
    if source.given and files is not None:
        errors.append(
            f"data.dataset.path={source.path!r} and data.files={list(files)!r} both name the "
            "data: drop one (data.files=null to read the dataset, or data.dataset.path=null to "
            "read the files)"
        )
    if source.given and source.val_split == source.split:
        errors.append(
            f"data.dataset.val_split={source.val_split!r} is the split trained on; name another "
            "split, or set data.dataset.val_split=null to hold validation out of it"
        )
    if source.name is not None and source.path in FILE_BUILDERS:
        errors.append(
            f"data.dataset.name={source.name!r} with the {source.path} builder, which reads "
            "data.dataset.data_files and has no configurations (datasets ignores the name); "
            "drop data.dataset.name, or set data.dataset.path to the hub dataset it names"
        )
    if not streaming:
        return errors
    if not source.given:
        errors.append(
            "data.streaming=true reads a dataset row by row: set data.dataset.path (e.g. "
            "data.dataset.path=json data.dataset.data_files=big.jsonl), or data.streaming=false"
        )
    if max_train_examples is not None:
        errors.append(
            f"data.max_train_examples={max_train_examples} with data.streaming=true: a stream has "
            "no fixed training subset; set data.max_train_examples=null (trainer.max_steps "
            "ends the run)"
        )
    if num_workers:
        errors.append(
            f"data.num_workers={num_workers} with data.streaming=true: the stream is read in "
            "the training process, whose position each checkpoint saves; set data.num_workers=0"
        )
    return errors


def import_datasets():
    """The ``datasets`` package, or a refusal naming how to install it."""
    try:
        import datasets
    except ImportError:
        raise Refused(
            "data.dataset needs the datasets package, a dependency of lightning-kd that this "
            "environment lacks: pip install datasets"
        ) from None
    return datasets


def open_split(source: DatasetSource, split: str, streaming: bool):
    """The ``split`` of ``source``: a ``datasets.Dataset``, or an ``IterableDataset`` read row
    by row when ``streaming``; refused, naming the splits there are, when it has no such one.
    ``datasets``' own log of a file it cannot read is left out: the refusal names the file."""
    datasets = import_datasets()
    try:
        with datasets_errors_unlogged():
            return opened(datasets, source, split, streaming)
    except Refused:
        raise
    except Exception as err:  # datasets' own: not found, offline, unreadable, wrong builder
        if not str(err).startswith("Unknown split"):
            raise unopenable(source, split, err) from None
    raise Refused(split_error(source, split, open_split_names(source)))


def opened(datasets, source: DatasetSource, split: str, streaming: bool):
    """:func:`open_split`'s reading, its failures left to it to name."""
    if source.saved_folder():
        dataset = pick_split(
            open_saved(datasets, source.path, split, source.describe()), source, split
        )
        return streamed(dataset) if streaming else dataset
    options = {"name": source.name, "data_files": source.data_files}
    options |= builder_options(source.path, source.data_files)
    if (known := known_splits(source)) is not None:  # said here, once, streamed or not
        say_unread_validation(source, *known)
    if streaming:
        splits = datasets.load_dataset(source.path, streaming=True, **options)
        return pick_split(splits, source, split, said=known is not None)
    cache = datasets.config.HF_DATASETS_CACHE
    cache_dir = content_cache_dir(cache, source.path, source.data_files)
    return datasets.load_dataset(source.path, split=split, cache_dir=cache_dir, **options)


@contextmanager
def datasets_errors_unlogged() -> Iterator[None]:
    """``datasets`` logs a file its builder cannot read ("[ERROR] - Failed to load JSON from file
    ...", twice under Hydra's logging) before it raises; the refusal that follows names the file,
    its line and the fix, so its log is left out while a split opens and its first rows are
    read."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def open_split_names(source: DatasetSource) -> list[str]:
    """The split names ``source`` has (read without preparing any split)."""
    datasets = import_datasets()
    if source.saved_folder():
        return saved_split_names(source.path) or [
            str(datasets.load_from_disk(source.path).split or "train")
        ]
    options = {"name": source.name, "data_files": source.data_files}
    return list(datasets.load_dataset(source.path, streaming=True, **options))


def pick_split(splits: Mapping[str, Any], source: DatasetSource, split: str, said=False):
    """``split`` of ``splits``; where it is not said already (``said``), a validation split of
    the dataset's own that goes unread is said."""
    if split not in splits:
        raise Refused(split_error(source, split, list(splits)))
    if not said:
        say_unread_validation(source, list(splits))
    return splits[split]


def split_error(source: DatasetSource, split: str, splits: list[str]) -> str:
    key = "data.dataset.val_split" if split == source.val_split else "data.dataset.split"
    return (
        f"{key}={split!r}: {source.describe()} has no split {split!r}; its splits: {splits}; "
        f"set {key} to one of them{split_hint(split)}"
    )


def unopenable(source: DatasetSource, split: str, err: Exception):
    """The refusal of a dataset ``datasets`` could not open: empty, or its reason."""
    if looks_empty(source.path, source.data_files):
        return Refused(empty_error(source.describe(split)))
    if hint := open_hint(source, err):
        return Refused(hint)
    reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return Refused(
        f"{source.describe()} cannot be opened here ({type(err).__name__}: {reason}); set "
        "data.dataset.path to a builder reading data.dataset.data_files (parquet, json, csv, "
        "arrow, text), a folder (of data files, or save_to_disk's), or a hub name the hub "
        "can be reached for"
    )


def empty_error(where: str) -> str:
    return f"{where} is empty (no rows); point data.dataset at data (its split, data_files)"
