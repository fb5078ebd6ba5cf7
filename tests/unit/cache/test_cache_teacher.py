"""Training from a teacher cache (``distill.teacher_cache``): no teacher in the run, the same
student as online KD when the cache holds every token, and a cache of anything else refused
before the first step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_kd.cache import CacheMismatch, CacheSpec
from lightning_kd.cache.hidden_states import mapped_paths
from lightning_kd.cache.writer import write_cache
from lightning_kd.data.batches import IndexedBlocks
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.losses.chunk_terms import chunk_autograd, chunk_fused
from lightning_kd.losses.divergences import get_divergence
from lightning_kd.losses.logits import LogitObjective
from lightning_kd.losses.topk import TopKTeacher, teacher_top_k
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer, load_teacher
from tests.conftest import ROOT, TINY_LLAMA, make_datamodule, make_module, make_trainer

VOCAB = 257  # the tiny teacher's (byte tokenizer)
TEACHER = TeacherSpec(path=None, config=dict(TINY_LLAMA))
STUDENT = StudentSpec(num_layers=2)


def write(directory: Path, corpus: Path, k: int, features: str | None = None, **data) -> Path:
    """A cache of the tiny teacher (as a float32 run loads it) over ``corpus``, with the
    teacher layers ``features`` maps for the 2-layer student."""
    teacher = load_teacher(TEACHER, "32-true")
    datamodule = make_datamodule([corpus], **data)
    datamodule.setup()
    paths = []
    if features:
        paths = mapped_paths(DistillConfig(features=features), STUDENT, teacher, "causal_lm")[0]
    spec = CacheSpec(k=k, shard_blocks=4)
    write_cache(teacher, datamodule.tokenizer, datamodule, spec, directory, features=paths)
    return directory


def fit(corpus: Path, steps: int = 4, precision: str = "32-true", **distill):
    module = make_module(TEACHER, **distill)
    trainer = make_trainer(
        max_steps=steps, val_check_interval=steps, limit_val_batches=2, precision=precision
    )
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


def test_a_bf16_mixed_run_trains_from_a_cache(corpus, tmp_path) -> None:
    """What ``auto`` picks on a CPU with native bf16: the records are read under CPU autocast,
    whose stack once refused their fp16 log-probs, so the default run failed at its first
    validation there."""
    cache = write(tmp_path / "cache", corpus, k=16)
    _, trainer = fit(corpus, steps=2, precision="bf16-mixed", teacher_cache=str(cache))
    assert torch.isfinite(trainer.callback_metrics["val/ppl"])
    assert torch.isfinite(trainer.callback_metrics["val/kl"])


@pytest.mark.parametrize("features", [None, "uniform"])
def test_a_full_cache_gives_online_kds_loss_and_gradients(corpus, tmp_path, features) -> None:
    """One micro-batch through two distillers, one online, one from a k = vocabulary cache
    (with the mapped layers' outputs): the same objective, feature term and student gradients
    (to the stored log-probs' fp16 and features' bf16 rounding)."""
    cache = write(tmp_path / "cache", corpus, k=VOCAB, features=features)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    results = []
    for teacher_cache in (None, str(cache)):
        distill = DistillConfig(teacher_cache=teacher_cache, compile=False, features=features)
        distiller = Distiller.from_specs(
            TEACHER, STUDENT, distill, byte_tokenizer(), "32-true", datamodule
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
    if features:
        torch.testing.assert_close(cached_sums.features, online_sums.features, rtol=1e-2, atol=0)
    for got, want in zip(cached_grads, online_grads, strict=True):
        assert (got - want).norm() <= 1e-2 * want.norm()


def test_a_batch_whose_rows_are_not_their_blocks_is_refused(corpus, tmp_path) -> None:
    """Records are found by ``block_index`` alone: a row given another index (swapped rows, an
    index one off, one beyond the split) or a training batch evaluated against the validation
    split's records would read another block's teacher without a word."""
    cache = write(tmp_path / "cache", corpus, k=4)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    distill = DistillConfig(teacher_cache=str(cache), compile=False)
    distiller = Distiller.from_specs(
        TEACHER, STUDENT, distill, byte_tokenizer(), "32-true", datamodule
    )
    batch = next(iter(datamodule.train_dataloader()))
    distiller(batch)
    distiller(
        batch
        | {"input_ids": batch["input_ids"][:, :9]}
        | {key: batch[key][:, :9] for key in ("attention_mask", "labels")}
    )  # a truncated batch is its blocks' start: their records are cut too
    index = batch["block_index"]
    for wrong in (index.flip(0), index + 1, index + len(datamodule.train_examples)):
        with pytest.raises(
            ValueError, match=r"row \d of the batch has 'block_index' \d+, .*'train'"
        ):
            distiller(batch | {"block_index": wrong})
    with pytest.raises(ValueError, match="'val' split .* validation batches .* to evaluate"):
        distiller.evaluate(batch)
    distiller.evaluate(next(iter(datamodule.val_dataloader())))
    # Probe 51: a scored row of no block (-1) read block 0's records without a word; a
    # malformed index, or rows padded past the block, were raw torch errors.
    rows = len(index)
    unscored = {"labels": batch["labels"].masked_fill(index.unsqueeze(1) == index[0], -100)}
    distiller(batch | unscored | {"block_index": index.masked_fill(index == index[0], -1)})
    with pytest.raises(ValueError, match=r"row 0 of the batch has 'block_index' -1 \(no block"):
        distiller(batch | {"block_index": index.masked_fill(index == index[0], -1)})
    malformed = (index[:1], index.float(), index.unsqueeze(1), index.tolist())
    for wrong in malformed:
        with pytest.raises(ValueError, match=rf"'block_index' must be a tensor of {rows} integers"):
            distiller(batch | {"block_index": wrong})
    width = batch["input_ids"].shape[1]
    longer = {
        key: torch.nn.functional.pad(batch[key], (0, 8)) for key in ("input_ids", "attention_mask")
    }
    longer["labels"] = torch.nn.functional.pad(batch["labels"], (0, 8), value=-100)
    with pytest.raises(
        ValueError, match=rf"have {width + 8} positions, the cache's blocks {width}"
    ):
        distiller(batch | longer)


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


def test_an_unchunked_run_from_a_cache_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs distill.chunked=true"):
        DistillConfig(teacher_cache=str(tmp_path), chunked=False)


@pytest.mark.slow  # 45 s of CLI runs; the in-process feature tests above cover it by default
def test_the_command_line_writes_features_and_trains_from_them(corpus, tmp_path: Path) -> None:
    """``lightning-kd cache cache.features=true`` stores the mapped teacher layers;
    ``python run.py distill.teacher_cache=`` trains from them with no teacher; a run mapping
    features the cache lacks is refused with the command that writes them."""
    smoke = ["debug=smoke", "distill.features=uniform", f"data.files=[{corpus}]"]
    written = command("cache", *smoke, "cache.features=true", f"hydra.run.dir={tmp_path}/c")
    assert written.returncode == 0, written.stderr[-3000:]
    run = command(
        "run", *smoke, f"distill.teacher_cache={tmp_path}/c", f"hydra.run.dir={tmp_path}/r"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["after"]["val/features"] < summary["before"]["val/features"]
    assert summary["teacher_ppl"] > 0
    plain = command("cache", *smoke[::2], "distill.features=null", f"hydra.run.dir={tmp_path}/p")
    assert plain.returncode == 0, plain.stderr[-3000:]
    refused = command(
        "run", *smoke, f"distill.teacher_cache={tmp_path}/p", f"hydra.run.dir={tmp_path}/x"
    )
    assert refused.returncode != 0
    assert "the cache does not hold" in refused.stderr and "cache.features=true" in refused.stderr


def command(verb: str, *overrides: str) -> subprocess.CompletedProcess:
    program = ["run.py"] if verb == "run" else ["-m", "lightning_kd", verb]
    return subprocess.run(
        [sys.executable, *program, *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


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


def test_a_lora_student_trains_from_a_cache_as_it_does_online(corpus, tmp_path) -> None:
    """A LoRA student reads the cache like a full one: the same objective and adapter gradients
    as online (to the records' fp16 rounding), only adapters trainable, no teacher held."""
    cache = write(tmp_path / "cache", corpus, k=VOCAB)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    lora = StudentSpec(num_layers=2, lora={"r": 4, "alpha": 8})
    results = []
    for teacher_cache in (None, str(cache)):
        distill = DistillConfig(teacher_cache=teacher_cache, compile=False)
        torch.manual_seed(0)  # the same adapter initialisation in both
        distiller = Distiller.from_specs(
            TEACHER, lora, distill, byte_tokenizer(), "32-true", datamodule
        )
        objective, _ = distiller(batch)
        objective.backward()
        named = {n: p for n, p in distiller.student.named_parameters() if p.requires_grad}
        assert named and all("lora_" in name for name in named)
        results.append((distiller.teacher, objective, [p.grad for p in named.values()]))
    (online_teacher, online, online_grads), (cached_teacher, cached, cached_grads) = results
    assert cached_teacher is None and online_teacher is not None
    torch.testing.assert_close(cached, online, rtol=1e-4, atol=0)
    for got, want in zip(cached_grads, online_grads, strict=True):
        assert (got - want).norm() <= 1e-2 * want.norm() + 1e-8


def test_the_modules_a_lora_student_maps_are_found_on_its_plain_model() -> None:
    """A LoRA student with pairs naming its modules (``model.layers.1.mlp.up_proj``) was refused
    before a cache was written: the paths were looked up on the PeftModel, where they are
    ``base_model.model.model....``; the distiller runs the plain model, as the cache now does."""
    pytest.importorskip("peft")
    teacher = load_teacher(TEACHER, "32-true")
    features = [{"student": "model.layers.1.mlp.up_proj", "teacher": "model.layers.3"}]
    lora = StudentSpec(num_layers=2, lora={"r": 4, "alpha": 8})
    paths = mapped_paths(DistillConfig(features=features), lora, teacher, "causal_lm")
    assert paths == (["model.layers.3"], ["model.layers.3"])
