"""Block-wise repair: each student layer first learns, alone, the teacher span it replaces.

A student copied from teacher layers 0, 6, 12, 17, 23, 29 starts with every layer but the first
reading a hidden state its weights never saw (teacher layer 6 was trained on layer 5's output; in
the student it gets layer 0's), and its perplexity is in the millions. ``distill.blockwise_passes``
passes over the training blocks, before the end-to-end objective, teach every student layer j to
map the teacher's hidden state *entering* its span to the state *leaving* it — the end of the span,
as ``distill.features=spans`` pairs them (``features.span_ends``) — by cosine distance on the
scored positions. All layers learn at once, in one forward of the student in which layer j
(j ≥ 1) is fed the teacher's state instead of layer j − 1's output: no gradient crosses layers,
so each learns its span independently, as in LLM-Streamline's layer replacement (Chen et al.,
2024). The teacher's states come from the teacher cache (which then stores those layers' outputs)
or from the teacher's own forward without a graph; no logits or vocabulary-sized work are
involved, so a repair step costs about a third of a training step. The repair has its own hooks,
armed around its own forwards and cleared by the end of each step (``capture.py``).

Only layers whose span holds more than one teacher layer and whose weights train are repaired (the
last layer, copied from the teacher's last and fed its input, already is what it stands for).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_kd.distill.batches import checked_batch
from lightning_kd.distill.repair_checks import check_plan, diverged
from lightning_kd.distill.repair_progress import RepairProgress, RepairReport, all_reduced
from lightning_kd.losses.features import get_feature_loss, masked_feature_sum
from lightning_kd.models.capture import ModuleCapture, capture_step, resolve_module
from lightning_kd.models.heads import final_hidden
from lightning_kd.models.layer_pairs import REPAIR_LOSS, span_lengths
from lightning_kd.utils.stopping import STOP, Interrupted

WARMUP = 0.05
"""Share of the repair's steps over which its learning rate rises linearly (then cosine to 0)."""


@dataclass(frozen=True)
class Span:
    """One student layer to repair: fed ``source``'s output (None: the embeddings, unchanged),
    trained to reproduce ``target``'s — both teacher modules."""

    student: str
    source: str | None
    target: str

    @property
    def teacher_paths(self) -> list[str]:
        return [self.target] if self.source is None else [self.source, self.target]


def repair_plan(distiller) -> list[Span]:
    """The layers to repair, from the distiller's :func:`repair_pairs` (a clear error where
    there can be none)."""
    if distiller.layer_map is None:
        raise ValueError(
            "distill.blockwise_passes trains each student layer on the teacher span it stands "
            "for, which needs a student copied from teacher layers (student.num_layers or "
            "student.layers), not one from student.path or student.config; set "
            "distill.blockwise_passes=0"
        )
    if distiller.adapter is not None:
        raise ValueError(
            "distill.blockwise_passes with a LoRA student: the repair trains whole layers; set "
            "distill.blockwise_passes=0 or drop student.lora"
        )
    pairs = distiller.repair_pairs
    depth = int(pairs[-1].teacher.rsplit(".", 1)[1]) + 1 if pairs else 0  # the last span's end
    # The first reads the embeddings: its span starts at teacher layer 0 (probe 43).
    lengths = span_lengths(distiller.layer_map, depth) if pairs else []
    spans, frozen = [], []
    for j, (pair, length) in enumerate(zip(pairs, lengths, strict=True)):
        layer = resolve_module(distiller.student, pair.student, "student")
        trains = any(p.requires_grad for p in layer.parameters())
        if length > 1 and not trains:
            frozen.append(pair.student)
        elif length > 1:
            source = pairs[j - 1].teacher if j > 0 else None
            spans.append(Span(pair.student, source, pair.teacher))
    check_plan(distiller, spans, frozen)
    return spans


