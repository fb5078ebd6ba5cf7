"""Run directories that runs cannot trample: claimed by a lock, refused when they hold another
run's outputs, appended to (never truncated) by a resume.

- One run at a time: :func:`claim_run_dir` takes an exclusive ``flock`` on ``RUN_DIR/.lock``
  (released by the kernel when the process ends, ``kill -9`` included) and names the holder's
  pid when it is taken.
- A directory that holds another run's outputs is refused unless this run resumes
  (``ckpt_path=...``) or says ``overwrite=true`` (which removes those outputs, and only them).
  What Hydra itself writes into the directory before any code of ours runs (``.hydra/``,
  ``*.log``) does not count, nor does anything a run does not write (a teacher cache written
  into the directory, notes): a run is not refused for them, and ``overwrite=true`` keeps them.
- Only rank 0 checks and locks: a DDP launch re-runs the script per rank into the same directory.
- A resume appends to the run's ``metrics.csv``: ``training/metrics_log.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from lightning_kd.export.gguf_names import GGUF_KINDS, gguf_path
from lightning_kd.training.checkpoints import LAST_NAME, REPAIR_NAME
from lightning_kd.training.samples import SAMPLES_NAME
from lightning_kd.training.set_aside import set_aside, settle
from lightning_kd.utils.locks import LockHeld, take_lock
from lightning_kd.utils.refusal import Refused

LOCK_NAME = ".lock"
HYDRA_OWN = (".hydra",)
"""Entries Hydra writes into a run directory before the task runs (plus ``*.log`` files)."""
EARLIER = "earlier"
"""Where a resumed run's earlier summaries go (``launch/work_left.retire_summary``)."""
OUTPUTS = (
    "checkpoints",
    "logs",
    "student",
    "student-best",
    "summary.json",
    "summary.md",
    "importance.json",
    SAMPLES_NAME,
    *(gguf_path(Path("student"), kind).name for kind in GGUF_KINDS),
    EARLIER,
)
"""What a run writes into its directory: what ``overwrite=true`` removes."""


STARTED = time.time()
"""About when this process started (this module is imported as a command starts)."""

LAUNCH = "LIGHTNING_KD_LAUNCH"
"""``pid:start`` of a launching rank 0, which the processes Lightning starts from it (by running
the command again) inherit with its environment: what it wrote before they started (the
``importance.json`` of ``student.layers=importance``) is their launch's, not an earlier run's."""


class RunDirError(Refused, RuntimeError):
    """A run directory in use by another run, or holding another run's outputs."""


RANKS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where a process reads its rank, the first one set winning, in Lightning's own order: its DDP
launcher and torchrun set ``RANK``/``LOCAL_RANK``; SLURM's ``srun`` sets ``SLURM_PROCID`` on every
task (0 in a batch script or an ``salloc`` shell, so a plain run there is rank 0), and torchrun
under ``srun`` still wins with ``RANK``."""
NODES = ("NODE_RANK", "GROUP_RANK")
"""A further node's processes (Lightning's launcher, torchrun), whatever their local rank."""

GLOBAL_RANKS = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Those of :data:`RANKS` that number a process among all the run's, not its node's."""


def is_rank_zero() -> bool:
    """Whether this process is the launching one: a DDP launch re-runs the script per rank, and
    torchrun or ``srun`` start it once per rank on every node."""
    rank = next((os.environ[name] for name in RANKS if name in os.environ), "0")
    return rank == "0" and all(os.environ.get(name, "0") == "0" for name in NODES)


def rank_prefix() -> str:
    """``""`` in the launching process, ``"[rank: r] "`` (as Lightning marks its lines) in the
    others of a run: every process meets a refusal of the run's own input, so each prints it,
    and a line printed twice should say why (a line only one rank prints is kept too)."""
    if is_rank_zero():
        return ""
    if dist.is_available() and dist.is_initialized():
        return f"[rank: {dist.get_rank()}] "
    if (known := next((os.environ[n] for n in GLOBAL_RANKS if n in os.environ), None)) is not None:
        return f"[rank: {known}] "
    node = next((os.environ[name] for name in NODES if name in os.environ), "0")
    local = os.environ.get("LOCAL_RANK", "0")  # Lightning's launcher sets no global rank
    return f"[rank: {local}] " if node == "0" else f"[node: {node}, local rank: {local}] "


def run_outputs(run_dir: Path) -> list[str]:
    """The :data:`OUTPUTS` a run wrote into ``run_dir``, sorted: what a new run there is
    refused for, and what ``overwrite=true`` removes (a teacher cache or notes of the user's
    are neither)."""
    return [name for name in entries(run_dir) if name in OUTPUTS]


def entries(run_dir: Path) -> list[str]:
    """Entries of ``run_dir`` other than Hydra's own files and lock files, sorted; a directory
    without a file in it (the ``logs/`` of a run refused before it logged anything) is none."""
    if not run_dir.is_dir():
        return []
    return sorted(
        entry.name
        for entry in run_dir.iterdir()
        if entry.name not in HYDRA_OWN
        and not entry.name.startswith(".")  # a lock, a leftover of an atomic write: no output
        and not entry.name.endswith(".log")
        and not (entry.is_dir() and not any(p.is_file() for p in entry.rglob("*")))
    )


