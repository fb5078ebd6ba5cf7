"""Two processes over gloo (Lightning's DDP on CPUs) train the same student as one process."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.test_cli import run_cli


def documents(path: Path, count: int = 200) -> Path:
    """Documents of very different lengths: per-rank token counts differ in every batch."""
    rng = random.Random(0)
    words = [
        "the",
        "a",
        "teacher",
        "student",
        "layer",
        "token",
        "loss",
        "gradient",
        "window",
        "rank",
        "batch",
    ]
    with path.open("w") as handle:
        for _ in range(count):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 14)))
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def common(data: Path, per_rank_batch: int) -> list[str]:
    return [
        "debug=smoke",
        "teacher=tiny_gpt2",
        "teacher.dtype=float64",
        "student.dtype=float64",
        f"data.files=[{data}]",
        "data.pack=false",
        f"data.batch_size={per_rank_batch}",
        "trainer.max_steps=4",
        "trainer.accumulate_grad_batches=3",
        "trainer.gradient_clip_val=null",
        "distill.features=uniform",
        "+callbacks.probe={_target_: tests.helpers.LifecycleProbe}",
        "validate_before=false",
        # 11 validation documents: the second rank's share is evened out with an unscored copy.
        "data.val_fraction=0.055",
        "trainer.limit_val_batches=1.0",
    ]


# A student half the teacher's width (random init): every feature pair gets a projector, which
# DDP must reduce like any student parameter, without an unused-parameter search.
NARROW_STUDENT = "student.config={n_embd: 16, n_head: 2, n_layer: 2}"


# Block-wise repair first: each rank repairs on its share of every step's blocks,
# its gradients summed over ranks, so the repaired and then trained student is one process's.
REPAIRED = "distill.blockwise_passes=2"


# The cross-tokenizer path on the teacher's own tokenizer: each rank re-tokenises and aligns its
# share, and the records enter the same token sums (logits only: hidden states pair positions).
CROSS = ["distill.features=null", "distill.cross_tokenizer=always", "distill.cross_top_k=257"]
# A second teacher (another random GPT-2), half the divergence each.
SECOND = (
    "teachers=[{name: first, weight: 0.5}, {name: second, weight: 0.5, init_seed: 1, config: "
    "{model_type: gpt2, vocab_size: 257, n_embd: 32, n_layer: 4, n_head: 4, n_positions: 128, "
    "tie_word_embeddings: true, resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}}]"
)


# 41 blocks, 4 a global batch, 3 micro-batches a step: the 4th step ends the epoch on one
# block, which the ranks cannot share (Lightning's sampler trained a block twice there).
UNEVEN = ["data.max_train_examples=41"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "student",
    [
        [],
        [NARROW_STUDENT],
        ["student.lora={r: 4, alpha: 8}"],
        [REPAIRED],
        CROSS,
        ["distill.features=null", SECOND],
        UNEVEN,
    ],
    ids=["copied", "projected", "lora", "repaired", "cross_tokenizer", "two_teachers", "uneven"],
)
def test_two_ranks_equal_one_process_over_the_same_global_batches(
    tmp_path: Path, student: list[str]
) -> None:
    data = documents(tmp_path / "docs.jsonl")
    one, two = tmp_path / "one", tmp_path / "two"
    result = run_cli(*common(data, 4), *student, f"hydra.run.dir={one}")
    assert result.returncode == 0, result.stderr[-3000:]
    ddp = ("strategy=ddp", "trainer.devices=2", f"hydra.run.dir={two}")
    result = run_cli(*common(data, 2), *student, *ddp)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr  # token sums reduced already, evened out with copies
    assert "sync_dist=True" not in said and "Using `DistributedSampler`" not in said
    assert not list(tmp_path.glob("two*/two")), "one run directory, shared by both ranks"
    # rank 1 ran into that directory too (Hydra's rank job: hydra.job.name=train_ddp_process_1)
    # and left the record to rank 0: one .hydra/, written once the directory was claimed
    assert (two / ".hydra" / "config.yaml").is_file() and not list(two.glob("*/.hydra"))
    summary_one = json.loads((one / "summary.json").read_text())
    summary_two = json.loads((two / "summary.json").read_text())
    assert summary_one["train_tokens"] == summary_two["train_tokens"]
    if student == [REPAIRED]:
        repaired = [summary["blockwise"] for summary in (summary_one, summary_two)]
        assert repaired[0]["steps"] == repaired[1]["steps"] > 0
        assert repaired[1]["loss_last_pass"] == pytest.approx(repaired[0]["loss_last_pass"])
    single = load_file(one / "student" / "model.safetensors")
    ranks = load_file(two / "student" / "model.safetensors")
    assert summary_one["steps"] == summary_two["steps"] == 4 and summary_one["train_tokens"] > 0
    for key, value in single.items():
        torch.testing.assert_close(ranks[key], value, rtol=1e-9, atol=1e-12, msg=key)
    # Validation metrics are token sums over both ranks' shares: the one-process values.
    assert set(summary_one["after"]) == set(summary_two["after"])
    # LoRA: the trained weights agree to 1e-9 as for the others, but val/kl (2.6e-4 per token)
    # differed by 1.1e-7 relative, the repaired student's val/loss by 8.7e-8: one float32 step.
    # Lightning collects logged values in float32 (its result metrics take the default dtype),
    # so fp64 sums that differ in their last digits can round to neighbouring float32 values.
    # Two teachers' val/kl: 9.1e-8 relative, the same float32 rounding.
    rounded = (["student.lora={r: 4, alpha: 8}"], [REPAIRED], ["distill.features=null", SECOND])
    tolerance = 1e-6 if student in rounded else 1e-9
    for name, value in summary_one["after"].items():
        assert summary_two["after"][name] == pytest.approx(value, rel=tolerance), name
    # The projectors are trained state of the run, kept in its checkpoint (not in the export).
    single_state = torch.load(one / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    ranks_state = torch.load(two / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    projectors = sorted(key for key in single_state if key.startswith("distiller.projectors."))
    assert bool(projectors) == (student == [NARROW_STUDENT])
    for key in projectors:
        torch.testing.assert_close(ranks_state[key], single_state[key], rtol=1e-9, atol=1e-12)


def chats(path: Path, count: int = 120) -> Path:
    """Chat rows with prompts of very different lengths."""
    rng = random.Random(1)
    with path.open("w") as handle:
        for i in range(count):
            prompt = " ".join(
                rng.choice(["why", "a", "rank", "token"]) for _ in range(rng.randint(1, 9))
            )
            handle.write(json.dumps({"prompt": prompt, "completion": f"answer {i}"}) + "\n")
    return path


@pytest.mark.slow
def test_on_policy_completions_of_different_lengths_on_two_ranks_equal_one_process(
    tmp_path: Path,
) -> None:
    """distill.on_policy=1: every micro-batch is replaced by completions (a function of each
    prompt, so both layouts see the same ones) of 1 to 6 tokens. Their token counts differ per
    row, per rank and per micro-batch of the accumulation window; the trained student must be the
    one process's (fp64)."""
    template = tmp_path / "turns.jinja"  # short headers: rows fit the tiny GPT-2's 128 positions
    template.write_text(
        "{% for m in messages %}{{ m['role'][0] + ':' + m['content'] + '|' }}{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}"
    )
    data = chats(tmp_path / "chats.jsonl")
    shared = [
        "debug=smoke",
        "teacher=tiny_gpt2",
        "teacher.dtype=float64",
        "student.dtype=float64",
        "data=chat",
        f"data.files=[{data}]",
        f"data.chat_template={template}",
        "data.block_size=96",
        "trainer.max_steps=3",
        "trainer.accumulate_grad_batches=3",
        "trainer.gradient_clip_val=null",
        "distill.on_policy=1.0",
        "+callbacks.fixed={_target_: tests.helpers.FixedCompletions}",
        "validate_before=false",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    result = run_cli(*shared, "data.batch_size=4", f"hydra.run.dir={one}")
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = ["strategy=ddp", "trainer.devices=2", "data.batch_size=2"]
    result = run_cli(*shared, *ranks, f"hydra.run.dir={two}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary_one = json.loads((one / "summary.json").read_text())
    summary_two = json.loads((two / "summary.json").read_text())
    assert summary_one["train_tokens"] == summary_two["train_tokens"] > 0
    single = load_file(one / "student" / "model.safetensors")
    both = load_file(two / "student" / "model.safetensors")
    for key, value in single.items():
        torch.testing.assert_close(both[key], value, rtol=1e-9, atol=1e-12, msg=key)
