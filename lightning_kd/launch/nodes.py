"""Multi-node runs: which launcher started this process, and whether it agrees with the config.

Lightning trains on ``trainer.num_nodes`` > 1 machines only when something else starts one
process per device on every node and tells each its place: ``torchrun`` (``TORCHELASTIC_RUN_ID``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``) or SLURM's ``srun`` (``SLURM_NTASKS``,
``SLURM_NNODES``, ``SLURM_NTASKS_PER_NODE``), which Lightning reads through its
``TorchElasticEnvironment`` and ``SLURMEnvironment``. Without one, Lightning starts
``trainer.devices`` processes on this machine and waits, with no message and no end, for ranks
that never come; with one that disagrees with the config, it stops with a traceback after the
config is read. Both are refused here, before any model loads, naming the launch command.

Every node composes its own config, so the run directory must be one path every node sees:
Hydra's default (``outputs/<date>/<time>``) differs from node to node and would split the run
(each node resuming from its own ``checkpoints/``), so a multi-node run names it.

The commands that run one process (``generate``, ``importance``) say so of a config that asks for
several, which ``train`` and ``cache`` would start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from lightning_kd.launch.config_dir import shipped_docs_dir

LAUNCH_DOC = f"the docs' scale-out page, {shipped_docs_dir() / 'scale-out.md'} (#multi-node)"


@dataclass(frozen=True)
class Launcher:
    """The processes an external launcher started, as it reports them."""

    name: str
    """``torchrun`` or ``srun``."""
    world_size: int | None
    nodes: int | None
    per_node: int | None
    """Processes per node (None where the launcher does not say: ``srun`` without
    ``--ntasks-per-node``)."""


def _number(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "")
    return int(value) if value.isdigit() else None


def launcher(environ: Mapping[str, str] = os.environ) -> Launcher | None:
    """The launcher that started this process (None: started by hand, or by Lightning itself).

    SLURM jobs named ``bash`` or ``interactive`` are an interactive allocation in which the user
    launches processes themselves, as Lightning's own detection treats them."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return Launcher(
            "torchrun",
            _number(environ, "WORLD_SIZE"),
            _number(environ, "GROUP_WORLD_SIZE"),
            _number(environ, "LOCAL_WORLD_SIZE"),
        )
    if "SLURM_NTASKS" in environ and environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return Launcher(
            "srun",
            _number(environ, "SLURM_NTASKS"),
            _number(environ, "SLURM_NNODES"),
            _number(environ, "SLURM_NTASKS_PER_NODE"),
        )
    return None


def torchrun_command(nodes: int, per_node: int | str) -> str:
    """The command each node runs (``--node-rank`` 0 on the node whose address is given)."""
    return (
        f"torchrun --nnodes={nodes} --nproc-per-node={per_node} --node-rank=<0..{nodes - 1}> "
        "--master-addr=<node 0's address> --master-port=29500 -m lightning_kd train "
        f"strategy=ddp trainer.num_nodes={nodes} trainer.devices={per_node} "
        "hydra.run.dir=<a directory every node sees> <this command's other overrides>"
    )


