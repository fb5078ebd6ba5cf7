"""Training from a teacher cache (``distill.teacher_cache``): no teacher in the run, the same
student as online KD when the cache holds every token, and a cache of anything else refused
before the first step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_kd.cache import CacheMismatch, CacheSpec
from lightning_kd.cache.writer import write_cache
from lightning_kd.data import IndexedBlocks
from lightning_kd.distiller import Distiller
from lightning_kd.losses.chunk_terms import chunk_autograd, chunk_fused
from lightning_kd.losses.divergences import get_divergence
from lightning_kd.losses.logits import LogitObjective
from lightning_kd.losses.topk import TopKTeacher, teacher_top_k
from lightning_kd.models import StudentSpec, TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.objective import DistillConfig
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer

VOCAB = 257  # the tiny teacher's (byte tokenizer)
TEACHER = TeacherSpec(path=None, config=dict(TINY_LLAMA))


def write(directory: Path, corpus: Path, k: int, **data) -> Path:
    """A cache of the tiny teacher (as a float32 run loads it) over ``corpus``."""
    teacher = load_teacher(TEACHER, "32-true")
    datamodule = make_datamodule([corpus], **data)
    datamodule.setup()
    write_cache(
        teacher, datamodule.tokenizer, datamodule, CacheSpec(k=k, shard_blocks=4), directory
    )
    return directory


def fit(corpus: Path, steps: int = 4, **distill):
    module = make_module(TEACHER, **distill)
    trainer = make_trainer(max_steps=steps, val_check_interval=steps, limit_val_batches=2)
    datamodule = make_datamodule([corpus])
    trainer.fit(module, datamodule=datamodule)
    return module, trainer


def test_batches_say_which_blocks_they_hold(corpus: Path) -> None:
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    for row, index in enumerate(batch["block_index"].tolist()):
        assert torch.equal(batch["input_ids"][row], datamodule.train_examples[index])
    assert IndexedBlocks(["a"])[0] == (0, "a")


def test_a_full_cache_trains_the_online_student_without_a_teacher(corpus, tmp_path) -> None:
    """k = vocabulary: the same losses, metrics and student as online KD (to the fp16 rounding of
    the stored log-probs); the run never holds the teacher."""
    cache = write(tmp_path / "cache", corpus, k=VOCAB)
    online, online_trainer = fit(corpus)
    cached, cached_trainer = fit(corpus, teacher_cache=str(cache))
    assert cached.teacher is None and online.teacher is not None
    assert not any(key.startswith("distiller.teacher") for key in cached.state_dict())
    got, want = cached_trainer.callback_metrics, online_trainer.callback_metrics
    for name in ("val/ppl", "val/teacher_ppl", "val/kl", "val/agreement", "val/loss"):
        torch.testing.assert_close(got[name], want[name], rtol=2e-3, atol=2e-4)
    assert cached.teacher_digest == online.teacher_digest


def test_a_full_cache_gives_online_kds_loss_and_gradients(corpus, tmp_path) -> None:
    """One micro-batch through two distillers, one online, one from a k = vocabulary cache:
    the same objective and student gradients (to the stored log-probs' fp16 rounding)."""
    cache = write(tmp_path / "cache", corpus, k=VOCAB)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    results = []
    for teacher_cache in (None, str(cache)):
        distill = DistillConfig(teacher_cache=teacher_cache, compile=False)
        distiller = Distiller.from_specs(
            TEACHER, StudentSpec(num_layers=2), distill, byte_tokenizer(), "32-true", datamodule
        )
        objective, sums = distiller(batch)
        objective.backward()
        grads = [p.grad for p in distiller.student.parameters() if p.requires_grad]
        results.append((objective, sums, grads))
    (online, online_sums, online_grads), (cached, cached_sums, cached_grads) = results
    torch.testing.assert_close(cached, online, rtol=1e-4, atol=0)
    # Σ KL over 124 tokens of a copied student (≈ 1e-3 each); fp16 log-probs move each by ≈ 2e-6.
    # (fp64 exactness with k = vocabulary: tests/test_topk.py, on the records themselves.)
    torch.testing.assert_close(cached_sums.kd, online_sums.kd, rtol=0, atol=1e-3)
    assert cached_sums.tokens == online_sums.tokens
    for got, want in zip(cached_grads, online_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-4)


def test_a_top_k_cache_gives_the_exact_teacher_perplexity(corpus, tmp_path) -> None:
    cache = write(tmp_path / "cache", corpus, k=4)
    _, online_trainer = fit(corpus, steps=2)
    _, cached_trainer = fit(corpus, steps=2, teacher_cache=str(cache))
    got, want = cached_trainer.callback_metrics, online_trainer.callback_metrics
    torch.testing.assert_close(got["val/teacher_ppl"], want["val/teacher_ppl"], rtol=1e-5, atol=0)
    torch.testing.assert_close(got["val/ppl"], want["val/ppl"], rtol=1e-3, atol=0)
    assert got["val/kl"] < want["val/kl"]  # the bucketed KL: a lower bound


def test_a_cache_of_other_data_is_refused_before_any_step(corpus, tmp_path) -> None:
    cache = write(tmp_path / "cache", corpus, k=4, block_size=16)
    module = make_module(TEACHER, teacher_cache=str(cache))
    trainer = make_trainer(max_steps=2)
    with pytest.raises(CacheMismatch, match="block_size: the cache has 16, this run 32"):
        trainer.fit(module, datamodule=make_datamodule([corpus]))
    assert trainer.global_step == 0


@pytest.mark.parametrize(
    ("distill", "message"),
    [
        ({"features": "uniform"}, "not its hidden states"),
        ({"chunked": False}, "needs distill.chunked=true"),
    ],
)
def test_what_a_cache_cannot_serve_is_refused(tmp_path, distill, message) -> None:
    with pytest.raises(ValueError, match=message):
        DistillConfig(teacher_cache=str(tmp_path), **distill)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_fused_top_k_forward_kl_is_its_autograd(temperature: float, k: int) -> None:
    """The closed-form gradient of the bucketed forward KL (``q − p̃``) equals autograd's, with
    a tail, without one (k = vocabulary), at T ≠ 1 and with student padding rows (fp64)."""
    generator = torch.Generator().manual_seed(k)
    student = torch.randn(9, 23, dtype=torch.float64, generator=generator) * 3
    teacher = TopKTeacher(
        *teacher_top_k(torch.randn(9, 20, dtype=torch.float64, generator=generator) * 3, k),
        vocab=20,
    )
    targets = torch.randint(0, 23, (9,), generator=generator)
    objective = LogitObjective(get_divergence("forward_kl"), temperature, 0.7, 0.3)
    fused = chunk_fused(student, teacher, targets, objective)
    reference = chunk_autograd(student, teacher, targets, objective)
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
