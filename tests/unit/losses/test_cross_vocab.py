"""The cross-vocabulary losses: ULD's sorted L1, the hybrid, records taken a chunk at a time."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.losses.chunked import OutputHead, chunked_distillation_sums
from lightning_kd.losses.cross_top import teacher_top
from lightning_kd.losses.cross_vocab import (
    CrossTeacher,
    cross_records,
    sorted_l1,
    twins,
)
from lightning_kd.losses.divergences import forward_kl, get_divergence
from lightning_kd.losses.logits import LogitObjective


def test_sorted_l1_is_the_l1_distance_of_the_sorted_top_k():
    student = torch.tensor([[0.1, 0.6, 0.3]])
    teacher = torch.tensor([[0.5, 0.2]])  # top 2 of the teacher, any order
    # sorted: student (0.6, 0.3), teacher (0.5, 0.2)
    torch.testing.assert_close(sorted_l1(student, teacher), torch.tensor([0.2]))


def records(teacher_logits, mapping, student_vocab, k, loss="hybrid", temperature=1.0):
    top, _ = teacher_top(
        lambda index: teacher_logits[index],
        torch.arange(teacher_logits.shape[0]),
        k=k,
        temperature=temperature,
        chunk=3,
    )
    return cross_records(top, mapping, twins(mapping, student_vocab), loss=loss)


def test_with_every_token_matched_the_hybrid_is_the_full_divergence():
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 11, dtype=torch.float64), torch.randn(5, 11).double()
    found = records(teacher, torch.arange(11), 11, k=11)
    expected = forward_kl(student.log_softmax(-1), teacher.log_softmax(-1))
    torch.testing.assert_close(found.divergence(student, get_divergence("forward_kl")), expected)


def test_the_hybrid_buckets_matched_tokens_and_compares_the_rest_by_uld():
    teacher = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    mapping = torch.tensor([0, -1, 1, -1])  # teacher ids 0 and 2 have student twins 0 and 1
    student = torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64)  # id 2: no teacher twin
    found = records(teacher, mapping, 3, k=3)
    p, q = teacher.softmax(-1)[0], student.softmax(-1)[0]
    bucket_p = torch.stack([p[0], p[2], 1 - p[0] - p[2]])
    bucket_q = torch.stack([q[0], q[1], q[2]])
    kl = (bucket_p * (bucket_p / bucket_q).log()).sum()
    # ULD of the unmatched: teacher's top-3 unmatched is p[1] (p[3] is outside the top 3),
    # the student's tokens without a twin: q[2].
    uld = (q[2] - p[1]).abs()
    got = found.divergence(student, get_divergence("forward_kl"))
    torch.testing.assert_close(got, (kl + uld).unsqueeze(0))
    found = records(teacher, mapping, 3, k=3, loss="uld")
    uld_alone = (q.sort(descending=True).values - p.sort(descending=True).values[:3]).abs().sum()
    torch.testing.assert_close(found.divergence(student, forward_kl), uld_alone.unsqueeze(0))


@pytest.mark.parametrize("loss", ["hybrid", "uld"])
@pytest.mark.parametrize("divergence", ["forward_kl", "jsd"])
def test_chunking_changes_nothing_and_unaligned_positions_add_only_ce(loss, divergence):
    torch.manual_seed(0)
    batch, seq, width, vocab, teacher_vocab = 2, 6, 8, 13, 17
    hidden = torch.randn(batch, seq, width, dtype=torch.float64)
    head = OutputHead(torch.randn(vocab, width, dtype=torch.float64, requires_grad=True))
    labels = torch.randint(0, vocab, (batch, seq))
    labels[0, :2] = -100
    mapping = torch.full((teacher_vocab,), -1)
    mapping[: vocab - 3] = torch.randperm(vocab)[: vocab - 3]  # one to one, on a part
    found = records(torch.randn(batch * (seq - 1), teacher_vocab).double(), mapping, vocab, 5, loss)
    grid = found._map(lambda t: t.view(batch, seq - 1, *t.shape[1:]))
    aligned = grid.aligned.clone()
    aligned[1, 2] = False
    grid = CrossTeacher(**{**grid.__dict__, "aligned": aligned})
    objective = LogitObjective(get_divergence(divergence), 1.0, 0.5, 0.5)
    results = []
    for chunk in (1, 4, 100):
        hidden_leaf = hidden.clone().requires_grad_()
        head.weight.grad = None
        value, sums = chunked_distillation_sums(
            hidden_leaf, head, grid, None, labels, objective, chunk_size=chunk
        )
        value.backward()
        results.append((value.detach(), sums.kd, hidden_leaf.grad, head.weight.grad.clone()))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(a, b)
    # The unaligned position's hidden state gets CE's gradient alone.
    hidden_leaf = hidden.clone().requires_grad_()
    only_ce = LogitObjective(get_divergence(divergence), 1.0, 0.0, 0.5)
    chunked_distillation_sums(hidden_leaf, head, grid, None, labels, only_ce)[0].backward()
    torch.testing.assert_close(results[0][2][1, 2], hidden_leaf.grad[1, 2])


def test_the_projection_sums_the_teacher_tokens_a_student_token_starts():
    teacher = torch.tensor([[2.0, 1.0, 0.5, -1.0]], dtype=torch.float64)
    mapping = torch.tensor([0, 1, 1, -1])  # teacher ids 1 and 2 both start with student id 1
    student = torch.tensor([[0.3, 0.2, -0.4]], dtype=torch.float64)
    found = records(teacher, mapping, 3, k=3, loss="projected")
    p, q = teacher.softmax(-1)[0], student.softmax(-1)[0]
    # The teacher's top 3 are ids 0, 1, 2: projected onto (0: p0, 1: p1 + p2); the rest, p3.
    bucket_p = torch.stack([p[0], p[1] + p[2], p[3]])
    bucket_q = torch.stack([q[0], q[1], q[2]])
    expected = (bucket_p * (bucket_p / bucket_q).log()).sum()
    got = found.divergence(student, get_divergence("forward_kl"))
    torch.testing.assert_close(got, expected.unsqueeze(0))


def test_a_student_of_fewer_tokens_than_k_is_padded_with_zeros():
    """As Boizard et al. pad the smaller vocabulary: it was cut to the student's width, dropping
    the teacher's entries past it from the distance."""
    student = torch.tensor([[0.7, 0.3]])
    teacher = torch.tensor([[0.5, 0.3, 0.2]])
    torch.testing.assert_close(sorted_l1(student, teacher), torch.tensor([0.2 + 0.0 + 0.2]))


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl"])
def test_a_bucket_empty_on_one_side_is_left_out_not_floored(divergence):
    """Every student token matched (k covers its vocabulary) while the teacher holds mass on a
    token without a twin, or the teacher's whole distribution kept while the student has a token
    without one: the bucketed forward (reverse) KL is infinite for the bucketing alone. The floor
    standing in for log 0 made it ~1e4 x that mass (2,599 here; for reverse KL in the gradient
    too). Both sides are compared on the matched tokens, renormalised."""
    teacher = torch.tensor([[2.0, 1.0, 0.5, 0.0, 1.5]], dtype=torch.float64)
    student = torch.tensor([[1.0, 0.5, 0.2, 0.1]], dtype=torch.float64, requires_grad=True)
    if divergence == "forward_kl":  # teacher id 4 (0.26 of its mass) has no twin
        mapping, student_vocab, matched = torch.tensor([0, 1, 2, 3, -1]), 4, [0, 1, 2, 3]
        logits = student
    else:  # the teacher's 4 tokens are all twins; student id 4 has none
        mapping, student_vocab, matched = torch.tensor([0, 1, 2, 3]), 5, [0, 1, 2, 3]
        teacher = teacher[:, :4]
        logits = torch.cat([student, torch.tensor([[0.3]], dtype=torch.float64)], -1)
    found = records(teacher, mapping, student_vocab, k=teacher.shape[-1])
    found = CrossTeacher(**{**found.__dict__, "uld_weight": 0.0})
    value = found.divergence(logits, get_divergence(divergence))
    p = teacher[:, matched].log_softmax(-1)
    q = logits[:, matched].log_softmax(-1)
    expected = get_divergence(divergence)(q, p)
    torch.testing.assert_close(value, expected)
    (gradient,) = torch.autograd.grad(value.sum(), student)
    assert value.item() < 1 and gradient.abs().max() < 1