@contextmanager
def fed_inputs(student: nn.Module, spans: list[Span], states: dict[str, Tensor]) -> Iterator[None]:
    """Within: each span's student layer reads its source's teacher state instead of its input
    (for every call, so an activation checkpointing re-forward reads the same)."""

    def feed(state: Tensor):
        def hook(module, args, kwargs):
            if args:
                return (state.to(args[0].dtype), *args[1:]), kwargs
            return args, kwargs | {"hidden_states": state.to(kwargs["hidden_states"].dtype)}

        return hook

    handles = [
        resolve_module(student, span.student, "student").register_forward_pre_hook(
            feed(states[span.source]), with_kwargs=True
        )
        for span in spans
        if span.source is not None
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class Captures:
    """The repair's own hooks: the repaired student layers, and (online) the teacher modules
    that feed and end their spans; the distiller's feature captures stay disarmed."""

    student: ModuleCapture
    teacher: ModuleCapture | None

    @classmethod
    def of(cls, distiller, spans: list[Span]) -> Captures:
        student = ModuleCapture(distiller.student, [s.student for s in spans], "student")
        if distiller.repair_teacher is None:
            return cls(student, None)
        paths = sorted({path for span in spans for path in span.teacher_paths})
        return cls(student, ModuleCapture(distiller.repair_teacher, paths, "teacher"))

    def all(self) -> list[ModuleCapture]:
        return [self.student] + ([self.teacher] if self.teacher is not None else [])

    def remove(self) -> None:
        for capture in self.all():
            capture.remove()


def teacher_states(distiller, capture: ModuleCapture | None, batch: dict[str, Tensor]):
    """The teacher's outputs at the spans' modules for ``batch``: cached, or from its forward
    (``student.source``'s model's, where the student was copied from that model)."""
    if distiller.cached_teacher is not None and distiller.repair_source is None:
        return distiller.cached_teacher.records(batch, "train")[1]
    with capture.arm(), torch.no_grad():
        final_hidden(distiller.repair_teacher, batch, logits=False)
    return capture.pop()


def repair_sums(
    distiller, spans: list[Span], batch: dict[str, Tensor], captures: Captures
) -> tuple[list[Tensor], Tensor]:
    """Each span's loss summed over the batch's scored positions (differentiable in its student
    layer only), and the count of those positions. A hand-built batch is checked and its pads
    unscored, as a step reads it: the repair scored them (probe 51)."""
    batch = checked_batch(batch, distiller.task.name, distiller.student, distiller.teacher_rows)
    mask = distiller.task.scored_mask(batch)
    with capture_step(*captures.all()):
        states = teacher_states(distiller, captures.teacher, batch)
        with fed_inputs(distiller.student, spans, states), captures.student.arm():
            final_hidden(distiller.student, batch, logits=False)
        outputs = captures.student.pop()
    loss = get_feature_loss(REPAIR_LOSS)
    sums = [masked_feature_sum(outputs[s.student], states[s.target], mask, loss) for s in spans]
    return sums, mask.sum()


def schedule(steps: int) -> Callable[[int], float]:
    """Linear warmup over :data:`WARMUP` of ``steps``, then cosine decay to 0."""
    warmup = max(1, round(WARMUP * steps))
    return lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))


def step(total: Tensor, count: Tensor, params: list[Tensor], optimizer) -> bool:
    """One optimizer step on the global batch's token mean: each rank's loss sum over all ranks'
    tokens, gradients summed over ranks — one process's step over the same blocks. False, and
    no step, where the loss or the gradients are not finite (every rank's alike: summed)."""
    if not torch.isfinite(all_reduced(total.detach())):
        return False
    optimizer.zero_grad(set_to_none=True)
    (total / all_reduced(count.double()).clamp(min=1)).backward()
    for param in params:
        if param.grad is not None:
            param.grad = all_reduced(param.grad)
    if not torch.isfinite(torch.nn.utils.clip_grad_norm_(params, 1.0)):
        return False  # clipped, they would write NaN into the weights a keep saves
    optimizer.step()
    return True