def node_errors(
    num_nodes: object, devices: object, environ: Mapping[str, str] = os.environ
) -> list[str]:
    """What stops ``trainer.num_nodes`` × ``trainer.devices`` from running under this process's
    launcher (empty when nothing does; values of the wrong type are ``checks.py``'s to report)."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        return []
    found = launcher(environ)
    if found is None:
        if num_nodes == 1:
            return stray_rank_errors(devices, environ)
        if by_hand := [name for name in ("NODE_RANK", "MASTER_ADDR") if environ.get(name)]:
            return [  # Lightning's manual launch: runnable, but not one the run can check
                f"trainer.num_nodes={num_nodes} with {' and '.join(by_hand)} set by hand "
                "(Lightning's manual multi-node launch): lightning-kd checks each node against "
                "the launcher that started it (its node count, processes, run directory), which "
                f"such a launch has none of; start it on every node with "
                f"`{torchrun_command(num_nodes, devices)}`, or submit it with "
                f"hydra/launcher=submitit_slurm ({LAUNCH_DOC})"
            ]
        return [
            f"trainer.num_nodes={num_nodes}, but no multi-node launcher started this process "
            "(no torchrun or SLURM srun environment), so Lightning would wait forever for the "
            f"other nodes; start it on every node with `{torchrun_command(num_nodes, devices)}`, "
            f"or submit it with hydra/launcher=submitit_slurm ({LAUNCH_DOC})"
        ]
    if found.name == "srun" and (found.world_size or 1) > 1 and not in_srun_step(environ):
        return [
            f"SLURM_NTASKS={found.world_size}, but srun did not start this process (no "
            "SLURM_STEP_ID: it is the sbatch script itself, one process), so Lightning would "
            f"wait forever for {found.world_size - 1} ranks that never start; put srun before the "
            "command in the script (`srun python -m lightning_kd train ...`), or submit with "
            f"hydra/launcher=submitit_slurm ({LAUNCH_DOC})"
        ]
    return _agreement_errors(found, num_nodes, devices) + _shared_dir_errors(found, num_nodes)


SPECIAL_STEPS = range(0xFFFFFFF0, 0x100000000)
"""Slurm's step ids above its last normal step: the batch script's, the external container's,
the interactive step's (``slurm.h``: ``SLURM_BATCH_SCRIPT`` and others)."""


def in_srun_step(environ: Mapping[str, str]) -> bool:
    """Whether srun started this process: it gives each task ``SLURM_STEP_ID``, a normal step's
    number; the batch script runs without one (or, on some versions, with a special step's)."""
    step = _number(environ, "SLURM_STEP_ID")
    return step is not None and step not in SPECIAL_STEPS


STRAY_RANKS = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")


def stray_rank_errors(devices: object, environ: Mapping[str, str]) -> list[str]:
    """A rank set in the environment of a process no launcher started (a shell's leftover
    ``LOCAL_RANK=1``): the run acted as that rank, left its outputs to a rank 0 that does not
    exist, and reported success. Lightning's own DDP launcher gives each further process its
    ``LOCAL_RANK`` with ``WORLD_SIZE`` = ``trainer.devices`` (one node here)."""
    set_ranks = [name for name in STRAY_RANKS if environ.get(name, "0") not in ("", "0")]
    if not set_ranks:
        return []
    world = _number(environ, "WORLD_SIZE") or 0
    counted = isinstance(devices, int) and not isinstance(devices, bool) and devices > 0
    agrees = world == devices or (world and not counted)  # devices=auto: any count
    if agrees and _number(environ, "LOCAL_RANK") in range(world):
        return []
    shown = ", ".join(f"{name}={environ[name]}" for name in set_ranks)
    return [
        f"{shown} in the environment, but no launcher started this process (WORLD_SIZE="
        f"{environ.get('WORLD_SIZE', 'unset')}, trainer.devices={devices}): it would run as "
        f"that rank and leave the run's outputs to a rank 0 that does not exist; unset "
        f"{' and '.join(set_ranks)}"
    ]


def _agreement_errors(found: Launcher, num_nodes: int, devices: object) -> list[str]:
    """The launcher's node count and processes per node against the config's."""
    errors = []
    per_node_flag = "--nproc-per-node" if found.name == "torchrun" else "--ntasks-per-node"
    nodes_flag = "--nnodes" if found.name == "torchrun" else "--nodes"
    if found.nodes is not None and found.nodes != num_nodes:
        errors.append(
            f"trainer.num_nodes={num_nodes}, but {found.name} started {found.nodes} nodes "
            f"({nodes_flag}={found.nodes}); set trainer.num_nodes={found.nodes} or launch "
            f"{nodes_flag}={num_nodes}"
        )
    if not isinstance(devices, int) or isinstance(devices, bool):
        errors.append(
            f"trainer.devices={devices!r} under {found.name}: each node runs the processes "
            f"{found.name} starts, one per device, so give their number "
            f"(trainer.devices={found.per_node or '<processes per node>'})"
        )
        return errors
    if found.per_node is not None and found.per_node != devices:
        errors.append(
            f"trainer.devices={devices}, but {found.name} started {found.per_node} processes "
            f"per node ({per_node_flag}={found.per_node}); set trainer.devices={found.per_node} "
            f"or launch {per_node_flag}={devices}"
        )
    elif found.per_node is None and found.world_size not in (None, num_nodes * devices):
        errors.append(
            f"trainer.num_nodes={num_nodes} × trainer.devices={devices} is "
            f"{num_nodes * devices} processes, but {found.name} started {found.world_size}; "
            "make the two agree"
        )
    return errors


