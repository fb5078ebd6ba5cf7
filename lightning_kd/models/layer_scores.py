"""How much each teacher layer matters, measured on calibration batches; which layers to keep.

- **block influence** (ShortGPT): ``1 − cos(layer input, layer output)`` per token, averaged —
  how much a layer turns the residual stream. Layer outputs come from a
  :class:`~lightning_kd.models.capture.ModuleCapture` on every decoder layer; a layer's input is the
  previous layer's output, the first layer's the model's ``hidden_states[0]`` (its embeddings as
  the model combines them).
- **skip KL**: ``KL(teacher ‖ teacher without layer i)`` per token — what the output loses when
  the layer alone is left out; the pruned model is built by ``student_from_teacher``.
- **greedy KL**: layers removed one at a time, each time the one whose removal raises the KL of
  the pruned model least; the score is that KL when the layer went (kept layers: none). It sees
  what removing many layers together does, at about ``L²/2`` pruned forwards instead of ``L``.

This module knows torch and transformers, not Lightning or the config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from lightning_kd.losses.divergences import forward_kl
from lightning_kd.models.capture import ModuleCapture
from lightning_kd.models.layer_config import decoder_layers
from lightning_kd.models.loading import IMPORTANCE_SCORES
from lightning_kd.models.student import student_from_teacher
from lightning_kd.utils.stopping import STOP

SCORES = IMPORTANCE_SCORES
"""What ``student.importance`` may rank by."""

Batch = dict[str, Tensor]


@dataclass
class Ranking:
    """Every layer's scores, the order they give and the layers kept."""

    by: str
    """The score that chose the kept layers (one of :data:`SCORES`)."""
    kept: list[int]
    """The teacher layers the student copies, in depth order."""
    order: list[int]
    """Every layer, most important first (by ``by``; first/last first when kept regardless)."""
    scores: dict[str, list[float | None]] = field(default_factory=dict)
    """Score name → one value per layer (None where a score was not computed for a layer)."""
    tokens: int = 0
    """Calibration tokens the scores were measured on."""
    seconds: float = 0.0
    """Wall time the scoring took."""

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Ranking:
        return cls(**{key: data[key] for key in data if key in cls.__dataclass_fields__})

    def table(self) -> str:
        """The per-layer table (markdown): layer, each score, rank, kept."""
        names = list(self.scores)
        rank = {layer: position + 1 for position, layer in enumerate(self.order)}
        lines = [
            "| layer | " + " | ".join(names) + " | rank | kept |",
            "|---:|" + "---:|" * len(names) + "---:|:---:|",
        ]
        for layer in range(len(self.order)):
            values = [self.scores[name][layer] for name in names]
            cells = ["—" if value is None else f"{value:.4f}" for value in values]
            mark = "✓" if layer in self.kept else ""
            lines.append(f"| {layer} | " + " | ".join(cells) + f" | {rank[layer]} | {mark} |")
        return "\n".join(lines)


@torch.no_grad()
def teacher_pass(
    teacher: PreTrainedModel, batches: list[Batch]
) -> tuple[list[float], list[Tensor]]:
    """Block influence of every layer over ``batches``, and the teacher's log-probabilities of
    each batch (what :func:`pruned_kl` compares against)."""
    path, layers = decoder_layers(teacher)
    capture = ModuleCapture(teacher, [f"{path}.{i}" for i in range(len(layers))], "teacher")
    totals = torch.zeros(len(layers), dtype=torch.float64)
    count, log_probs = 0, []
    try:
        for batch in batches:
            with capture.arm():
                out = teacher(**model_inputs(batch), output_hidden_states=True)
            outputs = list(capture.pop().values())
            inputs = [out.hidden_states[0], *outputs[:-1]]
            mask = batch["attention_mask"].bool()
            for i, (before, after) in enumerate(zip(inputs, outputs, strict=True)):
                cosine = F.cosine_similarity(before.float(), after.float(), dim=-1)
                totals[i] += (1 - cosine)[mask].double().sum()
            count += int(mask.sum())
            log_probs.append(out.logits.float().log_softmax(-1))
    finally:
        capture.remove()
    return (totals / count).tolist(), log_probs


def model_inputs(batch: Batch) -> Batch:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


