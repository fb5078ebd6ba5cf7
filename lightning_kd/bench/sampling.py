"""The on-policy scenarios' batches and timing: half-row prompts, every micro-batch sampled, the
sampling timed inside the step that calls it."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lightning_kd.bench.measure import synchronize

SAMPLING = ("on_policy", "interleaved")
"""Scenarios whose distiller samples each row's answer first: from the student alone, or
interleaved (``distill.on_policy_teacher_top_k``, the teacher vetoing the student's tokens)."""


def step_counts(name: str, args: argparse.Namespace) -> tuple[int, int]:
    """Untimed and timed steps: at least 3 of each where sampling sets the lengths, which vary
    from step to step, a new length's first steps paying one-off costs. ``--quick`` timed one
    step after one warm-up: sampling read as 4 % of a step 74x lightning_kd's, where 3 warm-ups
    and the median of 3 steps give 80 % of a step 6x lightning_kd's. ``--quick`` is a check
    that everything runs, not figures to quote: there they take its one and one, as the other
    scenarios do (their six steps were 20 of a ``--quick`` run's 32 minutes; probe 38)."""
    if name in SAMPLING and not getattr(args, "quick", False):
        return max(args.warmup, 3), max(args.repeats, 3)
    return args.warmup, args.repeats


def on_policy_overrides(args: argparse.Namespace, interleaved: bool = False) -> list[str]:
    """Every micro-batch sampled (λ = 1), completions of at most half a row: prompt + answer
    then fill at most the other scenarios' ``--seq`` tokens; interleaved: the teacher's top 25
    (speculative KD's choice) veto the student's tokens."""
    overrides = ["distill.on_policy=1", f"distill.on_policy_tokens={args.seq - args.seq // 2}"]
    return overrides + (["distill.on_policy_teacher_top_k=25"] if interleaved else [])


def prompted(batch: dict) -> dict:
    """``batch`` with its first half unlabelled: that half is the prompt on-policy KD completes."""
    labels = batch["labels"].clone()
    labels[:, : labels.shape[1] // 2] = -100
    return batch | {"labels": labels}


class TimedSampling:
    """The distiller's on-policy sampler, timed inside the step that calls it: each timed step's
    sampling is part of that step, so its share of the step is at most 1 by construction."""

    def __init__(self, on_policy, device: torch.device) -> None:
        self.on_policy, self.device = on_policy, device
        self.seconds: list[float] = []
        self.tokens: list[float] = []

    def replace(self, student, batch: dict, draw: int, step: int = 0, teacher=None) -> dict:
        """The sampler's own ``replace`` (its λ draw included), timed."""
        synchronize(self.device)
        start = time.perf_counter()
        sampled = self.on_policy.replace(student, batch, draw, step, teacher)
        synchronize(self.device)
        self.seconds.append(time.perf_counter() - start)
        prompt = batch["labels"].shape[1] // 2  # the half of each row before its answer (prompted)
        self.tokens.append(float((sampled["attention_mask"].sum(1) - prompt).float().mean()))
        return sampled

    def summary(self, repeats: int) -> dict:
        """The timed steps' (the last ``repeats``) median sampling time and tokens per row."""
        return {
            "sample_s": statistics.median(self.seconds[-repeats:]),
            "sampled_tokens": statistics.mean(self.tokens[-repeats:]),
        }
