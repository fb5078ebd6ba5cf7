"""Cluster launches through Hydra's submitit launcher (``hydra/launcher=submitit_slurm`` or
``submitit_local``, with ``-m``), checked before anything is submitted.

The plugin (``pip install 'lightning-kd[cluster]'``) registers its launchers' typed configs in
Hydra's ``ConfigStore`` under the names ``conf/hydra/launcher/`` uses too; the YAML files there
start from the same configs, stored again here as ``submitit_slurm_base`` and
``submitit_local_base`` (the ``<group>/base`` pattern of ``config.py``), and make the SLURM job's
shape follow the run: ``trainer.num_nodes`` nodes of ``trainer.devices`` tasks and GPUs, one task
per device, which is what Lightning's SLURM environment expects and checks.

:func:`launcher_errors` is what a job would find out only once it leaves the queue (a device count
SLURM cannot be asked for, a job shape Lightning refuses), found in the launching process instead.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigLoadError
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from lightning_kd.launch.rules import lookup

PLUGIN = "hydra_plugins.hydra_submitit_launcher"
"""The plugin's package: its launchers' ``_target_`` starts with it."""
KINDS = ("slurm", "local")
"""``hydra/launcher=submitit_<kind>``."""
EXAMPLES = {"timeout_min": 240, "nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4}
EXAMPLES |= {"cpus_per_task": 8, "mem_gb": 64, "max_num_timeout": 3, "signal_delay_s": 120}
EXAMPLES |= {"setup": "'[module load cuda, source /shared/venv/bin/activate]'"}
"""A value for each field a user sets, for the messages (a list is quoted for the shell)."""

# Our YAML of the plugin's name extends its config explicitly (its defaults list); Hydra still
# matches the two by name, merges the same schema again and warns that doing so is deprecated:
# nothing for a user to act on. Set on import, so in a cluster job's process too (which imports
# this module as it loads its task before composing the job's config).
warnings.filterwarnings(
    "ignore",
    message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema",
    category=UserWarning,
)


def register_launchers(store: ConfigStore) -> None:
    """Store the plugin's launcher configs again as ``hydra/launcher/submitit_<kind>_base``
    (nothing when the plugin is not installed: selecting a launcher then fails to find it)."""
    # Discovering the plugins (once a process) runs the plugin's module, which stores its configs:
    # taken from the store after that, the base is of the classes of the config Hydra matches to
    # our YAML by name (those of an import of ours would be other classes, which do not merge).
    Plugins.instance()
    for kind in KINDS:
        try:
            plugin = store.load(f"hydra/launcher/submitit_{kind}.yaml")
        except ConfigLoadError:
            return
        store.store(group="hydra/launcher", name=f"submitit_{kind}_base", node=plugin.node)


def launcher_override_errors(overrides: Sequence[str]) -> list[str]:
    """One message per ``hydra.launcher.<field>=<value>`` in ``overrides`` whose value the field
    of the submitit launcher they select (``hydra/launcher=submitit_slurm``) does not take: the
    package's refusal, naming each at once, where Hydra would stop at the first with a message
    of its own (and exit 1)."""
    parsed = _parsed(overrides)
    chosen = [item.value() for item in parsed if item.key_or_group == "hydra/launcher"]
    if not chosen or chosen[-1] not in [f"submitit_{kind}" for kind in KINDS]:
        return []
    try:
        fields = ConfigStore.instance().load(f"hydra/launcher/{chosen[-1]}_base.yaml").node
    except ConfigLoadError:  # the plugin is not installed: Hydra's own error names no fix
        return [
            f"hydra/launcher={chosen[-1]} needs Hydra's submitit launcher plugin, which is not "
            "installed: pip install hydra-submitit-launcher (lightning-kd's cluster extra)"
        ]
    errors = []
    for item in parsed:
        field = item.key_or_group.removeprefix("hydra.launcher.")
        if item.key_or_group == field or field not in fields or item.is_sweep_override():
            continue
        try:
            fields[field] = item.value()
        except OmegaConfBaseException as error:
            why = str(error).split("\n")[0]  # Value 'two' ... could not be converted to Integer
            example = (
                f"; e.g. hydra.launcher.{field}={EXAMPLES[field]}" if field in EXAMPLES else ""
            )
            errors.append(f"{item.input_line}: {why}{example}")
    return errors


def _parsed(words: Sequence[str]) -> list[Override]:
    """The overrides among a command line's ``words`` (its flags, and their values, left out),
    as Hydra parses them; a malformed one is left out too (Hydra names it when it parses)."""
    parser, parsed = OverridesParser.create(), []
    for word in words:
        if "=" not in word or word.startswith("-"):
            continue
        try:
            parsed += parser.parse_overrides([word])
        except Exception:
            continue
    return parsed


def submitit_kind(cfg: Mapping) -> str | None:
    """``slurm`` or ``local`` when ``cfg``'s Hydra launcher is the submitit plugin's, else None."""
    target = lookup(cfg, "hydra.launcher._target_")
    if not isinstance(target, str) or not target.startswith(PLUGIN):
        return None
    return "slurm" if target.endswith("SlurmLauncher") else "local"


def launcher_errors(cfg: DictConfig) -> list[str]:
    """Why ``cfg`` (with its ``hydra`` node) cannot launch through the submitit launcher it
    selects: one message per problem, each naming the keys and the fix (none for other
    launchers)."""
    kind = submitit_kind(cfg)
    if kind == "slurm":
        return slurm_client_errors() + _slurm_errors(cfg) + _slurm_field_errors(cfg)
    if kind == "local":
        return _local_errors(cfg)
    return []


def slurm_client_errors() -> list[str]:
    """The SLURM client the launcher calls, missing from this machine's ``PATH``: submitit
    raises a bare ``RuntimeError`` for ``srun`` at the launch, and ``sbatch`` submits."""
    missing = [name for name in ("sbatch", "srun") if shutil.which(name) is None]
    if not missing:
        return []
    return [
        f"hydra/launcher=submitit_slurm submits with sbatch and starts tasks with srun, and this "
        f"machine has no {' or '.join(missing)} on its PATH: launch from a login node of the "
        "SLURM cluster (after loading its slurm module, where it has one), or run the jobs on "
        "this machine with hydra/launcher=submitit_local"
    ]


def _slurm_errors(cfg: DictConfig) -> list[str]:
    """A SLURM job runs one task per device: ``trainer.devices`` must be a number, and the job's
    tasks per node and nodes those of the trainer (Lightning refuses a difference, but only once
    the job has left the queue)."""
    devices, num_nodes = lookup(cfg, "trainer.devices"), lookup(cfg, "trainer.num_nodes")
    launcher = cfg.hydra.launcher
    tasks = _resolved(launcher, "tasks_per_node")  # None while it follows a devices of auto
    if not _is_count(devices):
        return [
            f"trainer.devices={devices!r} with hydra/launcher=submitit_slurm: SLURM starts one "
            "task per device (hydra.launcher.tasks_per_node, trainer.devices unless set), and "
            "Lightning checks the two agree, so it must be a number; give the GPUs per node, "
            f"e.g. trainer.devices={tasks if _is_count(tasks) else 4}"
        ]
    errors = []
    if _is_count(tasks) and tasks != devices:
        errors.append(
            f"hydra.launcher.tasks_per_node={tasks} with trainer.devices={devices}: Lightning "
            "under SLURM runs one task per device and stops a job where the two differ; leave "
            "hydra.launcher.tasks_per_node unset (it follows trainer.devices), or set "
            f"trainer.devices={tasks}"
        )
    nodes = _resolved(launcher, "nodes")
    if _is_count(nodes) and _is_count(num_nodes) and nodes != num_nodes:
        errors.append(
            f"hydra.launcher.nodes={nodes} with trainer.num_nodes={num_nodes}: Lightning stops "
            "a job whose node count differs from the trainer's; leave hydra.launcher.nodes unset "
            f"(it follows trainer.num_nodes), or set trainer.num_nodes={nodes}"
        )
    return errors


SLURM_COUNTS = ("timeout_min", "mem_gb", "cpus_per_task")
"""Fields sbatch takes as positive numbers (``--time``, ``--mem``, ``--cpus-per-task``)."""


def _slurm_field_errors(cfg: DictConfig) -> list[str]:
    """Numbers sbatch would refuse once submitted, and GPUs asked for a CPU run."""
    launcher = cfg.hydra.launcher
    errors = [
        f"hydra.launcher.{key}={value}: give a number >= 1 (or null: the cluster's default)"
        for key in SLURM_COUNTS
        if (value := _resolved(launcher, key)) is not None and not _is_count(value)
    ]
    gpus = _resolved(launcher, "gpus_per_node")
    if lookup(cfg, "trainer.accelerator") == "cpu" and gpus not in (None, 0):
        errors.append(
            f"hydra.launcher.gpus_per_node={gpus} with trainer.accelerator=cpu: the job would "
            "hold GPUs it never uses; set hydra.launcher.gpus_per_node=null"
        )
    return errors


def _local_errors(cfg: DictConfig) -> list[str]:
    """The local launcher runs each job as one process of this machine: Lightning would start
    a multi-device run's further processes by re-running that process's command, which is
    submitit's worker, not the command typed."""
    launcher, devices = cfg.hydra.launcher, lookup(cfg, "trainer.devices")
    errors = [
        f"hydra.launcher.{key}={value} with hydra/launcher=submitit_local: each job is one "
        f"process on this machine; leave it at 1 (hydra.launcher.{key}=1)"
        for key in ("tasks_per_node", "nodes")
        if (value := _resolved(launcher, key)) != 1
    ]
    listed = isinstance(devices, Sequence) and not isinstance(devices, str)
    one = devices == 1 or (listed and len(devices) == 1)
    if not one:
        errors.append(
            f"trainer.devices={devices!r} with hydra/launcher=submitit_local: a job of the "
            "local launcher runs on one device; give trainer.devices=1, or launch a "
            "multi-device run without it (one run, no -m)"
        )
    return errors


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _resolved(node: DictConfig, key: str) -> Any:
    """``node[key]`` resolved, or None where it does not resolve (a bad value it interpolates
    is reported under its own key)."""
    try:
        return node[key]
    except OmegaConfBaseException:
        return None
