"""Documents that stop where a teacher was cut off: packed, the separator after one is no target.

``lightning-kd generate`` on text prompts writes each continuation as a row of
``completions.jsonl``, marked ``"finished": false`` where it reached ``generate.max_new_tokens``
before the teacher ended it. Packed (``data.pack=true``), every document is followed by the EOS
separator, which is a target like any token: after a cut row it taught the student that a
document ends mid-sentence, at the teacher's token budget. Here such a document's tokens are a
:class:`CutDocument`, and :class:`CutEnds` remembers, for each packed block holding the separator
after one, where it sits, so that the batch leaves that label out (−100). A block is found by its
tokens, so the split, the training order, ``data.max_train_examples`` and ``data.domains`` need
not carry anything. Unpacked (``data.pack=false``), a document is an example of its own and has
no separator to leave out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import Tensor

from lightning_kd.data.reading import cut_texts
from lightning_kd.data.tokenized import rows, text_key
from lightning_kd.losses.logits import IGNORE_INDEX


class CutDocument(list):
    """A document's token ids, from a row marked ``"finished": false``."""


def marked(
    texts: list[str], token_lists: list[list[int]], files: list[Path], text_field: str
) -> list[list[int]]:
    """``token_lists`` (of ``texts``), those of a row of ``files`` marked ``"finished": false``
    as :class:`CutDocument`."""
    cut = cut_texts(files, text_field) if files else set()
    pairs = zip(texts, token_lists, strict=True)
    return [CutDocument(ids) if text in cut else ids for text, ids in pairs]


def marked_rows(
    found: list[tuple[str, list[int]]], dataset, field: str
) -> list[tuple[str, list[int]]]:
    """``found`` (``tokenized.split_documents``' keys and tokens of ``dataset``'s ``field``),
    the document of a row marked ``"finished": false`` as a :class:`CutDocument`, as
    :func:`marked` makes one of a file's row: read through ``data.dataset``, its separator was
    scored (probe 46)."""
    if "finished" not in (dataset.column_names or []):
        return found
    cut = {
        text_key(row[field])
        for row in rows(dataset.select_columns([field, "finished"]))
        if row["finished"] is False and isinstance(row[field], str)
    }
    return [(key, CutDocument(tokens) if key in cut else tokens) for key, tokens in found]


def cut_separators(token_lists: list[list[int]], block_size: int) -> dict[int, list[int]]:
    """Where :func:`~lightning_kd.data.packing.pack_blocks` puts the separator after each
    :class:`CutDocument`: block number → offsets in it (the dropped tail's left out)."""
    found: dict[int, list[int]] = {}
    start, end = 0, sum(len(tokens) + 1 for tokens in token_lists) // block_size * block_size
    for tokens in token_lists:
        separator = start + len(tokens)
        if isinstance(tokens, CutDocument) and separator < end:
            found.setdefault(separator // block_size, []).append(separator % block_size)
        start = separator + 1
    return found


def block_key(tokens: Tensor) -> bytes:
    """A block's identity: a digest of its token ids."""
    data = tokens.to(torch.int64).contiguous().numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()


class CutEnds:
    """The separators after cut documents in a data module's packed blocks, by block."""

    def __init__(self) -> None:
        self.by_block: dict[bytes, list[int]] = {}

    def __len__(self) -> int:
        return sum(len(offsets) for offsets in self.by_block.values())

    def add(self, token_lists: list[list[int]], blocks: list[Tensor], block_size: int) -> None:
        """Remember the separators after ``token_lists``' cut documents in ``blocks`` (their
        packed blocks)."""
        for number, offsets in cut_separators(token_lists, block_size).items():
            self.by_block[block_key(blocks[number])] = offsets

    def unscored(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``batch`` with no label at a remembered separator of any of its blocks."""
        if not self.by_block:
            return batch
        labels = batch["labels"].clone()
        for row, tokens in enumerate(batch["input_ids"]):
            offsets = self.by_block.get(block_key(tokens[batch["attention_mask"][row].bool()]))
            if offsets:
                labels[row, offsets] = IGNORE_INDEX
        return batch | {"labels": labels}
