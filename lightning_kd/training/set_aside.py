"""``overwrite=true`` undone where the new run never got going.

The earlier run's outputs, and its record (``.hydra/``: the config those outputs came from),
are moved into ``RUN_DIR/.overwritten`` (a rename: no copy, no space) rather than removed when
the directory is claimed. Many refusals come only after that — a
setting wrong only once the models are built (a LoRA target the student lacks, a feature module,
a bad streamed row) — and they removed a finished run's student, checkpoint and summary for a
run that never started. So:

- the new run writes a checkpoint of its own (its block-wise repair's progress, ``repair.pt``,
  counts), or ends well: what was set aside is removed;
- it stops before its first checkpoint (refused, failed, interrupted): its partial outputs are
  removed and the earlier ones put back, as if ``overwrite=true`` had not been given;
- it was killed (``kill -9``) before either: the next launch into the directory does the same
  from what it finds (a checkpoint of the new run, or none).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lightning_kd.training.checkpoint_files import REPAIR_NAME

ASIDE = ".overwritten"
"""Where an overwritten run's outputs wait, inside the run directory."""


def set_aside(run_dir: Path, names: list[str]) -> None:
    """Move ``names`` (outputs of ``run_dir``) into its :data:`ASIDE` directory."""
    aside = run_dir / ASIDE
    aside.mkdir()
    for name in names:
        os.replace(run_dir / name, aside / name)


def settle(run_dir: Path, checkpoint: Path, succeeded: bool) -> None:
    """After a run that set outputs aside (or found some left by a killed one): remove them
    where the run ``succeeded`` or wrote ``checkpoint`` (or its repair's progress beside it),
    else put them back in place of what the run wrote."""
    aside = run_dir / ASIDE
    if not aside.is_dir():
        return
    # A repair's kept progress is the new run's first checkpoint: its stop said to resume from
    # it, and the undo removed it (probe 59).
    if succeeded or checkpoint.exists() or (checkpoint.parent / REPAIR_NAME).is_file():
        shutil.rmtree(aside)
        return
    for entry in list(aside.iterdir()):
        target = run_dir / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(entry, target)
    aside.rmdir()
    print(f"overwrite=true undone: the earlier run's outputs in {run_dir} are back as they were")
