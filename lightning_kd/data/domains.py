"""Data domains: which part of the corpus each teacher teaches (``data.domains``).

``data.domains`` names groups of ``data.files`` — ``{code: ['src/*.jsonl'], prose: [books.txt]}``,
every file in exactly one group. Documents are packed within their domain, so every block (and
every batch row) is one domain's, which the batch carries as ``domain`` (its index in the
mapping's order; −1 for the unscored rows that pad validation across ranks). A ``teachers`` entry
with ``domains`` then teaches only those rows (``distill/teachers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_kd.data.reading import EMBEDDED, expand_files


@dataclass(frozen=True)
class Domains:
    """The domain names, in order, and the domain of each file (by the name its documents'
    places carry: a path, or an embedded corpus's name)."""

    names: tuple[str, ...]
    of_file: dict[str, int]

    @classmethod
    def of(cls, mapping: Mapping[str, Sequence[str]] | None, files: list[Path]) -> Domains | None:
        """``data.domains`` checked against ``data.files`` (expanded): None for none."""
        if not mapping:
            return None
        of_file: dict[str, int] = {}
        for index, (name, patterns) in enumerate(mapping.items()):
            if isinstance(patterns, str) or not patterns:
                raise ValueError(
                    f"data.domains.{name}={patterns!r}: list the domain's files, e.g. "
                    f"data.domains={{{name}: ['docs/*.txt']}}"
                )
            for path in expand_files(list(patterns)):
                place = place_of(path)
                if place in of_file and of_file[place] != index:
                    other = list(mapping)[of_file[place]]
                    raise ValueError(
                        f"{place} is in data.domains.{other} and data.domains.{name}: put each "
                        "file in one domain"
                    )
                of_file[place] = index
        read = {place_of(path) for path in files}
        if lacking := sorted(read - set(of_file)):
            raise ValueError(
                f"data.files {lacking} are in no domain of data.domains ({list(mapping)}): add "
                "each to one, or remove it from data.files"
            )
        if unread := sorted(set(of_file) - read):
            raise ValueError(
                f"data.domains lists {unread}, which data.files does not read: add them to "
                "data.files or remove them from data.domains"
            )
        return cls(tuple(mapping), of_file)

    def examples(
        self,
        documents: list[tuple[str, str]],
        tokenized: Callable[[list[str]], list[list[int]]],
        blocks_of: Callable[[list[list[int]]], list[Tensor]],
    ) -> tuple[list[Tensor], list[int]]:
        """Each domain's ``documents`` (``(file:line, text)``) tokenized and made into blocks on
        their own (``blocks_of``: packed or truncated), domain after domain; and each block's
        domain."""
        examples: list[Tensor] = []
        tags: list[int] = []
        for index, name in enumerate(self.names):
            texts = [text for place, text in documents if self.domain_of(place) == index]
            if not texts:
                raise ValueError(f"data.domains.{name} holds no text: its files are empty")
            blocks = blocks_of(tokenized(texts))
            examples += blocks
            tags += [index] * len(blocks)
        return examples, tags

    def domain_of(self, place: str) -> int:
        """The domain of a document read at ``place`` (``file:line``)."""
        return self.of_file[place.rsplit(":", 1)[0]]

    def indices(self, names: Sequence[str], where: str) -> frozenset[int]:
        """The indices of the domains ``names`` (refused, naming ``where``, if one is unknown)."""
        if unknown := [name for name in names if name not in self.names]:
            raise ValueError(
                f"{where} names domains {unknown}; data.domains has {list(self.names)}"
            )
        return frozenset(self.names.index(name) for name in names)


def domain_groups(
    mapping: Mapping[str, Sequence[str]] | None,
    files: list[Path],
    dataset: Any,
    streaming: bool,
    val_files: Any,
) -> Domains | None:
    """``data.domains`` for a data module reading ``files`` (None without it); refused where the
    documents are not read whole from ``data.files``."""
    if mapping and (dataset.given or streaming or val_files is not None):
        raise ValueError(
            "data.domains groups data.files read whole; with data.dataset, data.streaming or "
            "data.val_files it is not supported yet: list the domains' files in data.files"
        )
    return Domains.of(mapping, files)


def place_of(path: Path) -> str:
    """How ``reading.distinct_documents`` names a file in its documents' places."""
    names = {path: name for name, path in EMBEDDED.items()}
    return str(names.get(path, path))
