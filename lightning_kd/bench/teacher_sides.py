"""Each teacher's share of a several-teacher step (the ``two_teachers`` scenario): the weights it
keeps resident and the time of its side of the step alone — its forward and its records (across
tokenizers: re-tokenisation, alignment and top k; from a cache: the records read) — what each
teacher adds to the step whose memory and time the scenario measures whole."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lightning_kd.bench.measure import timed


def weights_mb(model: nn.Module | None) -> float:
    """The bytes of ``model``'s parameters and buffers, in MB (0 for no model: a cached teacher)."""
    if model is None:
        return 0.0
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def teacher_sides(
    distiller: nn.Module,
    batch: dict,
    device: torch.device,
    autocast: torch.autocast,
    repeats: int,
) -> list[dict]:
    """``{name, source, weights_mb, side_s}`` of each teacher of ``distiller``'s step on
    ``batch``: the distiller's own first, then its other teachers in order."""
    sides: list[tuple[str, str, nn.Module | None, Callable[[], object]]] = []
    source = "cache" if distiller.cached_teacher is not None else "online"
    if distiller.cross is not None:
        source += ", cross-tokenizer"
    sides.append(
        (
            distiller.teacher_name,
            source,
            distiller.teacher,
            lambda: distiller.teacher_output(batch, "train"),
        )
    )
    extra = distiller.extra_teachers
    temperature = distiller.objective.temperature
    for index, name in enumerate(extra.names if extra is not None else ()):
        model = extra.model(index)
        source = "online" if model is not None else "cache"
        if extra.crosses[index] is not None:
            source += ", cross-tokenizer"

        def side(index: int = index) -> object:
            return extra.output(index, batch, temperature)

        sides.append((name, source, model, side))
    rows = []
    for name, source, model, side in sides:

        def run(side: Callable[[], object] = side) -> None:
            with torch.no_grad(), autocast:
                side()

        seconds = timed(run, device, 1, repeats)
        rows.append(
            {"name": name, "source": source, "weights_mb": weights_mb(model), "side_s": seconds}
        )
    return rows
