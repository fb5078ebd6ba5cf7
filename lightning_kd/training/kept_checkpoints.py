"""Checkpoints kept besides ``last.ckpt``: the most recent ``checkpoint.keep`` as
``step-<N>.ckpt``, and ``best.ckpt`` for ``checkpoint.best`` (with ``best.json`` naming its step
and value), so a run that went wrong on day 3 can go back to day 2 (probe 47).

Each is a hard link to the ``last.ckpt`` just written where the filesystem has them: no second
copy on disk until ``last.ckpt`` moves on (``SafeCheckpointIO`` writes it whole beside itself
and renames it over, so the link keeps the old file). A checkpoint that is a directory
(DeepSpeed's, FSDP's sharded), or one written by another checkpoint IO (which may rewrite the
file in place), is copied.

Rolling back (a resume from a kept checkpoint before ``last.ckpt``) sets the checkpoints of the
abandoned steps, and the log as it stood, aside in ``checkpoints/abandoned-after-step-<N>/``:
the resumed run writes its own steps under the same names.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

from lightning_kd.training.checkpoint_files import load_local
from lightning_kd.training.checkpoints import LAST_NAME
from lightning_kd.training.metrics_log import read_rows
from lightning_kd.utils.atomic import atomic_write_bytes

BEST_NAME = "best.ckpt"
BEST_RECORD = "best.json"
STEP_NAME = re.compile(r"^step-(\d+)\.ckpt$")
HIGHER_IS_BETTER = ("val/agreement", "val/aligned", "val/embedding_cosine")
"""Validation metrics where more is better (the other ``val/`` metrics: losses, perplexities,
bits per byte, divergences)."""


def step_name(step: int) -> str:
    return f"step-{step}.ckpt"


def kept_steps(dirpath: Path) -> dict[int, Path]:
    """The ``step-<N>.ckpt`` checkpoints in ``dirpath``, by step."""
    found = {}
    for path in dirpath.glob("step-*.ckpt"):
        if match := STEP_NAME.match(path.name):
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def keep_as(source: Path, target: Path, link: bool = True) -> None:
    """``target`` made the checkpoint ``source`` is, whole or not at all: a hard link for a file
    where ``link`` (a copy where links are refused), a copy for a directory."""
    temp = target.with_name(f".{target.name}.keeping")
    remove(temp)
    if source.is_dir():
        shutil.copytree(source, temp)
    elif not link:
        shutil.copyfile(source, temp)
    else:
        try:
            os.link(source, temp)
        except OSError:  # a filesystem without hard links (some network mounts)
            shutil.copyfile(source, temp)
    if target.is_dir():
        remove(target)
    os.replace(temp, target)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def keep_step(dirpath: Path, step: int, keep: int, link: bool = True) -> None:
    """Keep ``dirpath/last.ckpt`` (just written for ``step``) as ``step-<step>.ckpt`` and remove
    the kept checkpoints beyond the ``keep`` most recent (``-1``: every one is kept)."""
    if keep == 0:
        return
    keep_as(dirpath / LAST_NAME, dirpath / step_name(step), link)
    if keep > 0:
        for old in list(kept_steps(dirpath).values())[:-keep]:
            remove(old)


def better(metric: str, value: float, best: float | None) -> bool:
    """Whether ``value`` of ``metric`` improves on ``best`` (None: no best yet); a non-finite
    value never does."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value > best if metric in HIGHER_IS_BETTER else value < best


