"""A ``-m`` sweep's jobs, each composed as its launcher will compose it and checked before any is
submitted: the launch's own config carries no sweep value, so a bad one (``seed=0,-1``) went to
the queue and failed there."""

from __future__ import annotations

from collections.abc import Callable

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import task_overrides
from lightning_kd.launch.interpolations import interpolation_errors
from lightning_kd.launch.nodes import several_processes

JobErrors = Callable[[DictConfig, bool], list[str]]
"""A command's checks of a sweep's job config, given whether the job runs in this process."""


def config_job_errors(cfg: DictConfig, here: bool) -> list[str]:
    """The config's values: the job check of a command with none of its own."""
    return config_errors(cfg)


def sweep_job_errors(
    cfg: DictConfig, job_errors: JobErrors = config_job_errors, here: bool = True
) -> list[str]:
    """Each job of a ``-m`` sweep composed as its launcher will compose it, and checked by
    ``job_errors`` (the launch's own config carries no sweep value): a bad value in
    ``seed=0,-1`` was submitted, to fail in the queue. ``here``: the jobs run in this process
    (Hydra's basic launcher), not on a cluster. Called inside Hydra's run, whose config loader
    composes the jobs."""
    errors = []
    for job, config in composed_jobs(cfg):
        found = interpolation_errors(config) or job_errors(config, here)
        errors += [f"job {' '.join(job)}: {error}" for error in found]
    return errors


def composed_jobs(cfg: DictConfig) -> list[tuple[list[str], DictConfig]]:
    """Each job of a ``-m`` sweep of two jobs or more, with its config composed as its launcher
    will compose it (the launch's own config carries no sweep value); none for one job, or
    outside Hydra's run, whose config loader composes them."""
    jobs = [job for batch in split_arguments(task_overrides(cfg.hydra)) for job in batch]
    if len(jobs) < 2 or not GlobalHydra.instance().is_initialized():
        return []
    loader = GlobalHydra.instance().config_loader()
    return [(job, loader.load_sweep_config(master_config=cfg, sweep_overrides=job)) for job in jobs]


def in_process_ddp_errors(cfg: DictConfig) -> list[str]:
    """A sweep Hydra's basic launcher runs (its jobs one after another, in this process) with a
    job of several processes: Lightning starts a DDP job's other processes by running this
    command again — the whole sweep — so they ran the other jobs too (two writers into one run
    directory) and left rank variables for the next job, which failed or waited forever."""
    jobs = composed_jobs(cfg)
    for job, config in jobs:
        trainer = config.trainer
        if several_processes(trainer.get("devices", 1), trainer.get("num_nodes", 1)):
            return [
                f"job {' '.join(job)}: a -m sweep of {len(jobs)} jobs with a job of several "
                "processes; Hydra's basic launcher runs the jobs one after another in this "
                "process, and Lightning starts a job's other processes by running this command "
                "again, the whole sweep (they ran the other jobs too, and left rank variables "
                "that failed the next job). Run each job as its own command, or sweep on SLURM "
                "with hydra/launcher=submitit_slurm, where srun starts each job's processes"
            ]
    return []


def split_arguments(task: list[str]) -> list[list[list[str]]]:
    """The jobs a sweep of ``task`` overrides gives, as Hydra's basic sweeper splits them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(task), None)
