"""Rows read one by one into examples, knowing at every example where the next one starts.

:class:`Rows` encodes each row of a ``datasets.IterableDataset`` into a *piece* — a document's
tokens (a tensor) or a conversation's tokens and labels (anything with ``cut`` and ``join``) —
and marks it with ``datasets``' own state before the row (``IterableDataset.state_dict()``) and
the row's number. :class:`Packer` cuts the pieces into examples: joined end to end and cut into
blocks (packing), or each truncated to a block (padding). Its :meth:`Packer.position` — the mark
of the first row not wholly used yet, and how many of that row's tokens are — is all it takes to
start again at the very same example: load the state, skip that many tokens.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_kd.data.dataset_hints import unreadable_row
from lightning_kd.data.errors import DataError
from lightning_kd.data.reading import prompt_lines

Piece = Any
"""A row's encoding: a token tensor, or an object with ``cut(start, stop)`` and ``join``."""


@dataclass(frozen=True)
class Mark:
    """Before one row: its number in the share read, and ``datasets``' state there."""

    row: int = 0
    state: dict | None = None
    """``IterableDataset.state_dict()`` before the row; None: the share's start."""


def cut(piece: Piece, start: int, stop: int) -> Piece:
    return piece[start:stop] if isinstance(piece, Tensor) else piece.cut(start, stop)


def join(pieces: list[Piece]) -> Piece:
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat(pieces) if isinstance(pieces[0], Tensor) else type(pieces[0]).join(pieces)


class Rows:
    """The encoded rows of ``dataset`` from ``mark`` on, each with the mark before it.

    ``encode(row, where)`` gives ``(key, piece)`` — piece None to leave the row out — and a row
    whose key is in ``skip`` is left out too; each key read is added to ``keys`` (when given).
    """

    def __init__(
        self,
        dataset,
        mark: Mark,
        encode: Callable[[dict, str], tuple[str, Piece | None]],
        where: str,
        skip: frozenset[str] = frozenset(),
        keys: set[str] | None = None,
    ) -> None:
        if mark.state is not None:
            dataset.load_state_dict(mark.state)
        self.dataset, self.iterator, self.number = dataset, iter(dataset), mark.row
        self.encode, self.where, self.skip, self.keys = encode, where, skip, keys

    def mark(self) -> Mark:
        """Before the next row."""
        return Mark(self.number, self.dataset.state_dict())

    def __iter__(self) -> Iterator[tuple[Mark, Piece]]:
        return self

    def __next__(self) -> tuple[Mark, Piece]:
        while True:
            before = self.mark()
            try:
                row = next(self.iterator)  # StopIteration ends the share
            except (ValueError, OSError) as err:  # the files' fault: a traceback (probe 46)
                raise DataError(unreadable_row(f"{self.where} row {before.row}", err)) from None
            self.number += 1
            key, piece = self.encode(row, f"{self.where} row {before.row}")
            if self.keys is not None:
                self.keys.add(key)
            if piece is not None and key not in self.skip:
                return before, piece


STREAM_CUT = (
    "data.pack=false: streamed row {} is longer than data.block_size={} and is cut to it, as "
    "every longer row will be: the text past the cut is never trained on or scored (said for "
    "the first such row alone; read whole, the run counts them); raise data.block_size, or set "
    "data.pack=true"
)
"""Said once per stream where ``data.pack=false`` cuts a row (probe 46: silent)."""


class Packer:
    """Examples from :class:`Rows`: blocks of ``block_size`` cut from the pieces joined end to
    end (``pack``), or each piece truncated to ``block_size``; ``keep(example)`` leaves out the
    examples it refuses (a chat block without an answer token). ``offset`` tokens of the first
    row are taken already."""

    def __init__(
        self,
        rows: Rows,
        block_size: int,
        pack: bool,
        offset: int = 0,
        keep: Callable[[Piece], bool] = lambda example: True,
    ) -> None:
        self.rows, self.block_size, self.pack, self.keep = rows, block_size, pack, keep
        self.pending: deque[tuple[Mark, Piece]] = deque()
        self.offset = offset
        self.cut_said = False

    def position(self) -> tuple[Mark, int]:
        """Where the next example starts: a row's mark and the tokens of it taken already."""
        if self.pending:
            return self.pending[0][0], self.offset
        return self.rows.mark(), self.offset

    def take(self) -> Piece | None:
        """The next example kept, or None at the end of the rows."""
        while (example := self._next()) is not None:
            if self.keep(example):
                return example
        return None

    def _next(self) -> Piece | None:
        if not self.pack:
            _, piece = next(self.rows, (None, None))
            if piece is not None and len(piece) > self.block_size and not self.cut_said:
                self.cut_said = True  # once: a stream's count is known only at its end
                warnings.warn(
                    STREAM_CUT.format(self.rows.number - 1, self.block_size), stacklevel=3
                )
            return None if piece is None else cut(piece, 0, self.block_size)
        while sum(len(piece) for _, piece in self.pending) - self.offset < self.block_size:
            following = next(self.rows, None)
            if following is None:
                return None
            self.pending.append(following)
        end = self.offset + self.block_size
        example = cut(join([piece for _, piece in self.pending]), self.offset, end)
        while self.pending and len(self.pending[0][1]) <= end:
            end -= len(self.pending.popleft()[1])
        self.offset = end
        return example


