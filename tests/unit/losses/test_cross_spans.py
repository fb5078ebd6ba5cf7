"""The span-level term across tokenizers: spans found on hand-made grids, the binarised KL, and
chunks that never cut a span."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_kd.losses.cross_spans import (
    binary_kl,
    chunk_bounds,
    span_divergence,
    span_grid,
    teacher_spans,
)

NAN = float("nan")


def test_the_teacher_sums_its_log_probs_between_consecutive_partners():
    """Row 0: student positions 0, 2, 3 aligned with teacher positions 0, 3, 4 (a student token
    the teacher splits in three, then one they share); row 1: teacher position 1 predicts
    text the student is not scored on (a BOS), so its span does not count."""
    wanted = torch.tensor([[True, False, True, True], [True, False, True, False]])
    partner = torch.tensor([[0, -1, 3, 4], [0, -1, 2, -1]])
    log_probs = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0], [-1.0, -9.0, -3.0, -4.0, -5.0]])
    scored = torch.ones(2, 5, dtype=torch.bool)
    scored[1, 1] = False
    values = teacher_spans(partner, wanted, log_probs.double(), scored)
    # spans [0, 3) and [3, 4) of row 0; the last of each row has no end; row 1's crosses a gap
    expected = torch.tensor([-6.0, -4.0, NAN, NAN, NAN], dtype=torch.float64)
    torch.testing.assert_close(values, expected, equal_nan=True)


def test_each_position_belongs_to_the_span_it_starts_or_continues():
    wanted = torch.tensor([[True, False, True, False, True], [True, True, False, True, False]])
    scored = torch.ones_like(wanted)
    scored[1, 2] = False  # row 1's second span holds an unscored position
    values = torch.tensor([-6.0, -4.0, NAN, -1.0, -2.0, NAN], dtype=torch.float64)
    span, teacher = span_grid(wanted, scored, values)
    assert span.tolist() == [[0, 0, 2, 2, -1], [5, -1, -1, -1, -1]]
    assert teacher.tolist() == [[-6.0, -6.0, -4.0, -4.0, 0.0], [-1.0, 0.0, 0.0, 0.0, 0.0]]


def test_no_spans_without_two_aligned_positions():
    wanted = torch.tensor([[False, True, False]])
    span, teacher = span_grid(wanted, torch.ones_like(wanted), torch.tensor([-1.0]))
    assert (span == -1).all() and (teacher == 0).all()


def test_binary_kl_is_the_bernoulli_divergence_and_stays_finite_at_the_edges():
    log_p = torch.tensor([-0.1, -2.0, -30.0, -1e-12, -0.5], dtype=torch.float64)
    log_q = torch.tensor([-0.3, -2.0, -0.01, -5.0, -1e-12], dtype=torch.float64).requires_grad_()
    value = binary_kl(log_p, log_q)
    p, q = log_p.exp()[:2], log_q.detach().exp()[:2]
    expected = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
    torch.testing.assert_close(value[:2], expected)
    assert value[1] == 0 and (value >= 0).all()
    value.sum().backward()
    assert torch.isfinite(log_q.grad).all()


def test_the_span_divergence_sums_each_spans_tokens_first():
    student = torch.tensor([-0.5, -0.25, -1.0, -3.0], dtype=torch.float64)
    span = torch.tensor([7, 7, 9, -1])
    teacher = torch.tensor([-0.5, -0.5, -2.0, 0.0], dtype=torch.float64)
    value = span_divergence(student, span, teacher)
    expected = binary_kl(torch.tensor([-0.5, -2.0]), torch.tensor([-0.75, -1.0])).sum()
    torch.testing.assert_close(value, expected.double())
    assert span_divergence(student, torch.full((4,), -1), teacher) == 0


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_chunks_cover_every_position_once_and_never_cut_a_span(size):
    span = torch.tensor([-1, 1, 1, 1, 4, 4, -1, -1, 8, 9, 9, 9, 9, 9, -1])
    bounds = chunk_bounds(len(span), size, span)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(span)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(bounds))
    for _, stop in bounds[:-1]:
        assert span[stop] < 0 or span[stop] != span[stop - 1]
    longest = max(stop - start for start, stop in bounds)
    assert longest <= max(size, 5)  # the five-token span is the only reason to exceed size


def test_without_spans_the_chunks_are_the_plain_ones():
    assert chunk_bounds(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert chunk_bounds(0, 3) == []
    assert chunk_bounds(4, 2, torch.full((4,), -1)) == [(0, 2), (2, 4)]
