"""A ``-m`` sweep's jobs, each composed as its launcher will compose it and checked before any is
submitted: the launch's own config carries no sweep value, so a bad one (``seed=0,-1``) went to
the queue and failed there."""

from __future__ import annotations

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from lightning_kd.launch.checks import config_errors


def sweep_job_errors(cfg: DictConfig) -> list[str]:
    """Each job of a ``-m`` sweep composed as its launcher will compose it, and checked (the
    launch's own config carries no sweep value): a bad value in ``seed=0,-1`` was submitted, to
    fail in the queue. Called inside Hydra's run, whose config loader composes the jobs."""
    jobs = [job for batch in split_arguments(list(cfg.hydra.overrides.task)) for job in batch]
    if len(jobs) < 2 or not GlobalHydra.instance().is_initialized():
        return []
    loader = GlobalHydra.instance().config_loader()
    errors = []
    for job in jobs:
        found = config_errors(loader.load_sweep_config(master_config=cfg, sweep_overrides=job))
        errors += [f"job {' '.join(job)}: {error}" for error in found]
    return errors


def split_arguments(task: list[str]) -> list[list[list[str]]]:
    """The jobs a sweep of ``task`` overrides gives, as Hydra's basic sweeper splits them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(task), None)