@torch.no_grad()
def pruned_kl(
    teacher: PreTrainedModel, keep: list[int], batches: list[Batch], teacher_logp: list[Tensor]
) -> float:
    """Per-token ``KL(teacher ‖ teacher with only layers keep)`` over ``batches``."""
    STOP.check("ranking the teacher's layers", detail="the ranking starts again with the run")
    pruned = student_from_teacher(teacher, keep).to(teacher.dtype).eval()
    total, count = 0.0, 0
    for batch, target in zip(batches, teacher_logp, strict=True):
        logp = pruned(**model_inputs(batch)).logits.float().log_softmax(-1)
        mask = batch["attention_mask"].bool()
        total += float(forward_kl(logp, target)[mask].double().sum())
        count += int(mask.sum())
    return total / count


def greedy_trials(count: int, depth: int, fixed: int) -> int:
    """How many pruned teachers :func:`greedy_removal` scores going from ``depth`` layers down to
    ``count``, with ``fixed`` layers never removed (each round tries every other kept one)."""
    return sum(kept - fixed for kept in range(count + 1, depth + 1))


def greedy_removal(
    count: int,
    depth: int,
    removal_kl: Callable[[list[int]], float],
    fixed: tuple[int, ...] = (),
) -> list[float | None]:
    """Remove layers one at a time down to ``count``, each time the one whose removal gives the
    lowest ``removal_kl(remaining)``; that KL per removed layer (None for kept ones). Layers in
    ``fixed`` are never removed."""
    kept, score = list(range(depth)), [None] * depth
    while len(kept) > count:
        trials = {i: removal_kl([j for j in kept if j != i]) for i in kept if i not in fixed}
        weakest = min(trials, key=trials.get)
        kept.remove(weakest)
        score[weakest] = trials[weakest]
    return score


def top_layers(scores: list[float | None], count: int, keep_ends: bool) -> list[int]:
    """All layers ordered most important first: the first and last first when ``keep_ends``
    (and ``count`` ≥ 2), then by score, highest first; a kept greedy layer (None) ranks above any
    removed one. The first ``count`` are kept."""
    depth = len(scores)
    ends = [0, depth - 1] if keep_ends and count >= 2 and depth >= 2 else []

    def key(i: int) -> tuple[bool, float]:
        return (scores[i] is not None, -(scores[i] or 0.0))

    return ends + sorted((i for i in range(depth) if i not in ends), key=key)


def rank_layers(
    teacher: PreTrainedModel,
    batches: list[Batch],
    count: int,
    by: str = "skip_kl",
    keep_ends: bool = True,
    progress: bool = False,
) -> Ranking:
    """Score every layer of ``teacher`` on ``batches`` and keep the ``count`` most important by
    ``by`` (first and last always, with ``keep_ends``); ``progress`` shows a bar of the passes
    over ``batches`` (minutes of a CPU's time for SmolLM2's 30 layers, which said nothing)."""
    if by not in SCORES:
        raise ValueError(f"student.importance={by!r}; choose one of {list(SCORES)}")
    depth = teacher.config.num_hidden_layers
    fixed = (0, depth - 1) if keep_ends and count >= 2 and by == "greedy_kl" else ()
    total = 1 + depth + (greedy_trials(count, depth, len(fixed)) if by == "greedy_kl" else 0)
    with tqdm(total=total, desc="scoring layers", unit="pass", disable=not progress) as bar:
        influence, teacher_logp = teacher_pass(teacher, batches)
        bar.update(1)

        def removal_kl(keep: list[int]) -> float:
            kl = pruned_kl(teacher, keep, batches, teacher_logp)
            bar.update(1)
            return kl

        scores: dict[str, list] = {"block_influence": influence}
        scores["skip_kl"] = [removal_kl([j for j in range(depth) if j != i]) for i in range(depth)]
        if by == "greedy_kl":
            scores["greedy_kl"] = greedy_removal(count, depth, removal_kl, fixed)
    order = top_layers(scores[by], count, keep_ends)
    tokens = sum(int(batch["attention_mask"].sum()) for batch in batches)
    return Ranking(by=by, kept=sorted(order[:count]), order=order, scores=scores, tokens=tokens)
