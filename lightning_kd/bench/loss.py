"""The benchmark's loss-only sweep, in the process that runs it: the logit loss (forward KL + CE)
forward and backward at vocab 49152, full-logit against chunked, over rising token counts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from lightning_kd.bench.measure import current_mb, peak_mb, release_free_memory, reset_peak, timed

LOSS_TOKENS = (512, 2048, 8192)
QUICK_LOSS_TOKENS = (512, 2048)
"""``--quick``: the full-logit loss at 8,192 tokens alone takes ~14 GB and a minute and a half on
a CPU; the quick check stops at 2,048."""
LOSS_VOCAB, LOSS_HIDDEN = 49152, 576


def loss_step(tokens: int, chunked: bool, device: torch.device, compile: bool) -> Callable:
    """Forward + backward of the logit loss (forward KL + CE, weights 0.5) over the first
    ``count`` of ``tokens`` seeded random hidden states, full-logit or chunked."""
    from lightning_kd.losses import get_divergence
    from lightning_kd.losses.chunked import OutputHead, chunked_distillation_sums
    from lightning_kd.losses.logits import LogitObjective, logit_distillation_sums

    generator = torch.Generator().manual_seed(0)

    def tensor(*shape: int, grad: bool = False) -> torch.Tensor:
        value = torch.randn(*shape, generator=generator).to(device) * 0.05
        return value.requires_grad_(grad)

    hidden, weight = (
        tensor(1, tokens, LOSS_HIDDEN, grad=True),
        tensor(LOSS_VOCAB, LOSS_HIDDEN, grad=True),
    )
    teacher_hidden, teacher_weight = tensor(1, tokens, LOSS_HIDDEN), tensor(LOSS_VOCAB, LOSS_HIDDEN)
    labels = torch.randint(0, LOSS_VOCAB, (1, tokens), generator=generator).to(device)
    divergence = get_divergence("forward_kl")

    def step(count: int = tokens) -> None:
        student_hidden, targets = hidden[:, :count], labels[:, :count]
        if chunked:
            objective, _ = chunked_distillation_sums(
                student_hidden,
                OutputHead(weight),
                teacher_hidden[:, :count],
                OutputHead(teacher_weight),
                targets,
                LogitObjective(divergence, 1.0, 0.5, 0.5),
                compile=compile,
            )
        else:
            with torch.no_grad():
                teacher_logits = teacher_hidden[:, :count] @ teacher_weight.T
            logits = student_hidden @ weight.T
            sums = logit_distillation_sums(logits, teacher_logits, targets, divergence)
            objective = 0.5 * sums.kd + 0.5 * sums.ce
        objective.backward()
        hidden.grad = weight.grad = None

    return step


def run_loss(tokens: int, chunked: bool, args: argparse.Namespace) -> dict:
    """Memory and time of the logit loss alone (forward + backward) at vocab 49152."""
    device = torch.device(args.device)
    step = loss_step(tokens, chunked, device, compile=args.compile)
    # Warm-up: allocator pools, kernel selection, the chunked loss's compile. --quick warms up on
    # a short slice: the compiled loss is shape-generic, so a few tokens pay its one-time cost.
    step(min(tokens, 64) if args.quick else tokens)
    release_free_memory()
    baseline = current_mb(device)
    reset_peak(device)
    seconds = timed(step, device, 0, args.loss_repeats)
    return {
        "tokens": tokens,
        "chunked": chunked,
        "loss_mb": max(peak_mb(device) - baseline, 0.0),
        "step_s": seconds,
    }
