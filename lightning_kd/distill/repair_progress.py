"""What a block-wise repair has done: its report, and the state a stopped one goes on from.

The repair runs before the first optimizer step, so no training checkpoint holds it: a run
stopped in it (a preempted job, SIGTERM) began it again from the copied layers, every time
(probe 47). :class:`RepairProgress` is all a repair needs to go on exactly where it stopped —
the repaired layers' weights, AdamW's and the schedule's state, the steps done and the current
pass's sums — as a plain dict (``training/repair.py`` keeps it in ``checkpoints/repair.pt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


def all_reduced(value: Tensor) -> Tensor:
    """The sum of ``value`` over ranks (itself outside ``torch.distributed``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        value = value.clone()
        torch.distributed.all_reduce(value)
    return value


@dataclass
class RepairReport:
    """What a repair did: per repaired layer, the mean loss over its first and its last pass."""

    layers: list[str]
    passes: int
    steps: int
    seconds: float = 0.0
    first: list[float] = field(default_factory=list)
    last: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "passes": self.passes,
            "steps": self.steps,
            "seconds": self.seconds,
            "layers": self.layers,
            "loss_first_pass": self.first,
            "loss_last_pass": self.last,
        }

    @classmethod
    def from_dict(cls, saved: dict) -> RepairReport:
        """The report :meth:`as_dict` wrote (a checkpoint keeps it for a resumed run)."""
        names = {"loss_first_pass": "first", "loss_last_pass": "last"}
        return cls(**{names.get(key, key): value for key, value in saved.items()})

    def line(self) -> str:
        losses = ", ".join(f"{a:.3f}→{b:.3f}" for a, b in zip(self.first, self.last, strict=True))
        return (
            f"blockwise repair: {len(self.layers)} student layers, {self.passes} passes "
            f"({self.steps} steps) in {self.seconds:.1f} s; feature loss per layer, first pass → "
            f"last: {losses}"
        )


@dataclass
class RepairProgress:
    """A repair's steps done, and the current pass's loss sums and token count on this rank."""

    report: RepairReport
    done: int = 0
    totals: Tensor | None = None
    tokens: Tensor | float = 0.0

    def add(self, sums: Tensor, count: Tensor) -> None:
        """One step's per-layer loss sums over ``count`` tokens."""
        self.totals = sums.detach().double() + (0 if self.totals is None else self.totals)
        self.tokens, self.done = self.tokens + count.double(), self.done + 1

    def state(
        self, params: dict[str, nn.Parameter], optimizer, scheduler, seconds: float
    ) -> dict[str, Any]:
        """What :meth:`restore` goes on from; the pass's sums are every rank's (summed here:
        a collective, asked of all ranks at one step), so one rank's copy holds them whole."""
        totals = None if self.totals is None else all_reduced(self.totals).cpu()
        return {
            "report": self.report.as_dict() | {"seconds": seconds},
            "done": self.done,
            "totals": totals,
            "tokens": float(all_reduced(torch.as_tensor(self.tokens, dtype=torch.float64))),
            "params": {name: p.detach().cpu().clone() for name, p in params.items()},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }

    @classmethod
    def restore(
        cls, saved: dict[str, Any], params: dict[str, nn.Parameter], optimizer, scheduler, rank: int
    ) -> RepairProgress:
        """The progress ``saved`` (:meth:`state`), its weights and optimizer state put back;
        the pass's sums on rank 0 alone (they are every rank's)."""
        missing = sorted(set(params) ^ set(saved["params"]))
        if missing:
            raise ValueError(f"the saved repair's layers differ from this run's: {missing}")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(saved["params"][name])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        totals, tokens = saved["totals"], saved["tokens"]
        if rank != 0:  # the pass's sums are every rank's: held by rank 0 alone
            totals, tokens = None if totals is None else torch.zeros_like(totals), 0.0
        device = next(iter(params.values())).device
        return cls(
            RepairReport.from_dict(saved["report"]),
            saved["done"],
            None if totals is None else totals.to(device),
            torch.as_tensor(tokens, dtype=torch.float64, device=device),
        )

    def end_pass(self) -> None:
        """The pass's per-layer means (over every rank) into the report."""
        tokens = torch.as_tensor(self.tokens, dtype=torch.float64)
        if self.totals is not None:
            tokens = tokens.to(self.totals.device)
            means = (all_reduced(self.totals) / all_reduced(tokens).clamp(min=1)).tolist()
            self.report.first = self.report.first or means
            self.report.last = means
        self.report.passes += 1
        self.totals, self.tokens = None, 0.0
