"""A stream's rows packed domain by domain (``data.domains`` with ``data.streaming=true``).

Read whole, each domain's documents are packed on their own (``domains.py``); streamed, the rows
of all domains come interleaved. :class:`DomainPacker` keeps one open block per domain: a row's
tokens join its domain's pending tokens, and a domain that fills a block gives it at once —
so every example is one domain's (:class:`DomainBlock`), each domain's examples hold its rows in
stream order, and at most one domain (the last row's) ever has a whole block pending.

Where it stands (:meth:`DomainPacker.position`) is the mark of the earliest row still pending in
any domain; the number of the first row not read yet (``read``); and, per domain with pending
tokens, its first pending row and the tokens of that row used already. From that a packer
starts again at the very same example: it reads on from the mark and leaves out each row read
before ``read`` that its domain has used up — every row of a domain without pending tokens,
and the rows of the others before their first pending row. A rare domain keeps the mark back,
so a resume may read again every row since that domain's open block began.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_kd.data.packing import Mark, Rows


@dataclass(frozen=True)
class DomainBlock:
    """A streamed row's tokens, or an example cut from them, and their domain's index."""

    tokens: Tensor
    domain: int

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class OpenBlocks:
    """The part of a position :class:`~lightning_kd.data.packing.Mark` does not hold."""

    read: int | None = None
    """The number of the first row not read; None: the mark's row (nothing read beyond it)."""
    first: tuple[tuple[int, int, int], ...] = ()
    """Per domain with pending tokens: ``(domain, its first pending row, tokens of it used)``."""

    def as_list(self) -> list[Any]:
        """Plain values, for a checkpoint read with ``weights_only=True``."""
        return [self.read, [list(entry) for entry in self.first]]

    @classmethod
    def from_list(cls, values: list[Any]) -> OpenBlocks:
        read, first = values
        return cls(read, tuple(tuple(entry) for entry in first))


class DomainPacker:
    """Blocks of ``block_size`` of one domain each from :class:`Rows` of
    :class:`DomainBlock` pieces (``pack``), or each row truncated to ``block_size``; started
    at ``opened`` (``OpenBlocks()``: the rows' start). Same interface as ``packing.Packer``,
    with :class:`OpenBlocks` for its offset."""

    def __init__(self, rows: Rows, block_size: int, pack: bool, opened: OpenBlocks) -> None:
        self.rows, self.block_size, self.pack = rows, block_size, pack
        self.pending: dict[int, deque[tuple[Mark, Tensor]]] = {}
        self.offsets: dict[int, int] = {}
        self.read = opened.read if opened.read is not None else rows.number
        self.opened = {domain: (row, used) for domain, row, used in opened.first}
        self.unreached = set(self.opened)  # resumed domains whose first row is not read again
        self.resumed: dict[int, int] = {}  # tokens used of a resumed domain's first row

    def position(self) -> tuple[Mark, OpenBlocks]:
        """Where the next example starts (the module doc)."""
        firsts = [queue[0][0] for queue in self.pending.values() if queue]
        if self.unreached or not firsts:
            firsts.append(self.rows.mark())
        mark = min(firsts, key=lambda before: before.row)
        pending = [(d, queue[0][0].row) for d, queue in self.pending.items() if queue]
        first = [(d, row, self.offsets[d]) for d, row in pending]
        first += [(d, *self.opened[d]) for d in self.unreached]
        return mark, OpenBlocks(max(self.read, self.rows.number), tuple(sorted(first)))

    def take(self) -> DomainBlock | None:
        """The next example, or None at the end of the rows (each domain's partial block is
        left out, as the tail of a corpus read whole is)."""
        while (full := self.full()) is None:
            if (row := self.next_row()) is None:
                return None
            if not self.pack:
                return DomainBlock(row.tokens[: self.block_size], row.domain)
        return self.cut(full)

    def full(self) -> int | None:
        """The domain with a whole block pending, if one has."""
        for domain, queue in self.pending.items():
            if sum(len(tokens) for _, tokens in queue) - self.offsets[domain] >= self.block_size:
                return domain
        return None

    def next_row(self) -> DomainBlock | None:
        """The next row not used up already (packed: queued in its domain), or None at the end."""
        for mark, piece in self.rows:
            if self.used_up(mark.row, piece.domain):
                continue
            if self.pack:
                queue = self.pending.setdefault(piece.domain, deque())
                if not queue:
                    self.offsets[piece.domain] = self.resumed.pop(piece.domain, 0)
                queue.append((mark, piece.tokens))
            return piece
        return None

    def used_up(self, row: int, domain: int) -> bool:
        """Whether a row read again on a resume was used before the position started from."""
        if row >= self.read:
            return False
        if domain not in self.opened:
            return True  # its domain had no open block: every row of it read was used
        first, used = self.opened[domain]
        if row < first:
            return True
        if row == first:
            self.unreached.discard(domain)
            self.resumed[domain] = used
        return False

    def cut(self, domain: int) -> DomainBlock:
        """``domain``'s next block, its rows used up dropped from the queue."""
        queue, start = self.pending[domain], self.offsets[domain]
        end, taken = start + self.block_size, []
        for _, tokens in queue:
            taken.append(tokens)
            if sum(map(len, taken)) >= end:
                break
        example = (taken[0] if len(taken) == 1 else torch.cat(taken))[start:end]
        while queue and len(queue[0][1]) <= end:
            end -= len(queue.popleft()[1])
        self.offsets[domain] = end
        return DomainBlock(example, domain)


def unzipped(examples: list) -> tuple[list, list[int] | None]:
    """``examples``' tokens and, for ``DomainBlock``s, their domains apart (as examples read
    whole keep them; None for examples of no domain)."""
    if not examples or not isinstance(examples[0], DomainBlock):
        return examples, None
    return [example.tokens for example in examples], [example.domain for example in examples]
