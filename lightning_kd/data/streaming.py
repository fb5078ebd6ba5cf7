"""Streamed data (``data.streaming=true``): a corpus read row by row, never whole in memory.

Validation is held out first, the same on every rank: the first ``data.val_size`` examples of
the split (or of ``data.dataset.val_split``), and every row they were cut from — or, for chat,
every conversation sharing a prompt with them — is left out of training (:func:`held_out`).

Training (:class:`StreamedBatches`): each process reads its own share of the split (whole shards
where the ranks' shares are alike in size, else every N-th row: ``stream_shares``), so no two
ranks read one row. Its examples are shuffled within
consecutive windows of ``data.shuffle_buffer`` examples, by a permutation seeded by the seed, the
pass and the window's number. At the end of its share a process reads it again (the next pass):
the stream is endless, no rank runs out of batches before another, ``trainer.max_steps`` ends it.

Where a stream stands is a :class:`Cursor`: the pass, the window, where the window starts (a row's
:class:`~lightning_kd.data.packing.Mark` and the tokens of that row packed already) and the
batches of the window trained on. Each batch comes with the cursor after it; a resumed run reads
its window again from the start (at most ``shuffle_buffer`` examples: not a replay of the run),
skips the batches trained and goes on with exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from lightning_kd.data.dataset_columns import Columns, open_checked
from lightning_kd.data.dataset_source import DatasetSource, open_split
from lightning_kd.data.domain_packing import DomainPacker, OpenBlocks
from lightning_kd.data.errors import DataError
from lightning_kd.data.packing import Mark, Packer, Piece, Rows
from lightning_kd.data.stream_cursor import CURSOR, Cursor
from lightning_kd.data.stream_shares import Strategy, share, strategy_for


@dataclass(frozen=True)
class Layout:
    """How rows become batches: packing or truncation to ``block_size``, the batch size, the
    shuffle window (examples) and the seed; ``keep`` refuses examples (a chat block without an
    answer token)."""

    block_size: int
    pack: bool
    batch_size: int
    window: int
    seed: int
    keep: Callable[[Piece], bool] = lambda example: True
    by_domain: bool = False
    """Pieces are ``DomainBlock``s, packed domain by domain (``domain_packing``)."""
    size_fix: str = "lower data.block_size"
    """What gives more examples: a smaller block for text; for chat, a larger one (an answer
    that starts past the block is left out)."""

    @classmethod
    def of(cls, shuffle_buffer: int, batch_size: int, **rest: Any) -> Layout:
        """A window of ``shuffle_buffer`` examples rounded down to whole batches (one at least),
        so that no batch straddles two windows."""
        window = max(1, shuffle_buffer // batch_size) * batch_size
        return cls(batch_size=batch_size, window=window, **rest)


def window_order(count: int, layout: Layout, passes: int, window: int) -> list[int]:
    """The order of a window's ``count`` examples: seeded by the seed, the pass and the window
    (kept as read when the window is one batch, ``shuffle_buffer`` ≤ the batch size)."""
    if layout.window <= layout.batch_size:
        return list(range(count))
    seed = hashlib.sha256(f"{layout.seed}:{passes}:{window}".encode()).digest()[:8]
    generator = torch.Generator().manual_seed(int.from_bytes(seed, "little"))
    return torch.randperm(count, generator=generator).tolist()


def packer_at(rows: Rows, layout: Layout, cursor: Cursor | None = None) -> Packer | DomainPacker:
    """The packer of ``layout`` over ``rows``, started where ``cursor`` (None: the rows' start)
    says the rows' first example begins."""
    cursor = cursor or Cursor()
    if layout.by_domain:
        opened = OpenBlocks.from_list(cursor.opened) if cursor.opened else OpenBlocks()
        return DomainPacker(rows, layout.block_size, layout.pack, opened)
    return Packer(rows, layout.block_size, layout.pack, cursor.offset, layout.keep)


def cursor_at(passes: int, window: int, position: tuple, batches: int) -> Cursor:
    """The cursor of a packer's ``position`` (``(mark, offset)`` or ``(mark, OpenBlocks)``)."""
    mark, offset = position
    if isinstance(offset, OpenBlocks):
        return Cursor(passes, window, mark, 0, batches, offset.as_list())
    return Cursor(passes, window, mark, offset, batches)


def take(packer: Packer | DomainPacker, count: int) -> list[Piece]:
    """Up to ``count`` examples from ``packer`` (fewer at the end of its rows)."""
    examples = []
    while len(examples) < count and (example := packer.take()) is not None:
        examples.append(example)
    return examples


def held_out(
    dataset, encode, layout: Layout, count: int, where: str
) -> tuple[list[Piece], frozenset[str]]:
    """The first ``count`` examples of ``dataset`` (a whole split, not a rank's share) and the
    keys of every row read for them, which training leaves out."""
    keys: set[str] = set()
    examples = first_of(Rows(dataset, Mark(), encode, where, keys=keys), layout, count)
    return examples, frozenset(keys)


def first_of(rows: Rows, layout: Layout, count: int) -> list[Piece]:
    """The first ``count`` examples ``layout`` makes of ``rows`` (fewer at their end)."""
    try:
        return take(packer_at(rows, layout), count)
    finally:
        close(rows)


def close(rows: Rows) -> None:
    """Stop reading (``datasets``' generators hold files open until closed)."""
    getattr(rows.iterator, "close", lambda: None)()


class StreamedBatches(IterableDataset):
    """Batches of one process's share of a split, without end (see the module doc), each as
    ``(examples, cursor after it)``, from the cursor ``start()`` gives when iteration begins;
    ``open_share()`` opens the share afresh (once per pass); ``encode`` and ``skip`` are as for
    :class:`~lightning_kd.data.packing.Rows`."""

    def __init__(
        self,
        open_share: Callable[[], Any],
        encode: Callable[[dict, str], tuple[str, Piece | None]],
        layout: Layout,
        start: Callable[[], Cursor],
        skip: frozenset[str],
        where: str,
    ) -> None:
        self.open_share, self.encode, self.layout = open_share, encode, layout
        self.start, self.skip, self.where = start, skip, where

    def __iter__(self) -> Iterator[tuple[list[Piece], Cursor]]:
        cursor = self.start()
        while True:
            fresh = cursor == Cursor(passes=cursor.passes)
            given = 0
            for given, item in enumerate(self.one_pass(cursor), start=1):  # noqa: B007
                yield item
            if fresh and not given:
                raise self.no_batch()
            cursor = Cursor(passes=cursor.passes + 1)

    def first(self, count: int) -> list[Piece]:
        """The share's first ``count`` examples (fewer at its end), as read."""
        rows = Rows(self.open_share(), Mark(), self.encode, self.where, self.skip)
        return first_of(rows, self.layout, count)

    def check(self) -> None:
        """Refuse a share without a batch, reading a batch's examples of it at most."""
        if len(self.first(self.layout.batch_size)) < self.layout.batch_size:
            raise self.no_batch()

    def no_batch(self) -> DataError:
        return DataError(
            f"{self.where}: this process's share gives no batch of data.batch_size="
            f"{self.layout.batch_size} (after validation's rows are left out); add rows, "
            f"lower data.val_size, {self.layout.size_fix}, or use fewer processes"
        )

    def one_pass(self, cursor: Cursor) -> Iterator[tuple[list[Piece], Cursor]]:
        """The batches of one pass over the share, from ``cursor`` to the share's end."""
        layout, size = self.layout, self.layout.batch_size
        rows = Rows(self.open_share(), cursor.mark, self.encode, self.where, self.skip)
        packer = packer_at(rows, layout, cursor)
        window, done = cursor.window, cursor.batches
        try:
            while True:
                position = packer.position()
                examples = take(packer, layout.window)
                order = window_order(len(examples), layout, cursor.passes, window)
                for batch in range(done, len(examples) // size):
                    chosen = [examples[i] for i in order[batch * size : (batch + 1) * size]]
                    yield chosen, cursor_at(cursor.passes, window, position, batch + 1)
                if len(examples) < layout.window:
                    return
                window, done = window + 1, 0
        finally:
            close(rows)


class Stream:
    """A data module's streamed split: validation held out of its start, each rank's training
    batches, and the position after the last batch handed to training (saved in checkpoints).

    ``encode(row, where)`` gives a row's key and piece (``packing.Rows``).
    """

    def __init__(self, source: DatasetSource, encode, layout: Layout, val_size: int) -> None:
        self.source, self.encode, self.layout, self.val_size = source, encode, layout, val_size
        self.held_out: frozenset[str] = frozenset()
        self.cursor = Cursor()
        self.strategy: Strategy | None = None
        """How ranks split the stream (``stream_shares``): the checkpoint's, else decided."""

    def validation(self, columns: Columns, rank: int = 0, world_size: int = 1) -> list[Piece]:
        """The first ``val_size`` examples of the validation split (``val_split``, else the
        training split's start), remembering the rows training leaves out; the split refused
        without ``columns``, and rank ``rank``'s share of training without a batch."""
        split = self.source.val_split or self.source.split
        dataset = open_checked(self.source, split, True, columns)
        where = self.source.describe(split)
        examples, self.held_out = held_out(dataset, self.encode, self.layout, self.val_size, where)
        if not examples:
            raise DataError(
                f"{where} gives no validation example; add rows or {self.layout.size_fix}"
            )
        self.batches(rank, world_size).check()
        return examples

    def loader(self, collate, rank: int, world_size: int) -> DataLoader:
        """Rank ``rank``'s share of the training split, in batches collated by ``collate``, each
        carrying the cursor after it under :data:`CURSOR`."""
        stream = self.batches(rank, world_size)

        def with_cursor(item: tuple[list[Piece], Cursor]) -> dict[str, Any]:
            return collate(item[0]) | {CURSOR: item[1].as_dict()}

        return DataLoader(stream, batch_size=None, collate_fn=with_cursor)

    def batches(self, rank: int, world_size: int) -> StreamedBatches:
        """Rank ``rank``'s training batches, from the stream's cursor."""
        where = self.source.describe(self.source.split)
        where += f" (rank {rank}'s share of {world_size})" if world_size > 1 else ""
        return StreamedBatches(
            lambda: self.share(rank, world_size),
            self.encode,
            self.layout,
            lambda: self.cursor,
            self.held_out,
            where,
        )

    def share(self, rank: int, world_size: int):
        """Rank ``rank``'s share of the training split, opened afresh."""
        dataset = open_split(self.source, self.source.split, True)
        if self.strategy is None and world_size > 1:  # one process reads the split whole
            split = self.source.split
            self.strategy = strategy_for(self.source, split, dataset.num_shards, world_size)
        return share(dataset, rank, world_size, self.strategy or "auto")

    def taken(self, batch: Any) -> Any:
        """``batch`` without its cursor, which becomes the stream's position: the batch goes to
        training now (batches prefetched behind it do not count)."""
        if isinstance(batch, dict) and CURSOR in batch:
            batch = dict(batch)
            self.cursor = Cursor.from_dict(batch.pop(CURSOR))
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Every rank's cursor: a collective, called on every rank as a checkpoint is saved."""
        cursors: list[Any] = [self.cursor.as_dict()]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            cursors = [None] * dist.get_world_size()
            dist.all_gather_object(cursors, self.cursor.as_dict())
        return {"stream_cursors": cursors, "stream_split": self.strategy or "auto"}

    def load_state_dict(self, state: dict[str, Any], rank: int, world_size: int) -> None:
        """This rank's cursor from a checkpoint's; refused when another number of ranks read it
        (each reads its own share)."""
        cursors = state["stream_cursors"]
        if len(cursors) != world_size:
            raise DataError(
                f"the checkpoint's stream was read by {len(cursors)} process(es) and this run "
                f"has {world_size}: each reads its own share of the split, so resume with "
                f"{len(cursors)} (trainer.devices × trainer.num_nodes)"
            )
        self.cursor = Cursor.from_dict(cursors[rank])
        # Checkpoints from before the split was chosen by size split as ``datasets`` chose.
        self.strategy = state.get("stream_split", "auto")