def older(path: Path) -> bool:
    """Whether ``path`` was last changed before this launch started (:data:`STARTED`, or that
    of the rank 0 that started this process, :data:`LAUNCH`): not written by this launch's
    rank 0. The other ranks refuse such outputs as rank 0 does, so that none waits for it in the
    process group's set-up until the launcher kills it."""
    pid, _, started = os.environ.get(LAUNCH, "").partition(":")
    launched = float(started) if pid == str(os.getppid()) else STARTED  # else: not its child
    return path.stat().st_mtime < launched


RUN_MARKS = (
    *(".hydra", "summary.json", "importance.json", "student/config.json"),
    *(f"checkpoints/{LAST_NAME}", f"checkpoints/{REPAIR_NAME}", "logs/metrics.csv"),
)
"""Files only a run writes: a directory whose output names hold none of them is a user's own
(``logs/notes.txt``): it was called a run's outputs, and ``overwrite=true`` advised."""


def outputs_error(run_dir: Path, found: list[str]) -> str:
    """The refusal of a fresh run into ``run_dir``, which holds a run's outputs ``found``; only
    a run that saved a checkpoint can be resumed, and the advice says so."""
    if not any((run_dir / mark).exists() for mark in RUN_MARKS):  # a user's own (probe 59)
        return (
            f"run directory {run_dir} already holds {', '.join(found)}, which no lightning-kd "
            f"run wrote (none of its files is there): choose {another_directory()} "
            "(overwrite=true would remove them)"
        )
    checkpoints = run_dir / "checkpoints"
    if (checkpoints / LAST_NAME).exists():
        resume = "resume that run (ckpt_path=last), "
    elif (checkpoints / REPAIR_NAME).is_file():  # stopped in its repair (probe 59)
        resume = (
            f"it stopped in its block-wise repair, whose progress {REPAIR_NAME} keeps: resume "
            "that run (ckpt_path=last; overwrite=true would remove that progress), "
        )
    else:
        resume = "it saved no checkpoint to resume from; "
    return (
        f"run directory {run_dir} already holds a run's outputs ({', '.join(found)}); "
        f"{resume}start afresh there (overwrite=true removes {', '.join(OUTPUTS)}), or "
        f"choose {another_directory()}"
    )


def another_directory() -> str:
    """How a run chooses another directory: ``hydra.run.dir``, which a ``-m`` sweep's job
    does not read (its directory is ``hydra.sweep.dir``/``hydra.sweep.subdir``)."""
    if not HydraConfig.initialized():  # from Python: compose_config's output_dir
        return "another directory (output_dir=... of compose_config; hydra.run.dir=... of a launch)"
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return "another sweep directory (hydra.sweep.dir=...: a -m launch reads no hydra.run.dir)"
    return "another directory (hydra.run.dir=...)"


def _lock(run_dir: Path) -> int:
    """An fd holding an exclusive lock on ``run_dir/.lock``, or :class:`RunDirError`."""
    try:
        return take_lock(run_dir / LOCK_NAME)
    except LockHeld as held:
        raise RunDirError(
            f"run directory {run_dir} is in use by another run (pid {held.holder}); wait for it "
            f"to end, or give this run {another_directory()}"
        ) from None


def is_own_checkpoint(ckpt_path: Path | None, run_dir: Path) -> bool:
    """Whether ``ckpt_path`` is a checkpoint of the run in ``run_dir`` (inside it, links
    resolved, or through a ``checkpoints/`` that links to another disk: its resume was refused
    as another run's, with advice to resume it; verify 60): only such a one makes a launch a
    resume of that run."""
    if ckpt_path is None:
        return False
    found = ckpt_path.resolve()
    homes = (run_dir.resolve(), (run_dir / "checkpoints").resolve())  # wherever that links to
    return any(found.is_relative_to(home) for home in homes)


@contextmanager
def claim_run_dir(run_dir: Path, resuming: bool, overwrite: bool) -> Iterator[None]:
    """Hold ``run_dir`` for the duration of the block (see the module doc)."""
    if not is_rank_zero():
        earlier = [name for name in run_outputs(run_dir) if older(run_dir / name)]
        if earlier and not (resuming or overwrite):  # as rank 0 refuses (see older())
            raise RunDirError(outputs_error(run_dir, earlier))
        yield
        return
    if resuming and overwrite:
        raise RunDirError(
            f"overwrite=true would remove the checkpoints a resume (ckpt_path=...) reads in "
            f"{run_dir}; give one of the two"
        )
    fd = _lock(run_dir)
    os.environ[LAUNCH] = f"{os.getpid()}:{STARTED!r}"  # for the processes it starts (older())
    checkpoint = run_dir / "checkpoints" / LAST_NAME
    try:
        settle(run_dir, checkpoint, succeeded=False)  # what a killed overwriting run left
        found = run_outputs(run_dir)
        if found and overwrite:  # the record too: the outputs' config, until the new run's own
            set_aside(run_dir, found + [name for name in HYDRA_OWN if (run_dir / name).exists()])
        elif found and not resuming:
            raise RunDirError(outputs_error(run_dir, found))
        try:
            yield
        except BaseException:
            settle(run_dir, checkpoint, succeeded=False)
            raise
        settle(run_dir, checkpoint, succeeded=True)
    finally:
        os.close(fd)  # releases the lock
