"""Every process of a run reads one config: compared once the processes have joined, before the
first stage's collectives.

A multi-node run is the same command started on every node (torchrun, ``srun``, two shells).
Given another ``data.files`` on one node, each node built its own split and its own number of
validation batches, and the ranks waited for each other in the first validation until killed;
given another ``seed`` (``seed=$SLURM_PROCID`` in a job script), each node shuffled the epoch its
own way, so the ranks' shards overlapped (blocks trained twice an epoch, others never) and the run
ended with exit 0. Each process's resolved settings are gathered and compared with process 0's,
and each one's view of the run directory: the same path on each node's own disk trained, wrote
nothing on the other nodes, and could not be resumed there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from lightning_kd.training.rundir import LOCK_NAME
from lightning_kd.utils.refusal import Refused

SHOWN = 4
"""Differing settings named in the refusal (the first, in the config's order)."""


def flat_settings(cfg: DictConfig) -> dict[str, str]:
    """Every setting of ``cfg``, resolved, by its dotted key (a list whole, as it is given)."""
    settings: dict[str, str] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                settings[f"{prefix}{key}"] = json.dumps(value, default=str)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return settings


def config_differences(gathered: list[dict[str, str]]) -> list[str]:
    """``key: process 0 has A, process r B`` for each setting a process does not share with
    process 0, the first :data:`SHOWN` of them."""
    first, found = gathered[0], []
    for rank, settings in enumerate(gathered[1:], start=1):
        for key in dict.fromkeys([*first, *settings]):
            mine, theirs = first.get(key, "(not set)"), settings.get(key, "(not set)")
            if mine != theirs:
                found.append(f"{key}: process 0 has {mine}, process {rank} {theirs}")
    return found[:SHOWN] + ([f"and {len(found) - SHOWN} more"] if len(found) > SHOWN else [])


def gather(mine: Any, world_size: int) -> list[Any]:
    """Every process's ``mine``, by rank (a collective: every process calls it)."""
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def same_config_error(settings: dict[str, str], world_size: int, role: str) -> str | None:
    """Why the processes of ``role`` cannot run together (gathered from all of them, so every
    process finds the same answer and none waits for the others), or None."""
    if world_size <= 1 or not dist.is_initialized():
        return None
    return settings_error(gather(settings, world_size), role)


def settings_error(gathered: list[dict[str, str]], role: str) -> str | None:
    """Why processes of ``role`` given the ``gathered`` settings cannot run together, or None."""
    if not (found := config_differences(gathered)):
        return None
    return (
        f"the processes of {role} were given different settings: {'; '.join(found)}. Start "
        "the same command, with the same overrides and files, on every node"
    )


def lock_view(lock: Path) -> str | None:
    """What this process reads in process 0's ``lock`` (its pid), or None where it sees none."""
    return lock.read_text() if lock.is_file() else None


def unshared_error(views: list[str | None], lock: Path) -> str | None:
    """Why the run directory holding ``lock`` (process 0's, naming its pid) is not one every
    process sees, given each process's :func:`lock_view` by rank, or None: a node with the same
    path on its own disk trained, wrote nothing, and was refused on resume (no checkpoint) while
    node 0 waited for it."""
    blind = [rank for rank, held in enumerate(views) if held != views[0]]
    if not blind:
        return None
    return (
        f"process(es) {', '.join(map(str, blind))} do not see process 0's run directory "
        f"{lock.parent} (its {lock.name}): hydra.run.dir must be on a filesystem every node "
        "shares; process 0 writes the checkpoints, and every process reads them on a resume"
    )


class SameConfig(L.Callback):
    """Compares the processes' configs once, in the first stage's set-up (the process group
    exists, no collective of the step has run), and that they see one run directory: one
    collective for both."""

    def __init__(self, cfg: DictConfig) -> None:
        self.settings = flat_settings(cfg)
        self.lock = Path(cfg.output_dir) / LOCK_NAME
        self.checked = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.checked or trainer.world_size <= 1 or not dist.is_initialized():
            return
        self.checked = True
        views = gather((self.settings, lock_view(self.lock)), trainer.world_size)
        error = settings_error([settings for settings, _ in views], "the run")
        if error or (error := unshared_error([seen for _, seen in views], self.lock)):
            raise Refused(error)
