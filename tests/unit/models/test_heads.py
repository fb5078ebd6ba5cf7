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
from lightning_kd.models.heads import body, check_head, gathered, is_partitioned, output_head
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


@pytest.mark.parametrize(
    ("model_type", "key"),
    [
        ("hyperclovax", "logits_scaling"),
        ("granite", "logits_scaling"),
        ("recurrent_gemma", "logits_soft_cap"),  # a cap under another name: it was left out
    ],
)
def test_a_logit_scale_is_applied_as_the_family_applies_it(model_type: str, key: str) -> None:
    """HyperCLOVA X multiplies by its ``logits_scaling``, Granite divides by its own: both were
    divided, a traceback at scale 1.5 and silently wrong teacher logits at 1.01 (probe 31)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    small = {"vocab_size": 257, "hidden_size": 64, "intermediate_size": 128}
    small |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    config = AutoConfig.for_model(model_type, **small, **{key: 1.5})
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = model(**batch, use_cache=False).logits
        hidden = model.base_model(**batch, use_cache=False).last_hidden_state
        got = output_head(model).logits(hidden, torch.float32)
    assert torch.allclose(got, expected, atol=1e-5)
    check_head(model, batch, "teacher", "set distill.chunked=false")


def test_a_head_the_chunked_loss_cannot_reproduce_is_a_refusal() -> None:
    """It was a ValueError traceback, exit 1, in the validation before training; evaluate
    still reads it as a ValueError, and scores such a model from its own logits."""
    from lightning_kd.utils.refusal import Refused

    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()
    model.config.logit_scale = 3.0  # a scale the model's own forward does not apply
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "attention_mask": torch.ones(1, 4)}
    with pytest.raises(Refused, match="does not reproduce .*; set distill.chunked=false") as error:
        check_head(model, batch, "teacher", "set distill.chunked=false")
    assert isinstance(error.value, ValueError)


def test_the_body_of_a_model_whose_prefix_names_no_attribute_is_its_model() -> None:
    """Llama 4's text model names its body ``language_model`` but holds it as ``model``, so
    ``base_model`` was the whole model: no hidden states, an AttributeError in the first
    validation (probe 31)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama4_text", vocab_size=257, hidden_size=64, intermediate_size=128,
        intermediate_size_mlp=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=2, interleave_moe_layer_step=1, head_dim=16,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    assert model.base_model is model and body(model) is model.model
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    check_head(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "teacher", "")
