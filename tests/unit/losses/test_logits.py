"""Full-logit distillation loss: causal shift, masking, temperature, shared vocabulary."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_kd.losses import IGNORE_INDEX, get_divergence, logit_distillation_loss
from lightning_kd.losses.logits import evaluation_sums, logit_distillation_sums


def direct_loss(student, teacher, labels, temperature, kd_weight, ce_weight):
    """The same loss written token by token, the way a reader would check it by hand."""
    kd_terms, ce_terms = [], []
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1] - 1):
            target = labels[b, t + 1]
            if target == IGNORE_INDEX:
                continue
            ps = torch.softmax(student[b, t].double() / temperature, -1)
            pt = torch.softmax(teacher[b, t].double() / temperature, -1)
            kd_terms.append((pt * (pt.log() - ps.log())).sum() * temperature**2)
            ce_terms.append(-torch.log_softmax(student[b, t].double(), -1)[target])
    kd = torch.stack(kd_terms).mean()
    ce = torch.stack(ce_terms).mean()
    return kd_weight * kd + ce_weight * ce


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_loss_equals_token_by_token_formula(temperature: float) -> None:
    torch.manual_seed(0)
    student = torch.randn(2, 6, 17, dtype=torch.float64)
    teacher = torch.randn(2, 6, 17, dtype=torch.float64)
    labels = torch.randint(0, 17, (2, 6))
    labels[0, 4:] = IGNORE_INDEX  # right padding
    labels[1, 1] = IGNORE_INDEX  # a masked prompt token
    got = logit_distillation_loss(
        student, teacher, labels, "forward_kl", temperature, kd_weight=0.7, ce_weight=0.3
    )
    want = direct_loss(student, teacher, labels, temperature, 0.7, 0.3)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_masked_positions_do_not_change_loss_or_gradient() -> None:
    torch.manual_seed(1)
    student = torch.randn(1, 5, 9, requires_grad=True)
    teacher = torch.randn(1, 5, 9)
    labels = torch.tensor([[1, 2, 3, IGNORE_INDEX, IGNORE_INDEX]])
    loss = logit_distillation_loss(student, teacher, labels, kd_weight=1, ce_weight=1)
    loss.backward()
    # Positions 2 and 3 predict masked labels and position 4 predicts nothing.
    assert student.grad[0, 2:].abs().sum() == 0
    changed = student.detach().clone()
    changed[0, 2:] += 100.0
    torch.testing.assert_close(
        logit_distillation_loss(changed, teacher, labels, kd_weight=1, ce_weight=1), loss
    )


def test_token_mean_is_over_unmasked_tokens_not_vocab() -> None:
    """A uniform student against a one-hot-ish teacher: the mean is per token (no /vocab)."""
    vocab = 50
    student = torch.zeros(1, 3, vocab, dtype=torch.float64)
    teacher = torch.full((1, 3, vocab), -1e4, dtype=torch.float64)
    teacher[..., 0] = 0.0
    labels = torch.tensor([[0, 0, 0]])
    loss = logit_distillation_loss(student, teacher, labels, kd_weight=1.0, ce_weight=0.0)
    torch.testing.assert_close(
        loss, torch.tensor(torch.log(torch.tensor(50.0)).item(), dtype=torch.float64)
    )


def test_padded_vocabularies_compare_over_shared_range() -> None:
    torch.manual_seed(2)
    student = torch.randn(1, 4, 10, dtype=torch.float64)
    teacher = torch.randn(1, 4, 10, dtype=torch.float64)
    labels = torch.randint(0, 10, (1, 4))
    padded_teacher = torch.cat([teacher, torch.full((1, 4, 6), 3.0, dtype=torch.float64)], -1)
    kd = get_divergence("forward_kl")
    same = logit_distillation_sums(student, teacher, labels, kd)
    padded = logit_distillation_sums(student, padded_teacher, labels, kd)
    torch.testing.assert_close(padded.kd, same.kd)


def test_low_precision_logits_are_upcast() -> None:
    torch.manual_seed(3)
    student, teacher = torch.randn(2, 1, 6, 300)
    labels = torch.randint(0, 300, (1, 6))
    exact = logit_distillation_loss(student, teacher, labels, kd_weight=1, ce_weight=1)
    bf16 = logit_distillation_loss(
        student.bfloat16(), teacher.bfloat16(), labels, kd_weight=1, ce_weight=1
    )
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, exact, rtol=2e-2, atol=2e-2)


def test_evaluation_sums() -> None:
    torch.manual_seed(4)
    student, teacher = torch.randn(2, 7, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (7,))
    sums = evaluation_sums([(student, teacher, targets)], get_divergence("tvd"), 2.0)
    assert sums.tokens == 7
    torch.testing.assert_close(sums.student_nll, F.cross_entropy(student, targets, reduction="sum"))
    torch.testing.assert_close(sums.teacher_nll, F.cross_entropy(teacher, targets, reduction="sum"))
    assert sums.agreement == (student.argmax(-1) == teacher.argmax(-1)).sum()
    halves = evaluation_sums(
        [(student[:3], teacher[:3], targets[:3]), (student[3:], teacher[3:], targets[3:])],
        get_divergence("tvd"),
        2.0,
    )
    for name in ("student_nll", "teacher_nll", "forward_kl", "kd", "agreement", "tokens"):
        torch.testing.assert_close(getattr(halves, name), getattr(sums, name))
