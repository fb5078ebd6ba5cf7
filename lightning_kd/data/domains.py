"""Data domains: which part of the corpus each teacher teaches (``data.domains``).

``data.domains`` names groups of ``data.files`` (and of ``data.val_files``, where validation has
files of its own) — ``{code: ['src/*.jsonl'], prose: [books.txt]}``, every file in exactly one
group. Documents are packed within their domain, so every block (and every batch row) is one
domain's, which the batch carries as ``domain`` (its index in the mapping's order; −1 for the
unscored rows that pad validation across ranks). A ``teachers`` entry with ``domains`` then
teaches only those rows (``distill/teacher_domains.py``).
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
    def of(
        cls, mapping: Mapping[str, Sequence[str]] | None, files: list[Path], read_as="data.files"
    ) -> Domains | None:
        """``data.domains`` checked against the files read (expanded; ``read_as``: the settings
        naming them, for the errors): None for none."""
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
                f"{read_as} {lacking} are in no domain of data.domains ({list(mapping)}): add "
                f"each to one, or remove it from {read_as}"
            )
        if unread := sorted(set(of_file) - read):
            raise ValueError(
                f"data.domains lists {unread}, which {read_as} does not read: add them to "
                f"{read_as} or remove them from data.domains"
            )
        return cls(tuple(mapping), of_file)

    def examples(
        self,
        documents: list[tuple[str, str]],
        tokenized: Callable[[list[str]], list[list[int]]],
        blocks_of: Callable[[list[list[int]]], list[Tensor]],
        every_domain: bool = True,
    ) -> tuple[list[Tensor], list[int]]:
        """Each domain's ``documents`` (``(file:line, text)``) tokenized and made into blocks on
        their own (``blocks_of``: packed or truncated), domain after domain; and each block's
        domain. ``every_domain``: a domain without text is refused (training needs each; a
        validation split may lack one)."""
        examples: list[Tensor] = []
        tags: list[int] = []
        for index, name in enumerate(self.names):
            texts = [text for place, text in documents if self.domain_of(place) == index]
            if not texts and not every_domain:
                continue
            if not texts:
                raise ValueError(
                    f"data.domains.{name} holds no text to train on: its files are empty or "
                    "are all validation files"
                )
            blocks = blocks_of(tokenized(texts))
            examples += blocks
            tags += [index] * len(blocks)
        if not every_domain and len(examples) < 2:
            raise ValueError(
                f"data.val_files gives {len(examples)} example(s) in its domains; 2 needed to "
                "draw a validation split: add text to data.val_files or lower data.block_size"
            )
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
    val_files: list[Path] | None,
) -> Domains | None:
    """``data.domains`` for a data module reading ``files`` and ``val_files`` (None without it);
    refused where the documents are not read whole from files."""
    if mapping and (dataset.given or streaming):
        raise ValueError(
            "data.domains groups files read whole (data.files, data.val_files); with "
            "data.dataset or data.streaming it is not supported yet: write each domain's "
            "documents to a .jsonl and list them in data.files"
        )
    if val_files is None:
        return Domains.of(mapping, files)
    return Domains.of(mapping, files + val_files, "data.files and data.val_files")


def place_of(path: Path) -> str:
    """How ``reading.distinct_documents`` names a file in its documents' places."""
    names = {path: name for name, path in EMBEDDED.items()}
    return str(names.get(path, path))


def members(domains: Domains | None, documents: list[tuple[str, str]]) -> list[list[int]]:
    """The indices of ``documents`` (``(file:line, text)``) in each domain of ``domains``, in
    order; without domains, all of them in one group."""
    if domains is None:
        return [list(range(len(documents)))]
    of = [domains.domain_of(place) for place, _ in documents]
    return [[i for i, domain in enumerate(of) if domain == d] for d in range(len(domains.names))]
