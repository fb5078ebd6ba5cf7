"""Examples to batches: right-padding with masks, indexed blocks, unscored padding for ranks.

Shared by every data module (text, chat; read whole or streamed): the layout of a batch —
``input_ids``, ``attention_mask``, ``labels`` (−100 where nothing is scored) and, for indexed
blocks, ``block_index`` — is written once here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lightning_kd.data.domain_packing import DomainBlock
from lightning_kd.losses.logits import IGNORE_INDEX


@dataclass(frozen=True)
class Unscored:
    """An example's tokens, run through the models but scored nowhere (its labels are all -100).

    It pads the validation set to a multiple of the world size: Lightning's DistributedSampler
    would otherwise repeat real examples on some ranks, and those would count twice in every
    metric. Ranks keep equal batch counts (so no rank waits in a collective), and the padding
    adds no token to any sum.
    """

    tokens: Tensor


class IndexedBlocks(Dataset):
    """``blocks[i]`` as ``(i, block)``: each batch then says which blocks it holds
    (``block_index``, −1 for :class:`Unscored` padding), which a cached teacher's records are
    looked up by; with ``domains`` (each block's, ``data.domains``), ``(i, block, domain)``."""

    def __init__(self, blocks: list[Tensor | Unscored], domains: list[int] | None = None) -> None:
        self.blocks, self.domains = blocks, domains

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> tuple:
        block = self.blocks[index]
        unscored = isinstance(block, Unscored)
        if self.domains is None:
            return (-1 if unscored else index), block
        return (-1, block, -1) if unscored else (index, block, self.domains[index])


def pad_for_ranks(examples: list[Tensor], world_size: int) -> list[Tensor | Unscored]:
    """``examples`` plus unscored copies of the first few, to a multiple of ``world_size``."""
    extra = -len(examples) % world_size
    return examples + [Unscored(examples[i % len(examples)]) for i in range(extra)]


def collate_tokens(
    examples: list[Tensor | Unscored] | list[tuple], pad_id: int
) -> dict[str, Tensor]:
    """Right-pad to the longest example with ``pad_id``; padding is masked from attention and
    labels, and :class:`Unscored` examples from labels. Examples given as ``(block index,
    tokens)`` (:class:`IndexedBlocks`) add ``block_index`` ``[batch]`` to the batch, and as
    ``(block index, tokens, domain)`` — or as streamed ``DomainBlock``s — also ``domain``
    ``[batch]``."""
    extra = {}
    if examples and isinstance(examples[0], DomainBlock):  # streamed with data.domains
        extra["domain"] = torch.tensor([example.domain for example in examples], dtype=torch.long)
        examples = [example.tokens for example in examples]
    if examples and isinstance(examples[0], tuple):
        columns = list(zip(*examples, strict=True))
        extra["block_index"] = torch.tensor(columns[0], dtype=torch.long)
        if len(columns) == 3:
            extra["domain"] = torch.tensor(columns[2], dtype=torch.long)
        examples = list(columns[1])
    unscored = [isinstance(example, Unscored) for example in examples]
    examples = [
        example.tokens if isinstance(example, Unscored) else example for example in examples
    ]
    length = max(len(example) for example in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        input_ids[row, : len(example)] = example
        attention_mask[row, : len(example)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    labels[torch.tensor(unscored)] = IGNORE_INDEX
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return batch | extra


def first_training_examples(
    datamodule: Any, count: int, domains: Collection[int] | None = None
) -> list:
    """The first ``count`` examples of ``datamodule``'s set-up training split (fewer where it
    has fewer), of ``domains`` alone where given (indices of ``data.domains``), as the data
    module collates them: the split's own order, so the same on every rank and for any batch
    size. Streamed: the stream's first, read again (of ``domains``: among its first
    ``SCANNED × count``)."""
    if (stream := datamodule.stream) is not None:
        examples = stream.batches(0, 1).first(count if domains is None else SCANNED * count)
        if domains is not None:
            examples = [e for e in examples if getattr(e, "domain", None) in domains][:count]
        return examples
    order = range(len(datamodule.train_examples))
    if domains is not None:  # the data's domains are known: entries name none without
        order = [i for i in order if datamodule.train_domains[i] in domains]
    return [datamodule.train_examples[i] for i in list(order)[:count]]


def first_training_batch(
    datamodule: Any, count: int, domains: Collection[int] | None = None
) -> dict[str, Tensor] | None:
    """:func:`first_training_examples` as one batch; None where no example is of ``domains``."""
    examples = first_training_examples(datamodule, count, domains)
    return datamodule.collate(examples) if examples else None


SCANNED = 16
"""How many times ``count`` examples a stream is read for those of some domains: a bound on
what a check reads before training (a domain rarer than that is judged when a batch has it)."""
