"""The cross-tokenizer step: with identical tokenizers it is the same-tokenizer step, exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_kd.data.token_bytes import byte_lengths
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.models.loading import byte_tokenizer, model_from_config
from lightning_kd.models.student import student_from_teacher
from tests.conftest import TEXT, TINY_GPT2


def batch_of(text: str, rows: int = 2, length: int = 24) -> dict[str, torch.Tensor]:
    """Rows of byte ids cut from ``text``, an EOS inside the first, a masked prompt in the last."""
    ids = byte_tokenizer()(text)["input_ids"][: rows * length]
    input_ids = torch.tensor(ids).view(rows, length)
    input_ids[0, 10] = 256
    labels = input_ids.clone()
    labels[-1, :5] = -100
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def distillers(
    divergence: str, temperature: float, loss: str = "hybrid"
) -> tuple[Distiller, Distiller]:
    """A same-tokenizer distiller and its copy through the cross-tokenizer path, in fp64."""
    torch.manual_seed(0)
    teacher = model_from_config(dict(TINY_GPT2), "causal_lm").double().eval()
    student = student_from_teacher(teacher, [0, 3]).double()
    torch.manual_seed(1)
    with torch.no_grad():  # a student unlike its teacher: a non-zero divergence everywhere
        for parameter in student.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    config = DistillConfig(divergence=divergence, temperature=temperature, compile=False)
    tokenizer = byte_tokenizer()
    same = Distiller(teacher, student, config, token_lengths=byte_lengths(tokenizer, student))
    cross = CrossTokenizer(tokenizer, tokenizer, 257, 257, top_k=257, loss=loss)
    other = Distiller(copy.deepcopy(teacher), copy.deepcopy(student), config, cross=cross)
    return same, other


@pytest.mark.parametrize(
    ("divergence", "temperature", "loss"),
    [
        ("forward_kl", 1.0, "hybrid"),
        ("reverse_kl", 2.0, "hybrid"),
        ("jsd", 1.0, "hybrid"),
        ("forward_kl", 1.0, "projected"),
        ("jsd", 2.0, "projected"),
    ],
)
def test_identical_tokenizers_give_the_same_loss_and_gradients(divergence, temperature, loss):
    same, cross = distillers(divergence, temperature, loss)
    batch = batch_of(TEXT)
    losses = []
    for distiller in (same, cross):
        objective, sums = distiller(batch)
        objective.backward()
        losses.append((objective.detach(), sums.kd, sums.ce, sums.tokens))
    for a, b in zip(*losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert losses[0][1] > 0
    for (name, a), b in zip(
        same.student.named_parameters(), cross.student.parameters(), strict=True
    ):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_identical_tokenizers_give_the_same_validation_metrics():
    same, cross = distillers("forward_kl", 1.0)
    batch = batch_of(TEXT)
    with torch.inference_mode():  # as Lightning validates, before a run's first training step
        expected, got = same.evaluate(batch), cross.evaluate(batch)
    for name in ("ppl", "kl", "agreement", "loss", "bpb", "teacher_bpb"):
        torch.testing.assert_close(
            got[name][0] / got[name][1], expected[name][0] / expected[name][1], msg=name
        )
    assert got["aligned"][0] == got["aligned"][1]  # every scored position has its partner
    # The vocabulary maps were built on first use, in inference mode: training's autograd can
    # still save them.
    objective, _ = cross(batch)
    objective.backward()