def read_best(dirpath: Path) -> dict | None:
    """``best.json`` of ``dirpath`` (``metric``, ``value``, ``step``), or None."""
    try:
        record = json.loads((dirpath / BEST_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def keep_best(
    dirpath: Path,
    metric: str,
    value: float,
    step: int,
    link: bool = True,
    source: Path | None = None,
) -> None:
    """Keep ``source`` (``dirpath/last.ckpt``: of optimizer step ``step``, whose validation
    gave ``value`` of ``metric``) as ``best.ckpt`` where it improves on the best kept so far."""
    record = read_best(dirpath)
    if record is not None and record.get("metric") != metric:
        record = None  # another metric chosen since: the best is this one's
    if not better(metric, value, None if record is None else record.get("value")):
        return
    keep_as(source or dirpath / LAST_NAME, dirpath / BEST_NAME, link)
    text = json.dumps({"metric": metric, "value": value, "step": step}, indent=1) + "\n"
    atomic_write_bytes(dirpath / BEST_RECORD, text.encode())


def best_before(
    dirpath: Path, metric: str, log: Path | None, step: int, validated: dict[str, float]
) -> tuple[int, float, Path] | None:
    """After a rollback to ``step`` set the best aside: the best validation of ``metric`` at
    or before ``step`` whose checkpoint is on disk (a kept ``step-<N>.ckpt``, or the step's
    own, ``validated`` in its checkpoint), read from the ``log`` as it stands. Without it the
    next validation was taken as the best, a worse one than a kept step's (probe 50)."""
    found: dict[int, tuple[float, Path]] = {}
    for row in read_rows(log)[1] if log is not None and log.is_file() else []:
        try:
            logged, value = int(float(row["step"])), float(row.get(metric) or "nan")
        except (KeyError, ValueError):
            continue
        kept = dirpath / step_name(logged)
        if logged <= step and math.isfinite(value) and kept.is_file():
            found[logged] = (value, kept)
    if metric in validated and (dirpath / LAST_NAME).is_file():
        found[step] = (validated[metric], dirpath / LAST_NAME)
    best = None
    for logged, (value, path) in sorted(found.items()):
        if better(metric, value, None if best is None else best[1]):
            best = (logged, value, path)
    return best


def checkpoint_step(path: Path) -> int | None:
    """The optimizer step of the checkpoint file at ``path`` (None: a directory, or unreadable)."""
    if not path.is_file():
        return None
    try:
        return int(load_local(path, "cpu", mmap=True)["global_step"])
    except Exception:  # a checkpoint that cannot be read is not a later step to set aside
        return None


def set_aside_after(
    dirpath: Path, step: int, resumed: Path | None, log: Path | None
) -> Path | None:
    """A resume from ``resumed`` at optimizer ``step``: move the checkpoints of later steps
    (``last.ckpt``, kept ones, ``best.ckpt`` with its record) and a copy of ``log`` (the
    metrics of those steps, which the resume trims) into ``abandoned-after-step-<step>/``.
    From a branch set aside before (``resumed`` in such a folder), the steps after that
    branch's own point go, and that branch's kept steps and log come back. The folder, or
    None where nothing was later."""
    branched = branch_point(dirpath, resumed)
    since = step if branched is None else min(branched, step)
    later = [path for number, path in kept_steps(dirpath).items() if number > since]
    last = dirpath / LAST_NAME
    if last.exists() and not same_file(last, resumed) and (checkpoint_step(last) or 0) > since:
        later.append(last)
    if (record := read_best(dirpath)) is not None and int(record.get("step", 0)) > since:
        later += [path for path in (dirpath / BEST_NAME, dirpath / BEST_RECORD) if path.exists()]
    if not later:
        return None
    aside, again = dirpath / f"abandoned-after-step-{since}", 2
    while aside.exists():  # rolled back to this step before: that branch is kept too
        aside, again = dirpath / f"abandoned-after-step-{since}-{again}", again + 1
    aside.mkdir()
    for path in later:
        os.replace(path, aside / path.name)
    if log is not None and log.is_file():
        shutil.copyfile(log, aside / log.name)
    if branched is not None:
        bring_back(resumed.parent, dirpath, step, log)
    return aside


ABANDONED = re.compile(r"^abandoned-after-step-(\d+)(?:-\d+)?$")


def branch_point(dirpath: Path, resumed: Path | None) -> int | None:
    """The step a rollback set ``resumed``'s branch aside at, where ``resumed`` lies in one of
    ``dirpath``'s ``abandoned-after-step-<N>`` folders; None otherwise."""
    if resumed is None or not same_file(resumed.parent.parent, dirpath):
        return None
    match = ABANDONED.match(resumed.parent.name)
    return int(match.group(1)) if match else None


def bring_back(folder: Path, dirpath: Path, step: int, log: Path | None) -> None:
    """A set-aside branch resumed at ``step``: its kept checkpoints up to that step back into
    ``dirpath``, and its log (as it stood) in place of the branch left."""
    for number, path in kept_steps(folder).items():
        if number <= step:
            os.replace(path, dirpath / path.name)
    if log is not None and (folder / log.name).is_file():
        atomic_write_bytes(log, (folder / log.name).read_bytes(), "resume again")


def same_file(path: Path, other: Path | None) -> bool:
    try:
        return other is not None and os.path.samefile(path, other)
    except OSError:
        return False
