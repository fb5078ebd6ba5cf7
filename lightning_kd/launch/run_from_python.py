"""``lightning_kd.train``: a whole run from Python, its run directory claimed as
``lightning-kd train`` claims it.

The command holds the directory's lock and refuses one that holds a run's outputs unless the
run resumes (``ckpt_path``) or says ``overwrite=true``. From Python a run went straight to the
library half (``launch/train.py``'s ``train``): a notebook cell run twice trained again into a
finished run's directory, replaced its checkpoint, student and summary, and appended a second
run's rows to its ``metrics.csv`` (probe 58). The checks the command makes before any model
loads stay :func:`~lightning_kd.launch.train_checks.train_errors`'s to list.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from lightning_kd.launch.train import COMMAND
from lightning_kd.launch.train import train as train_run
from lightning_kd.training.checkpoints import resolve_ckpt_path
from lightning_kd.training.rundir import claim_run_dir, is_own_checkpoint
from lightning_kd.training.summary import RunSummary


def train(cfg: DictConfig, ckpt_path: str | Path | None = None) -> RunSummary:
    """Run one distillation as ``cfg`` describes into ``cfg.output_dir``, resuming from
    ``ckpt_path`` (or ``cfg.ckpt_path``; ``last``: the directory's latest checkpoint) if given;
    returns (and writes) the summary. A directory holding another run's outputs is refused
    (:class:`~lightning_kd.training.rundir.RunDirError`) unless ``cfg.overwrite``."""
    output_dir = Path(cfg.output_dir)
    given = ckpt_path if ckpt_path is not None else cfg.get("ckpt_path")
    resolved = resolve_ckpt_path(None if given is None else str(given), output_dir / "checkpoints")
    # ckpt_path=last with no checkpoint yet but a stopped repair's repair.pt: its run goes on
    resuming = is_own_checkpoint(resolved, output_dir) or (given is not None and resolved is None)
    with claim_run_dir(output_dir, resuming=resuming, overwrite=bool(cfg.get("overwrite"))):
        return train_run(cfg, resolved, COMMAND)
