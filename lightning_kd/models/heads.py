"""Output heads applied outside the models' forwards: what the chunked loss and the cache writer
read, the check that they reproduce the model's own logits, and their gathering under ZeRO-3."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from lightning_kd.losses.chunked import OutputHead, matmul_dtype
from lightning_kd.models.batch_positions import model_positions, takes, takes_positions
from lightning_kd.utils.refusal import Refused

SCALED_BY_MULTIPLYING = {"hyperclovax": "logits_scaling", "falcon_h1": "lm_head_multiplier"}
"""Model types whose logits are their head's output times a config value (Granite's
``logits_scaling`` divides: HyperCLOVA X's, of the same name, multiplies)."""


def logit_transform(config) -> Callable[[Tensor], Tensor] | None:
    """What a model does to its head's raw output before returning logits, if anything.

    The chunked loss computes logits from hidden states itself, so it must repeat these steps:
    soft-capping (Gemma 2/3, RecurrentGemma), a constant scale (Cohere; HyperCLOVA X,
    Falcon-H1), a divisor (Granite). :func:`check_head` catches a model that does something
    else.
    """
    cap = getattr(config, "final_logit_softcapping", getattr(config, "logits_soft_cap", None))
    scale = getattr(config, "logit_scale", None)
    if (key := SCALED_BY_MULTIPLYING.get(getattr(config, "model_type", None))) is not None:
        scale = getattr(config, key, None)
    divisor = getattr(config, "logits_scaling", None) if key is None else None
    if cap:
        return lambda logits: torch.tanh(logits / cap) * cap
    if scale is not None and scale != 1.0:
        return lambda logits: logits * scale
    if divisor is not None and divisor != 1.0:
        return lambda logits: logits / divisor
    return None


def output_head(model: nn.Module) -> OutputHead:
    """``model``'s output projection, as the chunked loss applies it to final hidden states."""
    head = model.get_output_embeddings()
    return OutputHead(head.weight, head.bias, logit_transform(model.config))


def final_hidden(model: nn.Module, batch: dict[str, Tensor], logits: bool) -> Tensor:
    """``model``'s full logits, or its body's final hidden states (no head, no logits)."""
    called = model if logits else body(model)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if takes_positions(type(called)):
        inputs["position_ids"] = model_positions(called, batch)
    segments = batch.get("token_type_ids")  # a sentence pair's (BERT): not all segment A
    if segments is not None and takes(type(called), "token_type_ids"):
        inputs["token_type_ids"] = segments
    out = called(**inputs, use_cache=False)
    return out.logits if logits else out.last_hidden_state


def body(model: nn.Module) -> nn.Module:
    """``model`` without its head: its ``base_model``, or its ``model`` where the prefix names
    an attribute it does not have (Llama 4's text model: ``language_model``, so ``base_model``
    is the whole model, whose output has no hidden states)."""
    found = model.base_model
    if found is model and isinstance(inner := getattr(model, "model", None), nn.Module):
        return inner
    return found


DIVERGED_LOGIT = 1e4
"""A logit beyond this (in magnitude) comes from weights that have diverged: a trained model's
logits stay within a few tens, and at 1e4 a softmax is one-hot in any precision. Checked before the
chunked head's comparison, whose tolerance would otherwise blame the head for the divergence."""


def largest_weight(model: nn.Module) -> float:
    """The largest magnitude among ``model``'s floating-point weights."""
    values = [
        p.detach().abs().max() for p in model.parameters() if p.is_floating_point() and p.numel()
    ]
    return float(torch.stack(values).max()) if values else 0.0


class HeadError(Refused, ValueError):
    """A model whose logits the chunked loss cannot take as they are: refused (exit 2, the
    message alone), and a ``ValueError`` to callers that fall back to the model's own logits."""


def check_head(model: nn.Module, batch: dict[str, Tensor], role: str, fix: str) -> None:
    """The head applied to ``model``'s hidden states must give the model's own logits (on the
    first row's first 8 tokens of ``batch``): catches architectures that post-process logits in
    a way :func:`logit_transform` does not know, before anything
    trains on (or stores) other logits. ``fix`` ends the error."""
    sample = {key: batch[key][:1, :8] for key in ("input_ids", "attention_mask")}
    was_training = model.training
    model.eval()  # dropout would make the two forwards differ
    try:
        with torch.no_grad():
            expected = final_hidden(model, sample, logits=True).float()
            hidden = final_hidden(model, sample, logits=False)
            got = output_head(model).logits(hidden, matmul_dtype(hidden)).float()
    finally:
        model.train(was_training)
    largest = float(expected.abs().max()) if expected.numel() else 0.0
    if not math.isfinite(largest) or largest > DIVERGED_LOGIT:
        raise HeadError(
            f"the {role} ({type(model).__name__}) gives logits as large as {largest:.3g} "
            f"(largest weight {largest_weight(model):.3g}): its weights have diverged, as a run "
            "does at too high a learning rate. Start from an earlier checkpoint or afresh, with "
            "a smaller optimizer.lr"
        )
    if not torch.allclose(got, expected, rtol=2e-2, atol=2e-2):
        raise HeadError(
            f"the {role} ({type(model).__name__}) computes its logits in a way the chunked loss "
            f"does not reproduce (max difference {(got - expected).abs().max():.3g}); {fix}"
        )


def gathered(heads: tuple[OutputHead | None, ...] | None) -> AbstractContextManager:
    """The output heads' weights whole for the block, where DeepSpeed ZeRO-3 has partitioned them.

    ZeRO-3 gathers a parameter only inside its own module's forward; the chunked loss applies the
    heads outside any forward (from hidden states), so it gathers them itself, read-only. The
    head-weight gradient is computed inside the block and returned in backward, when the weight
    may be partitioned again. Nothing to do (and no DeepSpeed import) anywhere else.
    """
    present = [head for head in heads or () if head is not None]
    params = [p for head in present for p in (head.weight, head.bias)]
    partitioned = [p for p in params if p is not None and is_partitioned(p)]
    if not partitioned:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


def is_partitioned(param: Tensor) -> bool:
    """A ZeRO-3 parameter not whole on this rank now. One that is whole already — small enough to
    persist (``stage3_param_persistence_threshold``), or held by a module mid-forward — must not
    be gathered: leaving the gather would free it under that module (DeepSpeed refuses: "Cannot
    free a ZeRO-3 parameter while it is still active in submodules", seen on an H200 with a
    tiny tied teacher)."""
    status = getattr(param, "ds_status", None)
    return hasattr(param, "ds_id") and status is not None and status.name != "AVAILABLE"