def repaired_parameters(distiller, spans: list[Span]) -> dict[str, nn.Parameter]:
    """The trainable parameters of the repaired student layers, by their path in the student."""
    return {
        f"{span.student}.{name}": param
        for span in spans
        for name, param in resolve_module(
            distiller.student, span.student, "student"
        ).named_parameters()
        if param.requires_grad
    }


def optimization(
    params: dict[str, nn.Parameter], lr: float, report: RepairReport, resumed: Resumable | None
):
    """The repair's AdamW, its schedule over ``report.steps`` and its progress: a stopped
    repair's, restored, where ``resumed`` holds one."""
    optimizer = torch.optim.AdamW(list(params.values()), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(report.steps))
    if resumed is None or resumed.saved is None:
        return optimizer, scheduler, RepairProgress(report)
    saved, rank = resumed.saved, resumed.rank
    return optimizer, scheduler, RepairProgress.restore(saved, params, optimizer, scheduler, rank)


def repair(
    distiller,
    passes: Iterable[Iterable[dict[str, Tensor]]],
    steps: int,
    lr: float,
    forward_context: Callable[[], AbstractContextManager] = nullcontext,
    stop: Callable[[], bool] | None = None,
    resumed: Resumable | None = None,
) -> RepairReport:
    """Repair the distiller's student in place over ``passes`` (each an iterable of batches on the
    student's device; ``steps`` batches in all) with AdamW at ``lr``; returns the report.

    ``stop()``, asked after each step (on every rank: it may be a collective), says whether to
    stop: it raises :class:`~lightning_kd.utils.stopping.Interrupted`. ``resumed`` goes on from
    a stopped repair's saved progress (``passes`` then holds the batches it had left) and keeps
    this one's, every ``resumed.every`` steps and at a stop."""
    spans = repair_plan(distiller)
    report = RepairReport([s.student for s in spans], 0, steps)
    if not spans:
        return report
    params = repaired_parameters(distiller, spans)
    optimizer, scheduler, progress = optimization(params, lr, report, resumed)
    start, was_training = time.perf_counter() - progress.report.seconds, distiller.training
    captures = Captures.of(distiller, spans)
    distiller.train()
    try:
        for batches in passes:
            for batch in batches:
                with forward_context():
                    sums, count = repair_sums(distiller, spans, batch, captures)
                sums = torch.stack(sums)
                if not step(sums.sum(), count, list(params.values()), optimizer):
                    raise diverged(progress.done + 1, lr, spans)
                scheduler.step()
                progress.add(sums, count)
                asked = stop is not None and stop()
                if resumed is not None and resumed.due(progress.done, steps, asked):
                    seconds = time.perf_counter() - start
                    resumed.keep(progress.state(params, optimizer, scheduler, seconds))
                if asked:
                    where = f"after step {progress.done} of {steps}"
                    raise Interrupted(STOP.signum or signal.SIGTERM, STAGE, where)
            progress.end_pass()
    finally:
        optimizer.zero_grad(set_to_none=True)
        captures.remove()
        distiller.train(was_training)
    report = progress.report
    report.steps, report.seconds = progress.done, time.perf_counter() - start
    return report


STAGE = "in the block-wise repair"
"""Where a stop in the repair says it stopped."""


@dataclass
class Resumable:
    """How a repair keeps its progress, and the progress a stopped one left."""

    keep: Callable[[dict], None]
    """Called with :meth:`RepairProgress.state` on every rank (it is a collective)."""
    every: int
    """Steps between keeps (besides the one at a stop)."""
    saved: dict | None = None
    """A stopped repair's progress to go on from, or None."""
    rank: int = 0

    def due(self, done: int, steps: int, stopping: bool) -> bool:
        """Whether the progress is kept after step ``done`` of ``steps``: every ``every``
        steps, at the end (a stop before training's first step loses none), at a stop."""
        return stopping or done % self.every == 0 or done == steps
