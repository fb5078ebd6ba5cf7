"""A ``-m`` sweep that Hydra's basic launcher runs in this process, stopped in one of its jobs:
the jobs after it never ran. The stop named the running job alone, and its printed command
finished that job; the whole sweep launched again with ``ckpt_path=last`` resumed the jobs that
had run, then refused the first that had not, for want of a checkpoint (probe 52). A stopped job
now names the jobs left and the sweep's command that goes on with all of them, and in such a
sweep a job whose directory holds nothing of a run yet starts rather than being refused.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from lightning_kd.launch.sweeps import split_arguments
from lightning_kd.training.checkpoints import LAST
from lightning_kd.training.rerun import anchored
from lightning_kd.training.rundir import run_outputs


def in_basic_sweep() -> bool:
    """Whether this run is a job of a ``-m`` sweep Hydra's basic launcher runs in this process."""
    if not HydraConfig.initialized():
        return False
    hydra = HydraConfig.get()
    if getattr(hydra, "mode", None) != RunMode.MULTIRUN:
        return False
    return str(hydra.launcher.get("_target_", "")).endswith("BasicLauncher")


def unstarted_job(ckpt_path: str | None, output_dir: Path) -> bool:
    """Whether ``ckpt_path=last`` names a basic sweep's job whose directory holds nothing of a
    run yet (no outputs, no checkpoint): a job the stopped sweep never reached, which starts."""
    if ckpt_path != LAST or not in_basic_sweep():
        return False
    if run_outputs(output_dir) or (output_dir / "checkpoints").exists():
        return False
    num = HydraConfig.get().job.num
    print(f"ckpt_path=last: job {num} of the sweep has nothing of a run to resume: it starts")
    return True


def sweep_words(argv: Sequence[str] = ()) -> list[str]:
    """The words of the sweep's command line after the command itself (``train``)."""
    argv = list(argv or sys.argv)
    return argv[2:] if argv[1:2] == ["train"] else argv[1:]


def sweep_note(command: Sequence[str], argv: Sequence[str] = ()) -> str:
    """What a stopped job of a basic sweep adds to its stop report: the jobs after it, which
    never ran, and the sweep's command that goes on with every job (empty outside such a sweep,
    or for its last job)."""
    if not in_basic_sweep():
        return ""
    words = sweep_words(argv)
    overrides = [word for word in words if not word.startswith("-") and "=" in word]
    jobs = [job for batch in split_arguments(overrides) for job in batch]
    hydra = HydraConfig.get()
    left = len(jobs) - hydra.job.num - 1
    if left <= 0:
        return ""
    # Its relative paths (hydra.sweep.dir, data.files) made absolute: it works from anywhere.
    kept = [anchored(w) for w in words if w.split("=", 1)[0].lstrip("+") != "ckpt_path"]
    again = shlex.join([*command, *kept, "ckpt_path=last"])
    return (
        f"\nThis is job {hydra.job.num} of the -m sweep in {hydra.sweep.dir}: the {left} job(s) "
        f"after it did not run ({jobs_named(jobs, hydra.job.num + 1)}). To go on with the whole "
        f"sweep (each job that ran resumes from its checkpoint, the others start):\n  {again}"
    )


def jobs_named(jobs: list[list[str]], first: int, most: int = 5) -> str:
    """Jobs ``first`` on, each by its number and the overrides that tell the jobs apart
    (``job 1: seed=1; job 2: seed=2``), the first ``most`` of them."""
    same_places = len({len(job) for job in jobs}) == 1  # each job's overrides in one order
    swept = [i for i, values in enumerate(zip(*jobs, strict=False)) if len(set(values)) > 1]
    named = [
        f"job {num}: "
        + " ".join([jobs[num][i] for i in swept] if same_places and swept else jobs[num])
        for num in range(first, min(len(jobs), first + most))
    ]
    more = len(jobs) - first - most
    return "; ".join(named) + (f"; and {more} more" if more > 0 else "")
