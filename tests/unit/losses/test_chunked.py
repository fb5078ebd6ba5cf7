"""The chunked loss equals the full-logit loss, value and gradients, for every divergence."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.losses import IGNORE_INDEX, get_divergence
from lightning_kd.losses.chunked import (
    OutputHead,
    auto_chunk_size,
    chunked_distillation_sums,
)
from lightning_kd.losses.divergences import DIVERGENCES
from lightning_kd.losses.logits import LogitObjective, logit_distillation_sums

B, T, H_S, H_T, V = 3, 9, 6, 8, 23


def inputs(seed: int, tied: bool):
    torch.manual_seed(seed)
    f64 = torch.float64
    embedding = torch.nn.Parameter(torch.randn(V, H_S, dtype=f64))
    head_weight = embedding if tied else torch.nn.Parameter(torch.randn(V, H_S, dtype=f64))
    head_bias = None if tied else torch.nn.Parameter(torch.randn(V, dtype=f64))
    ids = torch.randint(0, V, (B, T))
    # The student's hidden states depend on the embedding too, so a tied head gets both paths.
    hidden = (embedding[ids] * 0.5).tanh()
    teacher_hidden = torch.randn(B, T, H_T, dtype=f64)
    teacher_weight = torch.randn(V + 3, H_T, dtype=f64)  # padded teacher vocabulary
    labels = ids.clone()
    labels[0, 5:] = IGNORE_INDEX
    labels[2, :3] = IGNORE_INDEX
    return embedding, head_weight, head_bias, hidden, teacher_hidden, teacher_weight, labels


def kd_plus_ce(hidden, t_hidden, student_head, teacher_head, labels, div, chunk_size):
    """The chunked objective KD + CE (both weight 1) and its sums."""
    return chunked_distillation_sums(
        hidden,
        student_head,
        t_hidden,
        teacher_head,
        labels,
        LogitObjective(div, kd_weight=1.0, ce_weight=1.0),
        chunk_size=chunk_size,
    )


def full_reference(params, hidden, head_weight, head_bias, teacher_logits, labels, kw):
    logits = hidden @ head_weight.T + (0 if head_bias is None else head_bias)
    sums = logit_distillation_sums(logits, teacher_logits, labels, kw["div"], kw["temperature"])
    objective = kw["kd_weight"] * sums.kd + kw["ce_weight"] * sums.ce
    return objective, sums, torch.autograd.grad(objective, params, retain_graph=True)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk_size", [4, 6, 1000])  # 18 scored tokens: ragged, even, one chunk
def test_chunked_equals_full_logits(name: str, tied: bool, chunk_size: int) -> None:
    embedding, head_weight, head_bias, hidden, t_hidden, t_weight, labels = inputs(0, tied)
    params = [embedding] if tied else [embedding, head_weight, head_bias]
    kw = {
        "div": get_divergence(name, beta=0.3, skew=0.2),
        "temperature": 2.0,
        "kd_weight": 0.6,
        "ce_weight": 0.4,
    }
    want_obj, want, want_grads = full_reference(
        params, hidden, head_weight, head_bias, t_hidden @ t_weight.T, labels, kw
    )
    objective, sums = chunked_distillation_sums(
        hidden,
        OutputHead(head_weight, head_bias),
        t_hidden,
        OutputHead(t_weight),
        labels,
        LogitObjective(kw["div"], kw["temperature"], kw["kd_weight"], kw["ce_weight"]),
        chunk_size=chunk_size,
    )
    grads = torch.autograd.grad(objective, params)
    assert sums.tokens == want.tokens == 18
    torch.testing.assert_close(objective, want_obj, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sums.kd, want.kd, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sums.ce, want.ce, rtol=1e-12, atol=1e-12)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_soft_capped_head_matches() -> None:
    """A logit transform (Gemma-style soft-capping) is applied and differentiated through."""
    embedding, _, _, hidden, t_hidden, t_weight, labels = inputs(1, True)
    cap = 3.0

    def softcap(logits):
        return torch.tanh(logits / cap) * cap

    div = get_divergence("jsd")
    logits = softcap(hidden @ embedding.T)
    ref = logit_distillation_sums(logits, softcap(t_hidden @ t_weight.T), labels, div)
    (want,) = torch.autograd.grad(ref.kd + ref.ce, [embedding], retain_graph=True)
    heads = OutputHead(embedding, transform=softcap), OutputHead(t_weight, transform=softcap)
    objective, _ = kd_plus_ce(hidden, t_hidden, *heads, labels, div, chunk_size=5)
    (got,) = torch.autograd.grad(objective, [embedding])
    torch.testing.assert_close(objective, ref.kd + ref.ce)
    torch.testing.assert_close(got, want)


def test_without_teacher_is_cross_entropy_only() -> None:
    embedding, _, _, hidden, _, _, labels = inputs(2, True)
    div = get_divergence("forward_kl")
    objective, sums = chunked_distillation_sums(
        hidden,
        OutputHead(embedding),
        None,
        None,
        labels,
        LogitObjective(div, kd_weight=0.0, ce_weight=1.0),
    )
    ref = logit_distillation_sums(hidden @ embedding.T, None, labels, div)
    assert sums.kd == 0
    torch.testing.assert_close(objective, ref.ce)


def test_bf16_autocast_is_close_to_fp32() -> None:
    torch.manual_seed(3)
    hidden = torch.randn(2, 16, 32, requires_grad=True)
    weight = torch.randn(500, 32) * 0.1
    t_hidden, t_weight = torch.randn(2, 16, 32), torch.randn(500, 32) * 0.1
    labels = torch.randint(0, 500, (2, 16))
    div = get_divergence("forward_kl")
    args = (
        OutputHead(weight),
        t_hidden,
        OutputHead(t_weight),
        labels,
        LogitObjective(div, 1.0, 0.5, 0.5),
    )
    exact, _ = chunked_distillation_sums(hidden, *args, chunk_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        approx, _ = chunked_distillation_sums(hidden, *args, chunk_size=8)
    assert approx.dtype == torch.float32
    torch.testing.assert_close(approx, exact, rtol=2e-2, atol=0.5)


def test_auto_chunk_size() -> None:
    assert auto_chunk_size(49152, 10_000) == 170
    assert auto_chunk_size(257, 100) == 100  # small vocab: one chunk


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl"])
def test_masked_vocabulary_falls_back_exactly(name: str) -> None:
    """−inf teacher logits (a masked vocabulary entry) take the exact route, not a NaN."""
    embedding, _, _, hidden, t_hidden, t_weight, labels = inputs(3, True)

    def mask_first(logits):
        return logits.index_fill(-1, torch.tensor([0]), float("-inf"))

    div = get_divergence(name)
    ref = logit_distillation_sums(
        hidden @ embedding.T, mask_first(t_hidden @ t_weight.T), labels, div
    )
    (want,) = torch.autograd.grad(ref.kd + ref.ce, [embedding], retain_graph=True)
    heads = OutputHead(embedding), OutputHead(t_weight, transform=mask_first)
    objective, sums = kd_plus_ce(hidden, t_hidden, *heads, labels, div, chunk_size=4)
    (got,) = torch.autograd.grad(objective, [embedding])
    assert torch.isfinite(objective) or name == "reverse_kl"
    torch.testing.assert_close(sums.kd, ref.kd)
    if torch.isfinite(ref.kd):
        torch.testing.assert_close(got, want)


def test_compiled_terms_equal_eager() -> None:
    """distill.compile: the torch.compile'd chunk math gives the eager values and gradients."""
    embedding, _, _, hidden, t_hidden, t_weight, labels = inputs(4, True)
    hidden, embedding = hidden.float(), embedding.detach().float().requires_grad_()
    hidden = hidden.detach()
    args = (OutputHead(embedding), t_hidden.float(), OutputHead(t_weight.float()), labels)
    results = []
    for compile in (False, True):
        objective, sums = chunked_distillation_sums(
            hidden,
            *args,
            LogitObjective(get_divergence("forward_kl"), 2.0, 0.5, 0.5),
            chunk_size=5,
            compile=compile,
        )
        (grad,) = torch.autograd.grad(objective, [embedding])
        results.append((objective, sums.kd, grad))
    for eager, compiled in zip(*results, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_frozen_head_gets_no_gradient_and_the_same_hidden_gradient() -> None:
    """A frozen head (student.freeze_embeddings) skips the head-weight gradient, and the hidden
    states' gradient is the one the trainable head gives."""
    _, head_weight, head_bias, _, t_hidden, t_weight, labels = inputs(3, tied=False)
    hidden = torch.randn(B, T, H_S, dtype=torch.float64, requires_grad=True)
    div = get_divergence("forward_kl")
    grads = []
    for trainable in (True, False):
        weight = head_weight.detach().clone().requires_grad_(trainable)
        bias = head_bias.detach().clone().requires_grad_(trainable)
        objective, _ = kd_plus_ce(
            hidden, t_hidden, OutputHead(weight, bias), OutputHead(t_weight), labels, div, 4
        )
        (grad,) = torch.autograd.grad(objective, hidden)
        grads.append(grad)
        if not trainable:
            objective, _ = kd_plus_ce(
                hidden, t_hidden, OutputHead(weight, bias), OutputHead(t_weight), labels, div, 4
            )
            objective.backward()
            assert weight.grad is None and bias.grad is None
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
