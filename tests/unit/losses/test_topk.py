"""Divergences from a top-k teacher plus its tail mass (the cached-teacher loss)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_kd.losses import IGNORE_INDEX, get_divergence
from lightning_kd.losses.chunked import OutputHead, chunked_distillation_sums
from lightning_kd.losses.divergences import DIVERGENCES
from lightning_kd.losses.logits import LogitObjective, token_divergence
from lightning_kd.losses.topk import (
    TopKTeacher,
    tail_log_mass,
    target_log_prob,
    teacher_records,
    teacher_top_k,
    top_k_divergence,
)
from lightning_kd.utils.refusal import Refused

V = 11


def logits(seed: int, *shape: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, V, generator=generator, dtype=torch.float64) * 2


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_with_k_the_vocabulary_it_is_the_online_divergence(name: str) -> None:
    """k = V: value and gradient equal the online divergence exactly (fp64)."""
    divergence = get_divergence(name, beta=0.3, skew=0.2)
    teacher = logits(0, 3, 5)
    student = logits(1, 3, 5).requires_grad_()
    ids, log_probs, tail = teacher_top_k(teacher, V)
    assert torch.isneginf(tail).all()
    cached = top_k_divergence(student, ids, log_probs, tail, divergence)
    online = token_divergence(student, teacher, divergence)
    torch.testing.assert_close(cached, online, rtol=1e-12, atol=1e-12)
    (got,) = torch.autograd.grad(cached.sum(), student)
    (want,) = torch.autograd.grad(online.sum(), student)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_tail_term_on_a_distribution_built_by_hand() -> None:
    """Teacher p = (0.5, 0.3, 0.1, 0.1) with k = 2: tail r = 0.2. Student q = (0.25, 0.25, 0.25,
    0.25): tail 0.5. Forward KL of the buckets = 0.5 log(0.5/0.25) + 0.3 log(0.3/0.25) +
    0.2 log(0.2/0.5), written out here."""
    teacher = torch.tensor([[0.5, 0.3, 0.1, 0.1]], dtype=torch.float64).log()
    student = torch.zeros(1, 4, dtype=torch.float64)
    ids, log_probs, tail = teacher_top_k(teacher, 2)
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(tail, torch.tensor([math.log(0.2)], dtype=torch.float64))
    want = 0.5 * math.log(2) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    got = top_k_divergence(student, ids, log_probs, tail, get_divergence("forward_kl"))
    torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float64))


def test_top_k_forward_kl_is_a_lower_bound_that_tightens_with_k() -> None:
    teacher, student = logits(2, 64), logits(3, 64)
    forward = get_divergence("forward_kl")
    full = token_divergence(student, teacher, forward)
    previous = torch.zeros_like(full)
    for k in (1, 3, 6, V):
        value = top_k_divergence(student, *teacher_top_k(teacher, k), forward)
        assert (value <= full + 1e-12).all() and (value >= previous - 1e-12).all()
        previous = value
    torch.testing.assert_close(previous, full)


def test_a_tail_that_is_almost_empty_keeps_its_digits() -> None:
    """log(1 − Σ top-k) would round to log(0); the tail is summed over itself instead."""
    teacher = torch.tensor([[0.0, -40.0, -41.0]], dtype=torch.float64)
    _, _, tail = teacher_top_k(teacher, 2)
    want = -41.0 - torch.logsumexp(teacher, -1)
    torch.testing.assert_close(tail, want)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_the_writers_records_equal_top_k_and_the_target_log_prob(temperature) -> None:
    teacher = logits(4, 3, 7)
    targets = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(0))
    ids, log_probs, tail, target = teacher_records(teacher.clone(), targets, 4, temperature)
    want = teacher_top_k(teacher, 4, temperature)
    for got, expected in zip((ids, log_probs, tail), want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(target, target_log_prob(teacher, targets), rtol=1e-12, atol=1e-12)
    expected_tail = tail_log_mass(torch.log_softmax(teacher / temperature, -1), ids)
    torch.testing.assert_close(tail, expected_tail, rtol=1e-12, atol=1e-12)


def test_bad_k_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cache.k=0; choose 1..11"):
        teacher_top_k(logits(0, 2), 0)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
@pytest.mark.parametrize("chunk_size", [4, 1000])
def test_chunked_loss_from_full_records_equals_online(name: str, chunk_size: int) -> None:
    """The chunked loss fed a cached teacher's records (k = vocabulary) gives the online chunked
    loss's objective, sums and gradients (student hidden states and head), fp64."""
    torch.manual_seed(0)
    batch, seq, hidden_size = 2, 7, 5
    student_weight = torch.randn(V, hidden_size, dtype=torch.float64, requires_grad=True)
    teacher_weight = torch.randn(V, hidden_size, dtype=torch.float64)
    student_hidden = torch.randn(batch, seq, hidden_size, dtype=torch.float64, requires_grad=True)
    teacher_hidden = torch.randn(batch, seq, hidden_size, dtype=torch.float64)
    labels = torch.randint(0, V, (batch, seq))
    labels[0, 4:] = IGNORE_INDEX
    objective = LogitObjective(get_divergence(name, beta=0.3, skew=0.2), 1.0, 0.6, 0.4)
    online = chunked_distillation_sums(
        student_hidden,
        OutputHead(student_weight),
        teacher_hidden,
        OutputHead(teacher_weight),
        labels,
        objective,
        chunk_size=chunk_size,
    )
    ids, log_probs, tail = teacher_top_k(teacher_hidden[:, :-1] @ teacher_weight.T, V)
    cached = chunked_distillation_sums(
        student_hidden,
        OutputHead(student_weight),
        TopKTeacher(ids, log_probs, tail, V),
        None,
        labels,
        objective,
        chunk_size=chunk_size,
    )
    for got, want in ((cached[0], online[0]), (cached[1].kd, online[1].kd)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert cached[1].tokens == online[1].tokens
    params = [student_hidden, student_weight]
    got = torch.autograd.grad(cached[0], params)
    want = torch.autograd.grad(online[0], params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("divergence", ["forward_kl", "jsd"])  # the fused and autograd routes
def test_a_cached_padding_row_beyond_the_students_head_is_refused(divergence: str) -> None:
    """A teacher head padded past the tokenizer (16 rows for 10 tokens) whose padding rows make
    its top k, read by a student of the tokenizer's 10 rows: an index error in the loss before.
    Online KD compares the rows the two share; a cache of ids all below 10 is read as ever."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 5, 4, generator=generator, dtype=torch.float64)
    student_head = OutputHead(torch.randn(10, 4, generator=generator, dtype=torch.float64))
    teacher_logits = torch.randn(1, 4, 16, generator=generator, dtype=torch.float64)
    teacher_logits[..., 10:] += 10.0  # the padding rows on top
    labels = torch.randint(0, 10, (1, 5), generator=generator)
    objective = LogitObjective(get_divergence(divergence), 1.0, 1.0, 0.0)
    ids, log_probs, tail, target = teacher_records(teacher_logits, labels[:, 1:], 8)
    padded = TopKTeacher(ids, log_probs, tail, 16, target)
    with pytest.raises(Refused, match=r"token id 1\d among the teacher's top 8, beyond the stud"):
        chunked_distillation_sums(
            hidden, student_head, padded, None, labels, objective, chunk_size=2
        )
    teacher_logits[..., 10:] = -30.0  # as a trained teacher's padding rows: never in its top k
    ids, log_probs, tail, target = teacher_records(teacher_logits, labels[:, 1:], 8)
    fine = TopKTeacher(ids, log_probs, tail, 16, target)
    kd, _ = chunked_distillation_sums(
        hidden, student_head, fine, None, labels, objective, chunk_size=2
    )
    assert torch.isfinite(kd)
