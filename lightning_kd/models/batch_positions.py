"""The positions a model reads a batch at, and the refusal of those its position table lacks.

A position past a model's table fails deep inside it: GPT-2's and OPT's learned positions with
an embedding's bare ``IndexError`` on a CPU and a device-side assert that ends the process on a
GPU; OPT read a negative ``position_ids`` as the offset rows before its table, without an error;
a rotary model scores positions it was never trained at (probe 51). The launch compares its
lengths with the limit before any weights load (``models/positions.py``); this is the same
check at the forward, for batches built by hand.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor, nn

POSITION_KEYS = ("max_position_embeddings", "n_positions")


def max_positions(config) -> int | None:
    """The longest sequence a model of ``config`` covers, if its config says."""
    for key in POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def positions(batch: dict[str, Tensor]) -> Tensor:
    """The batch's ``position_ids``, else each row's count of attended tokens before each
    position: 0, 1, … from a row's first real token. A left-padded row's text would otherwise sit
    at positions 5, 6, … after 5 pads, which a model of absolute positions (GPT-2, OPT) reads as
    other input (its KD term 22 % off, measured on GPT-2); for rotary models only the
    differences count, and a right-padded or packed row's positions are those the model takes
    by default."""
    given = batch.get("position_ids")
    if given is not None:
        return given
    return (batch["attention_mask"].long().cumsum(-1) - 1).clamp(min=0)


def takes_positions(model_class: type) -> bool:
    """Whether ``model_class.forward`` names ``position_ids`` (BLOOM's ALiBi takes none)."""
    return takes(model_class, "position_ids")


@functools.cache
def takes(model_class: type, name: str) -> bool:
    """Whether ``model_class.forward`` names the input ``name`` (not through ``**kwargs``)."""
    return name in inspect.signature(model_class.forward).parameters


def model_positions(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """:func:`positions` for ``model``, refused where they fall outside its position table: a
    negative ``position_ids``, or one at or past its ``max_position_embeddings``. Derived
    positions are read back from the device only where the batch is longer than the table."""
    found = positions(batch)
    limit = max_positions(getattr(model, "config", None))
    given = batch.get("position_ids") is not None
    if not given and (limit is None or found.shape[-1] <= limit):
        return found  # 0 … seq - 1 at most: nothing to read back
    low, high = torch.stack([found.min(), found.max()]).tolist()
    key = "position_ids" if given else "the batch's positions (counted from attention_mask)"
    if low < 0:
        raise ValueError(f"position_ids hold {low}: positions count from 0 at a row's first token")
    if limit is not None and high >= limit:
        name = type(model).__name__
        raise ValueError(
            f"{key} reach {high}, past {name}'s {limit} positions (config "
            f"max_position_embeddings: 0 to {limit - 1}); cut the rows to {limit} tokens or "
            "fewer, or, for a model that reads longer sequences (rotary positions, rope "
            "scaling), raise its config.max_position_embeddings"
        )
    return found
