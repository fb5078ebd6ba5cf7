"""One chunk's fused terms (``losses.chunk_terms``): compiled as eager, whatever the weights."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.losses.chunk_terms import chunk_fused
from lightning_kd.losses.divergences import get_divergence
from lightning_kd.losses.logits import LogitObjective
from lightning_kd.losses.topk import TopKTeacher, teacher_top_k

VOCAB = 40
# One process, one compiled kernel per path: each setting after the first must be honoured by
# the kernel the first compiled. The CE weight changes most (a kernel once kept its first one).
SETTINGS = [(1.0, 0.5, 0.5), (1.0, 0.2, 0.8), (1.0, 1.0, 0.0), (2.0, 0.3, 0.7), (3.0, 0.6, 0.1)]


def chunk(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student logits, teacher logits and targets of one chunk (fp32, as a run computes them)."""
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(11, VOCAB, generator=generator) * 3
    teacher = torch.randn(11, VOCAB, generator=generator) * 3
    return student, teacher, torch.randint(0, VOCAB, (11,), generator=generator)


def top_k(teacher: torch.Tensor) -> TopKTeacher:
    """A cached teacher's records of ``teacher``'s logits: its top 8 and the tail."""
    return TopKTeacher(*teacher_top_k(teacher, 8), vocab=VOCAB)


# The fused routes: a teacher's logits (forward and reverse KL), a cached teacher's top k (the
# closed form is forward KL's alone), no teacher (CE alone).
ROUTES = [
    ("logits", "forward_kl"),
    ("logits", "reverse_kl"),
    ("top_k", "forward_kl"),
    ("none", "forward_kl"),
]


@pytest.mark.parametrize(("teacher_kind", "divergence"), ROUTES)
def test_compiled_terms_follow_every_change_of_weights(teacher_kind: str, divergence: str) -> None:
    """``distill.compile``: one compiled kernel gives the eager value, CE and gradient at each
    temperature and KD/CE weights in turn — for a teacher's logits, a cached teacher's top k and
    no teacher. (torch 2.13 kept a kernel's first CE weight in the one-hot part of the gradient
    while the weights were Python floats: a run at KD 0.2 / CE 0.8 after one at 0.5 / 0.5
    trained on the wrong gradient.)"""
    for seed, (temperature, kd_weight, ce_weight) in enumerate(SETTINGS):
        student, teacher_logits, targets = chunk(seed)
        teacher = {"logits": teacher_logits, "top_k": top_k(teacher_logits), "none": None}
        objective = LogitObjective(get_divergence(divergence), temperature, kd_weight, ce_weight)
        eager = chunk_fused(student, teacher[teacher_kind], targets, objective, compile=False)
        compiled = chunk_fused(student, teacher[teacher_kind], targets, objective, compile=True)
        for name, got, want in zip(("kd", "ce", "gradient", "span"), compiled, eager, strict=True):
            torch.testing.assert_close(
                got,
                want,
                rtol=1e-5,
                atol=1e-5,
                msg=lambda m, n=name, o=objective: f"{n} at {o}: {m}",
            )


def test_an_error_of_the_inputs_leaves_compiling_on(monkeypatch) -> None:
    """A batch whose label is outside the vocabulary fails compiled and eager alike: its error
    is raised and the next batch is compiled again (it turned compiling off for the process,
    every later Distiller in it too, under a "torch.compile failed" warning)."""
    from lightning_kd.losses import chunk_terms

    def kernel_error(terms):
        def run(*args):
            raise RuntimeError("kernel failed")

        return run

    def terms(index):
        return torch.arange(3)[index]

    monkeypatch.setattr(chunk_terms, "_compiled", kernel_error)
    monkeypatch.setattr(chunk_terms, "_COMPILE_FAILED", False)
    with pytest.raises(IndexError):
        chunk_terms._compiled_or_eager((torch.tensor(7),), terms)
    assert not chunk_terms._COMPILE_FAILED
    with pytest.warns(UserWarning, match="torch.compile failed .* runs eagerly"):
        assert chunk_terms._compiled_or_eager((torch.tensor(1),), terms) == 1
    assert chunk_terms._COMPILE_FAILED  # a kernel that fails where eager works: eager from now
