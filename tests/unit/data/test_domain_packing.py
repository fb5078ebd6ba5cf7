"""A stream packed domain by domain: every example one domain's, each domain's examples its rows
in stream order cut into blocks, and a packer started from any position it reported giving
exactly the examples that followed it."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.data.domain_packing import DomainBlock, DomainPacker, OpenBlocks
from lightning_kd.data.packing import Mark, Rows


class Listed:
    """A list of rows read as ``datasets``' iterable datasets are: a state before each row."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows, self.at = rows, 0

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.at = state["at"]

    def __iter__(self):
        while self.at < len(self.rows):
            self.at += 1
            yield self.rows[self.at - 1]


def interleaved() -> list[dict]:
    """60 rows of three domains: 0 common and short, 1 with rows longer than a block (several
    blocks from one row), 2 rare; each row's tokens are numbers no other row holds."""
    rows, first = [], 0
    for i in range(60):
        domain = 2 if i % 13 == 5 else (1 if i % 3 == 1 else 0)
        length = {0: 3 + i % 5, 1: 17 + i % 7, 2: 4}[domain]
        rows.append({"domain": domain, "tokens": list(range(first, first + length))})
        first += length
    return rows


def encode(row: dict, where: str) -> tuple[str, DomainBlock]:
    return str(row["tokens"][0]), DomainBlock(torch.tensor(row["tokens"]), row["domain"])


def packer(rows: list[dict], pack: bool, mark=None, opened=None) -> DomainPacker:
    """Blocks of 8 from ``rows``, started at ``mark`` and ``opened`` (None: the start)."""
    rows_read = Rows(Listed(rows), mark or Mark(), encode, "rows")
    return DomainPacker(rows_read, 8, pack, opened or OpenBlocks())


def listed(examples: list[DomainBlock]) -> list[tuple[int, list[int]]]:
    return [(example.domain, example.tokens.tolist()) for example in examples]


def every(packer: DomainPacker) -> list[DomainBlock]:
    examples = []
    while (example := packer.take()) is not None:
        examples.append(example)
    return examples


def test_each_domains_examples_are_its_rows_in_order_cut_into_blocks() -> None:
    rows = interleaved()
    examples = every(packer(rows, pack=True))
    for domain in (0, 1, 2):
        tokens = [t for row in rows if row["domain"] == domain for t in row["tokens"]]
        blocks = [tokens[i : i + 8] for i in range(0, len(tokens) - 7, 8)]  # the tail left out
        assert [e.tokens.tolist() for e in examples if e.domain == domain] == blocks
    # Blocks come as their domain fills: the rare domain's first only after its second row.
    assert [e.domain for e in examples].index(2) > 10


def test_unpacked_each_row_is_one_example_truncated() -> None:
    rows = interleaved()
    examples = every(packer(rows, pack=False))
    assert [(e.domain, e.tokens.tolist()) for e in examples] == [
        (row["domain"], row["tokens"][:8]) for row in rows
    ]


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_a_packer_started_at_any_position_gives_the_examples_after_it(pack: bool) -> None:
    rows = interleaved()
    whole = every(packer(rows, pack))
    reading = packer(rows, pack)
    for taken in range(len(whole) + 1):
        mark, opened = reading.position()
        opened = OpenBlocks.from_list(opened.as_list())  # through a checkpoint's plain values
        rest = every(packer(rows, pack, mark, opened))
        assert listed(rest) == listed(whole[taken:]), taken
        # Resumed twice: one example from the resumed packer, then from its own position.
        resumed = packer(rows, pack, mark, opened)
        if resumed.take() is not None:
            again = every(packer(rows, pack, *resumed.position()))
            assert listed(again) == listed(whole[taken + 1 :]), taken
        if taken < len(whole):
            reading.take()
    # A resumed packer reports the position it was started from until it takes an example.
    mark, opened = packer(rows, pack).position()
    started = packer(rows, pack, mark, opened)
    assert started.position() == (mark, opened)
