"""A soak: many optimizer steps of the real launch, watching for memory that only grows.

``lightning-kd soak`` runs ``lightning-kd train debug=smoke`` with feature matching and
gradient accumulation for 1,000 optimizer steps (checkpoints every 50, validation every
``warmup / 2``), and :class:`SoakProbe` records the process's resident memory after warm-up and
at the end, the live tensors at both points, and every capture found armed or holding a record
after a step.
It prints the figures and exits non-zero if RSS grew by 1 % or more, or a capture held anything.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_kd.bench.measure import rss_mb
from lightning_kd.launch.paths import out_dir_errors
from lightning_kd.training.rundir import entries
from lightning_kd.utils.refusal import refuse

REPORT = "soak.json"
MAX_GROWTH = 0.01
MARKER = ".soak"
"""The file a soak leaves in its ``--out``: a directory holding it is a soak's, re-used (its
training outputs replaced by the next soak's); any other directory with outputs is refused."""


def out_errors(out: Path) -> list[str]:
    """Why ``out`` cannot take a soak: a file, or a directory holding outputs a soak did not
    write (the soak's run starts afresh there, which would delete them)."""
    if errors := out_dir_errors("--out", out):
        return errors
    found = entries(out)
    if not found or (out / MARKER).is_file():
        return []
    return [
        f"--out {out} holds outputs a soak did not write ({', '.join(found)}); the soak's run "
        f"would replace them: give a new or empty directory, e.g. --out {out}-soak"
    ]


def live_tensors() -> int:
    return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


class SoakProbe(Callback):
    """Records RSS and live tensors at optimizer step ``warmup``, every ``every`` steps after it
    and at the end of training, and counts captures left armed or holding records after any
    training batch."""

    def __init__(self, out: str, warmup: int = 100, every: int = 100) -> None:
        self.out, self.warmup, self.every = Path(out), warmup, every
        self.rss: dict[int, float] = {}
        self.tensors: dict[int, int] = {}
        self.captures_retained = 0
        self._step = -1

    def _measure(self, step: int) -> None:
        gc.collect()
        self.rss[step] = round(rss_mb(), 2)
        self.tensors[step] = live_tensors()

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, *args) -> None:
        for capture in module.distiller.captures.values():
            self.captures_retained += bool(capture.armed or capture.records)
        step = trainer.global_step
        # From `warmup` itself, whatever `every` is: the baseline comes before the end (a
        # baseline taken at the end alone would compare the end with itself).
        if step != self._step and step >= self.warmup and (step - self.warmup) % self.every == 0:
            self._measure(step)
        self._step = step

    def on_train_end(self, trainer: Trainer, module: LightningModule) -> None:
        self._measure(trainer.global_step)
        first, last = self.rss[min(self.rss)], self.rss[max(self.rss)]
        report = {
            "steps": trainer.global_step,
            "rss_mb": self.rss,
            "live_tensors": self.tensors,
            # None where training ended at the baseline: nothing was measured after it.
            "rss_growth": (last - first) / first if len(self.rss) > 1 else None,
            "captures_retained": self.captures_retained,
        }
        self.out.write_text(json.dumps(report, indent=2))


def soak(steps: int, warmup: int, out: Path) -> tuple[dict, bool]:
    """Train the smoke config for ``steps`` optimizer steps in a child process with a
    :class:`SoakProbe`; its report and whether it passed (RSS growth under :data:`MAX_GROWTH`,
    no capture retained)."""
    out = out.resolve()
    refuse(out_errors(out))
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).touch()  # overwrite=true below then only ever replaces a soak's outputs
    command = [
        sys.executable,
        "-m",
        "lightning_kd",
        "train",
        "debug=smoke",
        "distill.features=uniform",
        "trainer.accumulate_grad_batches=2",
        f"trainer.max_steps={steps}",
        # Every warmup / 2 optimizer steps (the interval counts steps, whatever the accumulation),
        # so the baseline at `warmup` has seen validation's one-off allocations (a first
        # validation between two measurements reads as growth: +1.3 % over a 300-step soak that
        # is flat from step 200 on).
        f"trainer.val_check_interval={max(warmup // 2, 1)}",
        "validate_before=false",
        "export_student=false",
        f"+callbacks.soak={{_target_: lightning_kd.bench.soak.SoakProbe, out: {out / REPORT}, "
        f"warmup: {warmup}}}",
        "~callbacks.progress",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={out}",
        "overwrite=true",
    ]
    # Tiny matrices: one thread each is faster than several spinning on shared cores.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(
            f"the soak run failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
        )
    report = json.loads((out / REPORT).read_text())
    growth = report["rss_growth"]
    ok = growth is not None and growth < MAX_GROWTH and report["captures_retained"] == 0
    return report, ok
