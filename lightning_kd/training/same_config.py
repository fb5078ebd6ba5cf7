"""Every process of a run reads one config: compared once the processes have joined, before the
first stage's collectives.

A multi-node run is the same command started on every node (torchrun, ``srun``, two shells).
Given another ``data.files`` on one node, each node built its own split and its own number of
validation batches, and the ranks waited for each other in the first validation until killed;
given another ``seed`` (``seed=$SLURM_PROCID`` in a job script), each node shuffled the epoch its
own way, so the ranks' shards overlapped (blocks trained twice an epoch, others never) and the run
ended with exit 0. Each process's resolved settings are gathered and compared with process 0's.
"""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

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


def same_config_error(settings: dict[str, str], world_size: int, role: str) -> str | None:
    """Why the processes of ``role`` cannot run together (gathered from all of them, so every
    process finds the same answer and none waits for the others), or None."""
    if world_size <= 1 or not dist.is_initialized():
        return None
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, settings)
    if not (found := config_differences(gathered)):
        return None
    return (
        f"the processes of {role} were given different settings: {'; '.join(found)}. Start "
        "the same command, with the same overrides and files, on every node"
    )


class SameConfig(L.Callback):
    """Compares the processes' configs once, in the first stage's set-up (the process group
    exists, no collective of the step has run)."""

    def __init__(self, cfg: DictConfig) -> None:
        self.settings = flat_settings(cfg)
        self.checked = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.checked:
            return
        self.checked = True
        if error := same_config_error(self.settings, trainer.world_size, "the run"):
            raise Refused(error)
