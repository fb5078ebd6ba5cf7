"""Data domains: which part of the corpus each teacher teaches (``data.domains``).

``data.domains`` names groups of the documents read whole, each document in exactly one:

- read from files, groups of ``data.files`` (and of ``data.val_files``, where validation has
  files of its own) — ``{code: ['src/*.jsonl'], prose: [books.txt]}``;
- read from ``data.dataset``, groups of the values of its column ``data.domain_field`` —
  ``{code: [python, rust], prose: [books]}`` with ``data.domain_field=source``.

Documents are packed within their domain (streamed: ``domain_packing.py``), so every block (and
every batch row) is one domain's, which the batch carries as ``domain`` (its index in the
mapping's order; −1 for the unscored rows that pad validation across ranks). A ``teachers``
entry with ``domains`` then teaches only those rows (``distill/teacher_domains.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_kd.data.errors import DataError
from lightning_kd.data.reading import EMBEDDED, expand_files
from lightning_kd.data.tokenized import rows, text_key

Labelled = tuple[str, list[int]]
"""A document's label — its file's name, or its ``data.domain_field`` value — and tokens."""


@dataclass(frozen=True)
class Domains:
    """The domain names, in order, and the domain of each label: a file's name (a path, or an
    embedded corpus's name) or, with ``column``, a value of that column of ``data.dataset``."""

    names: tuple[str, ...]
    of_label: dict[str, int]
    column: str | None = None

    @classmethod
    def of(
        cls, mapping: Mapping[str, Sequence[str]] | None, files: list[Path], read_as="data.files"
    ) -> Domains | None:
        """``data.domains`` checked against the files read (expanded; ``read_as``: the settings
        naming them, for the errors): None for none."""
        if not mapping:
            return None
        # Each file as data.files spells it: a domain may name it otherwise (relative against
        # absolute, a symlink), and was then told its files were in no domain (probe 39).
        spelled = {path.resolve(): place_of(path) for path in files}

        def places(name: str, patterns: list[str]):
            found = expand_files(patterns, f"data.domains.{name}")
            return (spelled.get(path.resolve(), place_of(path)) for path in found)

        of_label = labels_of(mapping, places)
        read = {place_of(path) for path in files}
        if lacking := sorted(read - set(of_label)):
            raise DataError(
                f"{read_as} {lacking} are in no domain of data.domains ({list(mapping)}): add "
                f"each to one, or remove it from {read_as}"
            )
        if unread := sorted(set(of_label) - read):
            raise DataError(
                f"data.domains lists {unread}, which {read_as} does not read: add them to "
                f"{read_as} or remove them from data.domains"
            )
        return cls(tuple(mapping), of_label)

    @classmethod
    def of_column(cls, mapping: Mapping[str, Sequence[str]], column: str) -> Domains:
        """``data.domains`` grouping the values of ``data.dataset``'s column ``column``."""
        return cls(tuple(mapping), labels_of(mapping, lambda _, values: map(cell, values)), column)

    def check_labels(self, seen: set[str | None], where: str) -> None:
        """Refuse rows of ``where`` whose ``column`` value is in no domain."""
        if lacking := sorted(seen - set(self.of_label), key=lambda label: (label is None, label)):
            null = " (null: a row without one; list null in a domain to take them)"
            raise DataError(
                f"{where}: rows whose {self.column!r} is {lacking[:5]} are in no domain of "
                f"data.domains ({list(self.names)}): add each value to one domain"
                + (null if None in lacking else "")
            )

    def examples(
        self,
        documents: list[Labelled],
        blocks_of: Callable[[list[list[int]]], list[Tensor]],
        every_domain: bool = True,
        needed: int = 1,
    ) -> tuple[list[Tensor], list[int]]:
        """Each domain's ``documents`` made into blocks on their own (``blocks_of``: packed or
        truncated), domain after domain; and each block's domain. ``every_domain``: a domain
        without text is refused (training needs each; a validation split may lack one);
        fewer than ``needed`` blocks in all, too."""
        examples: list[Tensor] = []
        tags: list[int] = []
        for index, name in enumerate(self.names):
            tokens = [ids for label, ids in documents if self.of_label[label] == index]
            if not tokens and not every_domain:
                continue
            if not tokens:
                raise DataError(
                    f"data.domains.{name} holds no text to train on: its documents are empty "
                    "or all held for validation"
                )
            blocks = blocks_of(tokens)
            examples += blocks
            tags += [index] * len(blocks)
        if len(examples) < needed:
            raise DataError(
                f"data.domains: the {'training' if every_domain else 'validation'} documents "
                f"give {len(examples)} example(s), each domain's made apart; {needed} needed: "
                "add text or lower data.block_size"
            )
        return examples, tags

    def of_row(self, row: dict, where: str) -> int:
        """The domain of a streamed ``row``, by its ``column`` value (refused in none)."""
        label = cell(row.get(self.column))
        if label not in self.of_label:
            self.check_labels({label}, where)
        return self.of_label[label]

    def indices(self, names: Sequence[str], where: str) -> frozenset[int]:
        """The indices of the domains ``names`` (refused, naming ``where``, if one is unknown)."""
        if unknown := [name for name in names if name not in self.names]:
            raise DataError(f"{where} names domains {unknown}; data.domains has {list(self.names)}")
        return frozenset(self.names.index(name) for name in names)


