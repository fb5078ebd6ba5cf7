"""Whether a run directory's checkpoint has training left to resume, checked before anything
loads.

A run is finished once its summary is written, at ``trainer.max_steps`` or
``trainer.max_epochs``, or where early stopping ended it (``callbacks/early_stopping.yaml``:
"the run then ends as a finished one"); resuming it would only export the same student again,
or train past the stop (probe 47). A run that
``trainer.max_time`` ended is not finished: it resumes, but Lightning's timer counts the time of
every launch together, so a resume with no time left trained no step and rewrote the summary
(probe 47): refused here, naming the time spent.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning_kd.training.checkpoint_files import load_local
from lightning_kd.training.rundir import EARLIER, RunDirError
from lightning_kd.training.stop_reason import EARLY_STOPPING


def check_work_left(ckpt_path: Path, trainer: Any, output_dir: Path) -> None:
    """Refuse resuming ``ckpt_path`` where it has nothing left to train under ``trainer`` (the
    ``trainer`` config): finished, stopped early, or its ``max_time`` spent."""
    if not ckpt_path.is_file():
        return  # a DeepSpeed directory: its state is read by Lightning
    checkpoint = load_local(ckpt_path, "cpu", mmap=True)
    step, max_steps = checkpoint["global_step"], trainer.get("max_steps")
    summary = read_summary(output_dir)
    if summary is not None and step < int(summary.get("steps") or 0):
        summary = None  # a rollback to a kept checkpoint before the end: not past it (probe 50)
    if summary is not None and max_steps is not None and 0 <= max_steps <= step:
        raise finished(output_dir, f"optimizer step {step} of", "trainer.max_steps", max_steps)
    epochs, max_epochs = epochs_done(checkpoint), trainer.get("max_epochs")
    if summary is not None and max_epochs is not None and 0 <= max_epochs <= epochs:
        at = f"optimizer step {step}, epoch {epochs} of"
        raise finished(output_dir, at, "trainer.max_epochs", max_epochs)
    if summary is not None and summary.get("stopped_by") == EARLY_STOPPING:
        raise RunDirError(
            f"the run in {output_dir} is finished: early stopping ended it at optimizer step "
            f"{step} ({summary.get('stopped_early')}); resuming would train past that stop. "
            "To train it further anyway, resume without +callbacks=early_stopping"
        )
    spent, limit = time_spent(checkpoint), time_limit(trainer.get("max_time"))
    if limit is not None and spent is not None and spent >= limit:
        raise RunDirError(
            f"trainer.max_time={trainer.get('max_time')} is spent already: the run in "
            f"{output_dir} trained for {timedelta(seconds=round(spent))} by optimizer step "
            f"{step}, and Lightning counts every launch's time together. Resume with a larger "
            "trainer.max_time, or without one"
        )


def run_of(ckpt_path: Path | None, output_dir: Path, own: bool) -> Path | None:
    """The run directory whose summary says whether ``ckpt_path`` has work left: this run's
    (``output_dir``) for its ``own`` checkpoint, else the checkpoint's own run's
    (``RUN/checkpoints/<name>.ckpt``): a finished run's checkpoint given to a new directory
    "trained" 0 steps and exited 0 (probe 52). None: no checkpoint, or one outside a run."""
    if ckpt_path is None or own:
        return None if ckpt_path is None else output_dir
    return ckpt_path.parent.parent if ckpt_path.parent.name == "checkpoints" else None


def finished(output_dir: Path, at: str, key: str, limit: int) -> RunDirError:
    """The refusal of a resume of the finished run in ``output_dir``, at its ``key``'s end."""
    return RunDirError(
        f"the run in {output_dir} is finished ({at} {key}={limit}, summary.json written): "
        f"there is nothing to resume. Train it further with a larger {key} (and "
        "resume_reset_optimizer=true where the longer schedule changes the rate from here: any "
        "but scheduler=constant), or start a new run"
    )


def epochs_done(checkpoint: dict) -> int:
    """The epochs ``checkpoint``'s run has trained to their end (a checkpoint of the end of
    training is taken after its last epoch is counted)."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {})
    completed = progress.get("current", {}).get("completed")
    return int(completed if completed is not None else checkpoint.get("epoch", 0))


def read_summary(output_dir: Path) -> dict | None:
    """``summary.json`` of ``output_dir`` (None where there is none, or it cannot be read)."""
    try:
        return json.loads((output_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def time_spent(checkpoint: dict) -> float | None:
    """The training seconds Lightning's ``Timer`` recorded in ``checkpoint`` (None: no timer)."""
    state = (checkpoint.get("callbacks") or {}).get("Timer")
    return None if state is None else state.get("time_elapsed", {}).get("train")


def time_limit(value: Any) -> float | None:
    """``trainer.max_time`` in seconds, as Lightning reads it (``DD:HH:MM:SS``, or a mapping of
    ``timedelta``'s keys); None without it."""
    if value is None:
        return None
    from lightning.pytorch.callbacks import Timer

    return Timer(duration=value if isinstance(value, str) else dict(value)).time_remaining()


def retire_summary(output_dir: Path) -> None:
    """Move the summary of a run being resumed past it (extended to a larger
    ``trainer.max_steps``, or going on after ``trainer.max_time``) into :data:`EARLIER`, as
    ``summary-step-<N>.json`` and ``.md``: it described a finished run while the checkpoint
    trained on, and a resume killed there left a directory that said nothing of it (probe 47).
    The student stays until the resumed run exports its own."""
    summary = read_summary(output_dir)
    if summary is None:
        return
    (output_dir / EARLIER).mkdir(exist_ok=True)
    for suffix in (".json", ".md"):
        if (path := output_dir / f"summary{suffix}").is_file():
            os.replace(path, output_dir / EARLIER / f"summary-step-{summary.get('steps')}{suffix}")
