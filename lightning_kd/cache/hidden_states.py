"""The teacher's mapped hidden states in a cache (``cache.features=true``): which modules, and
their outputs captured during the writer's one teacher forward per batch.

The capture is the distiller's own (:class:`~lightning_kd.models.capture.ModuleCapture`):
armed around the forward, read and cleared right after, an output that did not appear an error.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from lightning_kd.cache.format import FEATURE_DTYPE, FEATURE_PREFIX
from lightning_kd.models.capture import ModuleCapture
from lightning_kd.models.layer_pairs import configured_pairs, repair_pairs
from lightning_kd.models.student import build_student


def mapped_paths(
    distill: Any, student_spec: Any, teacher: nn.Module, task: str
) -> tuple[list[str], list[str]]:
    """The teacher modules whose outputs a run of ``distill`` reads for the student
    ``student_spec`` builds — those ``distill.features`` maps (``uniform`` and ``spans`` depend on
    which teacher layers the student copies) and those the block-wise repair reads — and of
    those, the ones ``distill.features`` maps; from one student built."""
    if not distill.features and not distill.blockwise_passes:
        raise ValueError(
            "cache.features=true stores the teacher modules distill.features maps (and the "
            "block-wise repair reads), and neither is set; set them as the training run will "
            "(e.g. distill.features=spans), or cache.features=false"
        )
    # Without LoRA: its PeftModel's paths are not the ones distill.features names (the
    # distiller runs the unwrapped model), and adapters change no path.
    models = build_student(replace(student_spec, lora=None), teacher, task)
    mapped = configured_pairs(distill, models.student, teacher, models.layer_map)
    repaired = repair_pairs(distill, models.student, teacher, models.layer_map)
    every = sorted({pair.teacher for pair in mapped + repaired})
    return every, sorted({pair.teacher for pair in mapped})


class FeatureRecorder:
    """Records ``paths`` of ``teacher`` over a shard's batches into its stored tensors."""

    def __init__(self, teacher: nn.Module, paths: list[str]) -> None:
        self.capture = ModuleCapture(teacher, paths, "teacher") if paths else None

    def armed(self):
        """Around the teacher's forward: the capture armed (records stay for :meth:`store`)."""
        return nullcontext() if self.capture is None else self.capture.arm()

    def store(self, out: dict[str, Tensor], first: int, block_size: int) -> None:
        """Move the captured outputs of the batch whose first block is ``first`` into ``out``."""
        if self.capture is None:
            return
        for path, value in self.capture.pop().items():
            name = FEATURE_PREFIX + path
            if name not in out:
                blocks = out["lengths"].shape[0]
                out[name] = torch.zeros(blocks, block_size, value.shape[-1], dtype=FEATURE_DTYPE)
            rows, length = value.shape[:2]
            value = value.to(FEATURE_DTYPE).cpu()
            # Positions past a short block's end are padding: zeros, whatever the teacher said.
            lengths = out["lengths"][first : first + rows]
            value = value.masked_fill((torch.arange(length) >= lengths.unsqueeze(-1))[..., None], 0)
            out[name][first : first + rows, :length] = value

    def remove(self) -> None:
        if self.capture is not None:
            self.capture.remove()