def _shared_dir_errors(found: Launcher, num_nodes: int) -> list[str]:
    """A run of several launched processes whose run directory is made from the clock, Hydra's
    default (see the module doc). On one node too: each process composes ``outputs/<date>/<time>``
    from the clock as it starts, a second apart now and then, which split the run (an empty
    stray directory; a sharded checkpoint in two). A sweep's directory is composed once, where
    the jobs are submitted."""
    if (found.world_size or 1) == 1 or not HydraConfig.initialized():
        return []
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.RUN:
        return []
    if "${now:" not in str(OmegaConf.to_container(hydra.run, resolve=False)["dir"]):
        return []  # named: on the command line (hydra.run.dir=, ++hydra.run.dir=) or in a config
    if num_nodes == 1:
        return [
            f"{found.world_size} processes started by {found.name} with Hydra's default run "
            f"directory ({hydra.run.dir}): each composes its own from the clock as it starts, "
            "and a second apart they split the run; name one: hydra.run.dir=<path>"
        ]
    return [
        f"trainer.num_nodes={num_nodes} with Hydra's default run directory "
        f"({hydra.run.dir}): every node composes its own, from its own clock; name one that "
        "every node sees, the same on every node: hydra.run.dir=<shared path>"
    ]


def one_process_note(
    cfg: DictConfig, doing: str = "generate: one process writes the completions"
) -> str | None:
    """What ``generate`` (or ``importance``: ``doing``) says of a config asking for several
    processes (:func:`several_processes`): it runs one (a run's ``strategy=ddp
    trainer.devices=N``, kept for ``train`` and ``cache``, would pass silently)."""
    devices, num_nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    if not several_processes(devices, num_nodes):
        return None
    asked = [f"trainer.devices={devices}"] if several_processes(devices, 1) else []
    asked += [f"trainer.num_nodes={num_nodes}"] if several_processes(1, num_nodes) else []
    return f"{doing} ({', '.join(asked)}: for train and cache, not here)"


def several_processes(devices: object, num_nodes: object) -> bool:
    """Whether ``trainer.devices`` / ``trainer.num_nodes`` ask for more than one process
    (``auto`` and ``-1``: every accelerator here, several where there are several GPUs)."""
    return process_count(devices, num_nodes) > 1


def process_count(devices: object, num_nodes: object, accelerator: object = "auto") -> int:
    """The processes ``trainer.devices`` x ``trainer.num_nodes`` ask for: a count, GPU indices
    (``"0,1"``), or ``auto`` and -1 (the GPUs here where ``accelerator`` runs on them, one process
    on a CPU). A value the config checks refuse counts as one."""
    import torch

    nodes = num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else 1
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if devices in ("auto", "-1", -1):
        gpu = accelerator in (None, "auto", "gpu", "cuda") and torch.cuda.is_available()
        count = torch.cuda.device_count() if gpu else 1
    elif isinstance(devices, bool):
        count = 1
    elif isinstance(devices, int):
        count = devices
    elif isinstance(devices, str):  # indices: "0,1"
        count = len([part for part in devices.split(",") if part.strip()])
    else:
        count = len(devices) if hasattr(devices, "__len__") else 1
    return max(1, count) * max(1, nodes)
