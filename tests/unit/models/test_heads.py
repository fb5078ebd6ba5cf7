"""Output heads applied outside the models' forwards: gathering under ZeRO-3."""

from __future__ import annotations

from contextlib import nullcontext
from enum import Enum

import torch
from torch import nn

from lightning_kd.losses.chunked import OutputHead
from lightning_kd.models.heads import gathered, is_partitioned


class Status(Enum):  # the names of DeepSpeed's ZeroParamStatus
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


def zero3_parameter(status: Status) -> nn.Parameter:
    param = nn.Parameter(torch.zeros(4, 2))
    param.ds_id, param.ds_status = 0, status
    return param


def test_only_parameters_not_whole_now_are_gathered() -> None:
    # A persisted (small) or in-use parameter is whole: gathering it and leaving the gather would
    # free it under the module using it (DeepSpeed raises, seen on an H200).
    assert not is_partitioned(zero3_parameter(Status.AVAILABLE))
    assert is_partitioned(zero3_parameter(Status.NOT_AVAILABLE))
    assert is_partitioned(zero3_parameter(Status.INFLIGHT))
    assert not is_partitioned(nn.Parameter(torch.zeros(1)))  # no ZeRO-3 at all


def test_heads_all_whole_need_no_gather() -> None:
    head = OutputHead(zero3_parameter(Status.AVAILABLE), None, None)
    assert isinstance(gathered((head, None)), nullcontext)
    assert isinstance(gathered(None), nullcontext)