def labels_of(
    mapping: Mapping[str, Sequence[str]], expand: Callable[[str, list[str]], Any]
) -> dict[str, int]:
    """Each label ``expand`` makes of a domain's (name's) listed items, and its domain's index;
    an item listed in two domains is refused."""
    of_label: dict[str, int] = {}
    for index, (name, items) in enumerate(mapping.items()):
        if isinstance(items, str) or not items:
            raise DataError(
                f"data.domains.{name}={items!r}: list the domain's files (or, with "
                f"data.domain_field, values), e.g. data.domains={{{name}: ['docs/*.txt']}}"
            )
        for label in expand(name, list(items)):
            if label in of_label and of_label[label] != index:
                other = list(mapping)[of_label[label]]
                raise DataError(
                    f"{label} is in data.domains.{other} and data.domains.{name}: put each "
                    "in one domain"
                )
            of_label[label] = index
    return of_label


def domain_groups(
    mapping: Mapping[str, Sequence[str]] | None,
    files: list[Path],
    dataset: Any,
    streaming: bool,
    val_files: list[Path] | None,
    column: str | None = None,
) -> Domains | None:
    """``data.domains`` for a data module reading ``files`` and ``val_files``, or ``dataset``
    by its ``column`` (``data.domain_field``); None without it. A stream (``streaming``) reads a
    dataset, so groups a column's values."""
    if column is not None and not (mapping and dataset.given):
        raise DataError(
            f"data.domain_field={column!r} names the column of data.dataset whose values "
            "data.domains groups; set both with data.dataset, or unset data.domain_field"
        )
    if mapping and dataset.given and column is None:
        raise DataError(
            "data.domains with data.dataset groups the values of one of its columns: name it, "
            "e.g. data.domain_field=source"
        )
    if column is not None:
        return Domains.of_column(mapping, column)
    if val_files is None:
        return Domains.of(mapping, files)
    return Domains.of(mapping, files + val_files, "data.files and data.val_files")


def labelled_rows(
    found: list[tuple[str, list[int]]], dataset, domains: Domains | None, field: str, where: str
) -> list[tuple[str, Labelled]]:
    """``found`` (each distinct document's key and tokens, of ``dataset``'s ``field`` column)
    with each document labelled by its ``domains.column`` value, of the first row holding its
    text (repeats are kept once, as ``tokenized.split_documents`` keeps them); "" without one."""
    if domains is None or domains.column is None:
        return [(key, ("", tokens)) for key, tokens in found]
    labels: dict[str, str] = {}
    for row in rows(dataset.select_columns([field, domains.column])):
        text = row[field]
        if isinstance(text, str) and text.strip():
            labels.setdefault(text_key(text), cell(row[domains.column]))
    domains.check_labels(set(labels.values()), where)
    return [(key, (labels[key], tokens)) for key, tokens in found]


def cell(value: Any) -> str | None:
    """A ``data.domain_field`` cell as a label: its text (a number's too, as the command line
    spells a value), None for a null, which read as the text "None" (probe 46)."""
    return None if value is None else str(value)


def file_label(place: str) -> str:
    """The label of a document read at ``place`` (``file:line``): its file's name."""
    return place.rsplit(":", 1)[0]


def members(domains: Domains | None, labels: list[str]) -> list[list[int]]:
    """The indices of the documents of ``labels`` in each domain of ``domains``, in order;
    without domains, all of them in one group."""
    if domains is None:
        return [list(range(len(labels)))]
    of = [domains.of_label[label] for label in labels]
    return [[i for i, domain in enumerate(of) if domain == d] for d in range(len(domains.names))]


def place_of(path: Path) -> str:
    """How ``reading.distinct_documents`` names a file in its documents' places."""
    names = {path: name for name, path in EMBEDDED.items()}
    return str(names.get(path, path))