def pack_blocks(token_lists: list[list[int]], block_size: int, eos_id: int) -> Tensor:
    """Join documents with ``eos_id``; cut into ``[n_blocks, block_size]`` (tail dropped)."""
    stream = [token for tokens in token_lists for token in (*tokens, eos_id)]
    count = len(stream) // block_size
    return torch.tensor(stream[: count * block_size], dtype=torch.long).view(count, block_size)


CORPUS = "the corpus"
"""What a refusal for too few examples names, where one corpus gives both splits."""
VAL = "data.val_files"
"""What a refusal for too few validation examples names, where they come from those files."""
TRAIN_SPLIT = "the training documents (those no validation text holds)"
"""What a refusal for too few training examples names, where validation is read apart."""
GENERATED = "the rows of data.files, which continue documents of data.val_files (generate's)"
"""The same, where ``data.files`` are ``generate``'s continuations of a split's documents: their
split settings are fixed (data.block_size among them), so more text is the only fix."""

MORE_TEXT = "add text (data.files or data.dataset) or lower data.block_size"
FIXES = {
    GENERATED: "generate more of them (lightning-kd generate with a larger generate.max_prompts, "
    "under this run's data settings: a lower data.block_size holds out other documents)",
}
"""How to get more examples, by what gave too few (else :data:`MORE_TEXT`; probe 36)."""


def training_source(files: list[Path]) -> str:
    """What the training documents of ``data.files`` are, said in a refusal for too few."""
    return GENERATED if prompt_lines(files) else TRAIN_SPLIT


def warn_cut(
    split: str, what: str, before: list[int], after: list[int], block_size: int, scored: str = ""
) -> None:
    """Warn, with the counts, where ``data.pack=false`` cut examples to ``data.block_size``:
    ``before`` and ``after`` each one's (``scored``: answer) tokens. The text past the cut is
    never trained on, which no figure of the run shows otherwise."""
    cut = sum(b > a for b, a in zip(before, after, strict=True))
    if not cut:
        return
    lost, total = sum(before) - sum(after), sum(before)
    unused = "scored" if split == "val" else "trained on"
    warnings.warn(
        f"data.pack=false: {cut} {split + ' ' if split else ''}{what}(s) of {len(before)} are "
        f"longer than data.block_size={block_size} and are cut to it: {lost} of {total} "
        f"{scored}tokens ({lost / total:.0%}) are never {unused}; raise data.block_size, or set "
        "data.pack=true",
        stacklevel=3,
    )


TAIL_SHARE = 0.01
"""The share of a split's tokens past its last whole block from which dropping it is said."""


def warn_tail(split: str, what: str, dropped: int, total: int, block_size: int) -> None:
    """Warn where ``data.pack=true`` leaves out more than :data:`TAIL_SHARE` of a split's
    ``total`` tokens: the ``dropped`` ones after its last whole block (the end of its last
    ``what``), never trained on; a small corpus lost whole documents so, unsaid (probe 46)."""
    if total == 0 or dropped / total < TAIL_SHARE:
        return
    unused = "scored" if split == "val" else "trained on"
    warnings.warn(
        f"data.pack=true: the last {dropped} of {total} tokens ({dropped / total:.0%}) of the "
        f"{split + ' ' if split else ''}{what} fill no block of data.block_size={block_size} and "
        f"are never {unused}; lower data.block_size, add data, or set data.pack=false",
        stacklevel=3,
    )


SHORT = (
    "data.pack=false: {} document(s) of {} are of one token, which predicts nothing alone, and "
    "are left out; set data.pack=true to train on them joined to the others"
)
"""Said where unpacked documents too short to predict anything are left out."""


def blocks_of(
    token_lists: list[list[int]],
    block_size: int,
    pack: bool,
    eos_id: int,
    needed: int,
    what: str = CORPUS,
) -> list[Tensor]:
    """Packed blocks (:func:`pack_blocks`), or each document of two tokens or more truncated to
    ``block_size``; refused when fewer than ``needed``, naming ``what`` gave too few (the corpus
    to split, or one split of it: ``the validation split``, ``the training split``)."""
    if pack:
        examples = list(pack_blocks(token_lists, block_size, eos_id))
        total = sum(len(tokens) + 1 for tokens in token_lists)
        warn_tail("", "documents", total - len(examples) * block_size, total, block_size)
    else:
        kept = [t for t in token_lists if len(t) >= 2]
        if short := len(token_lists) - len(kept):  # left out unsaid (probe 46)
            warnings.warn(SHORT.format(short, len(token_lists)), stacklevel=3)
        examples = [torch.tensor(t[:block_size]) for t in kept]
        lengths = [len(t) for t in kept]
        warn_cut("", "document", lengths, [min(n, block_size) for n in lengths], block_size)
    if len(examples) < needed:
        both = "one to train, one to validate" if needed > 1 else "one to train"
        purpose = both if what in (TRAIN_SPLIT, GENERATED, CORPUS) else "to validate"
        raise DataError(
            f"too few examples from {what}: {len(examples)} (of up to {block_size} tokens each; "
            f"{sum(len(t) for t in token_lists)} tokens in all), {needed} needed ({purpose}); "
            f"{FIXES.get(what, MORE_TEXT)}"
        )
    return examples
