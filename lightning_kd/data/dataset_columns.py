"""What a split of a ``data.dataset`` must hold for the data module reading it: rows, and the
columns it reads (``data.text_field``; chat's ``data.messages_field``, or ``data.prompt_field``
and ``data.completion_field``), found at the first row, read whole or streamed."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from lightning_kd.data.conversations import is_conversation
from lightning_kd.data.dataset_hints import unreadable
from lightning_kd.data.dataset_source import (
    DatasetSource,
    datasets_errors_unlogged,
    empty_error,
    open_split,
)
from lightning_kd.utils.refusal import Refused


@dataclass(frozen=True)
class Columns:
    """The columns a data module reads: all of one of ``choices``, named by ``setting``."""

    choices: tuple[tuple[str, ...], ...]
    setting: str
    """The fix: the setting(s) that name them (``data.text_field``)."""

    def error(self, columns: list[str], where: str) -> str | None:
        """Why ``columns`` hold none of the choices (None when one is there)."""
        if any(all(column in columns for column in choice) for choice in self.choices):
            return None
        wanted = " nor ".join(" and ".join(repr(c) for c in choice) for choice in self.choices)
        lacks = f"no column {wanted}" if len(self.choices) == 1 else f"neither column {wanted}"
        return (
            f"{where} has {lacks}; its columns: {columns}; set {self.setting}{self.kind(columns)}"
        )

    def kind(self, columns: list[str]) -> str:
        """The other data module's columns, where ``columns`` are those: the fix is the module."""
        read = {column for choice in self.choices for column in choice}
        if is_conversation(dict.fromkeys(columns)) and "messages" not in read:
            return ", or read the conversations with data=chat"
        if "text" in columns and "text" not in read:
            if self.setting == "data.text_field":  # the text module already: name its column
                return "=text, the column of text there"
            return ", or read the texts with data=text (the default)"
        return ""


def split_errors(dataset, columns: Columns, where: str) -> list[str]:
    """A split without rows, or without the columns read (map-style or streamed)."""
    if hasattr(dataset, "__len__"):
        first = dataset[0] if len(dataset) else None
        names = list(dataset.column_names)
    else:
        rows = iter(dataset)
        first = next(rows, None)
        getattr(rows, "close", lambda: None)()  # datasets' generators hold files open
        names = list(dataset.column_names or (first or {}))
    if first is None:
        return [empty_error(where)]
    error = columns.error(names, where)
    return [error] if error else []


def read_errors(dataset, source: DatasetSource, split: str, columns: Columns) -> list[str]:
    """:func:`split_errors`, a file that cannot be read among them: the first row is read, and
    a file's fault (a line cut short, bytes that are not UTF-8) was a traceback (probes 46, 52)."""
    try:
        with datasets_errors_unlogged():
            return split_errors(dataset, columns, source.describe(split))
    except (ValueError, OSError, EOFError, zlib.error) as err:  # the file at fault: a .gz cut short
        return [str(unreadable(source, source.describe(split), err))]


def open_checked(source: DatasetSource, split: str, streaming: bool, columns: Columns):
    """:func:`open_split`, refused when the split has no rows or lacks ``columns``."""
    dataset = open_split(source, split, streaming)
    if errors := read_errors(dataset, source, split, columns):
        raise Refused("\n  ".join(errors))
    return dataset


def source_errors(source: DatasetSource, columns: Columns) -> list[str]:
    """Everything wrong with reading ``source`` for ``columns``, found by opening each split it
    reads (streamed: no split is prepared, nothing is tokenized). Where one split has the
    columns and the other lacks them, it is said that one setting reads both (probe 46)."""
    errors, whole = [], []
    for split in (source.split, source.val_split):
        if split is None:
            continue
        try:
            dataset = open_split(source, split, streaming=True)
        except Refused as err:
            errors.append(str(err))
            continue
        found = read_errors(dataset, source, split, columns)
        errors += found
        whole += [] if found else [split]
    if whole and errors:
        errors = [
            f"{error.rsplit('; set ', 1)[0]}; split {whole[0]!r} has them, and "
            f"{columns.setting} names them in both splits: rename the column in one to match "
            "(e.g. datasets' rename_column)"
            if " column " in error
            else error
            for error in errors
        ]
    return errors
