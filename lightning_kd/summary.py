"""What a run reports at the end: a timer for the training loop and the summary table."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from lightning.pytorch import Callback, LightningModule, Trainer


class TrainTimer(Callback):
    """Wall time spent in training batches (validation and checkpointing excluded)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start: float | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None


@dataclass
class RunSummary:
    """The figures a run ends with; ``before``/``after`` are validation metrics."""

    teacher_ppl: float | None
    student_ppl_before: float | None
    student_ppl_after: float
    agreement_before: float | None
    agreement_after: float
    kl_before: float | None
    kl_after: float
    steps: int
    train_tokens: int
    train_seconds: float
    wall_seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.train_tokens / self.train_seconds if self.train_seconds else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}

    def markdown(self) -> str:
        """The summary as a markdown table (also what the console shows)."""

        def fmt(value: float | None, digits: int = 2) -> str:
            return "—" if value is None else f"{value:.{digits}f}"

        rows = [
            ("teacher perplexity (val)", fmt(self.teacher_ppl), ""),
            (
                "student perplexity (val)",
                fmt(self.student_ppl_before),
                fmt(self.student_ppl_after),
            ),
            (
                "top-1 agreement with teacher",
                fmt(self.agreement_before, 3),
                fmt(self.agreement_after, 3),
            ),
            ("KL(teacher ‖ student) per token", fmt(self.kl_before, 3), fmt(self.kl_after, 3)),
            ("optimizer steps", "", str(self.steps)),
            ("training tokens", "", str(self.train_tokens)),
            ("tokens/s (training)", "", f"{self.tokens_per_second:.0f}"),
            ("wall time (s)", "", f"{self.wall_seconds:.1f}"),
        ]
        lines = ["| | before | after |", "|---|---:|---:|"]
        lines += [f"| {name} | {before} | {after} |" for name, before, after in rows]
        return "\n".join(lines)
