"""Output heads applied outside the models' forwards: gathering under ZeRO-3, the check that
they reproduce the model's logits."""

from __future__ import annotations

from contextlib import nullcontext
from enum import Enum

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from lightning_kd.losses.chunked import OutputHead
from lightning_kd.models.heads import check_head, gathered, is_partitioned
from tests.conftest import TINY_LLAMA


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


def test_diverged_weights_are_named_as_such_not_blamed_on_the_head() -> None:
    """A checkpoint saved after a loss spike can hold finite weights of 1e13: the head check must
    say the weights diverged (and how to recover), not suggest another loss computation."""
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "attention_mask": torch.ones(1, 4)}
    check_head(model, batch, "student", "set distill.chunked=false")  # a sane model passes
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(1e13)
    with pytest.raises(ValueError, match="its weights have diverged") as error:
        check_head(model, batch, "student", "set distill.chunked=false")
    assert "distill.chunked" not in str(error.value)
    assert "smaller optimizer.lr" in str(error.value)
