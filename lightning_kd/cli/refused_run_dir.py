"""What a refused launch leaves in its run directory: Hydra makes the directory (and
``outputs/<date>``) before the task checks anything, and a launch records itself there
(``.hydra``, ``.lock``) once the directory is its own; a refusal that wrote nothing else leaves
no folder behind. One that wrote outputs is told to rerun with ``overwrite=true``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from lightning_kd.launch.config import JOB_RECORD
from lightning_kd.training.rundir import LOCK_NAME, run_outputs
from lightning_kd.utils.locks import LockHeld, in_use_elsewhere, take_lock
from lightning_kd.utils.refusal import Refused


def run_directory() -> Path | None:
    """This Hydra run's directory (None outside a Hydra run)."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # no Hydra run
        return None


def run_logged() -> bool:
    """Whether this run's directory holds logs: Lightning had started, and may have drawn a
    progress bar whose line a message would continue."""
    directory = run_directory()
    return directory is not None and (directory / "logs").exists()


def started_outputs(since: float) -> str:
    """A refused run that wrote outputs after ``since`` (the ``logs/`` of the validation before
    training, which a bad row stopped) would be refused again, for them, once the input is
    fixed: the advice to rerun with ``overwrite=true``; empty where it wrote none, where the
    directory held outputs before it (a resume: overwrite would drop them), or where another run
    holds it: its outputs are that run's, fresh as they are (following the advice deleted them:
    probe 52)."""
    if (directory := run_directory()) is None or in_use_elsewhere(directory / LOCK_NAME):
        return ""
    found = run_outputs(directory)
    if not found or any((directory / name).stat().st_mtime < since - 1 for name in found):
        return ""
    return (
        f"\n{directory} now holds this attempt's {', '.join(found)}: once fixed, run the same "
        "command with overwrite=true"
    )


def drop_empty_run_dir(since: float) -> None:
    """Remove the run directory of a refused command if it holds nothing but this launch's own
    record (``.hydra``, ``.lock``, an empty job log), and the empty parents made with it
    (``outputs/<date>``): Hydra makes them before the task checks anything, so each refused
    command left a trail of folders to tell apart from runs. Nothing made before ``since``
    goes, and outside the current directory only the run directory itself: a parent made a
    moment before the launch, by its user, is not told apart from one Hydra made."""
    if (directory := run_directory()) is None:
        return
    drop_own_record(directory, since)
    directory, stop = directory.resolve(), Path.cwd().resolve()
    if not directory.is_relative_to(stop):
        stop = directory.parent
    while directory != stop and directory.is_dir() and not any(directory.iterdir()):
        if directory.stat().st_ctime < since - 1:  # timestamps may be coarser than time()
            return
        directory.rmdir()
        directory = directory.parent


def drop_own_record(directory: Path, since: float) -> None:
    """This launch's record in ``directory`` (its lock, ``.hydra``, an empty job log, all made
    since ``since``), where the launch wrote no outputs there; a user's own files stay. Only
    under the directory's lock: a launch refused because another holds it removed that run's
    ``.lock`` and ``.hydra`` (made a moment before, so taken for its own), and a third launch
    then ran in the directory beside it (probe 48)."""
    if not directory.is_dir() or run_outputs(directory):
        return  # the refusal names what to do with them
    try:
        fd = take_lock(directory / LOCK_NAME)  # held while the record goes, the lock file too
    except (LockHeld, Refused):  # another launch's directory now, or a lock path not a file
        return  # (the refusal named it: raised again here, it was a traceback; verify 60)
    try:
        names = {LOCK_NAME, JOB_RECORD, f"{HydraConfig.get().job.name}.log"}
        own = [e for e in directory.iterdir() if e.name in names and e.stat().st_ctime >= since - 1]
        if any(e.is_file() and e.stat().st_size for e in own if e.name.endswith(".log")):
            return  # the records the refused launch logged, with the record of its config
        for entry in own:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    finally:
        os.close(fd)
