"""One source for every default, and one way to compose the config.

The defaults of the ``teacher``, ``student``, ``distill``, ``data``, ``cache`` and ``generate``
groups are those of the objects they build (:data:`GROUP_TARGETS`: the dataclasses
:class:`~lightning_kd.models.loading.TeacherSpec`, ``StudentSpec``,
:class:`~lightning_kd.distill.objective.DistillConfig`, ``CacheSpec``, ``GenerateSpec`` and the
signature of :class:`~lightning_kd.data.text.TextDataModule`) — registered with Hydra's
``ConfigStore`` as ``<group>/base`` (``data/chat_base`` adds ``ChatDataModule``'s). The YAML
files of ``conf/`` list their base first and add only what differs (a teacher's path, the smoke
test's tiny sizes), so a default cannot drift between the two.

:func:`compose_config` is what ``lightning-kd train <overrides>`` composes, without launching:
the tests, the benchmark and the notebooks use it, so they run the configuration users run.
``config_dirs`` adds the user's own directories (as ``--config-dir`` does on the command line).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException
from lightning.pytorch import Callback
from omegaconf import DictConfig, OmegaConf

from lightning_kd.cache.format import CacheSpec
from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.text import TextDataModule
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.generation.teacher_completions import GenerateSpec
from lightning_kd.launch.cluster import register_launchers
from lightning_kd.launch.config_dir import shipped_config_dir
from lightning_kd.launch.domain_names import string_domain_names
from lightning_kd.launch.group_overrides import group_option_errors
from lightning_kd.launch.work_left import retire_summary
from lightning_kd.models.loading import StudentSpec, TeacherSpec
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.refusal import Refused

CONF_DIR = shipped_config_dir()
"""The config directory every command composes from (Hydra's primary config path)."""

GROUP_TARGETS: dict[str, Callable[..., Any]] = {
    "teacher": TeacherSpec,
    "student": StudentSpec,
    "distill": DistillConfig,
    "data": TextDataModule,
    "cache": CacheSpec,
    "generate": GenerateSpec,
}
"""Config group → what its node instantiates; its keyword defaults are the group's defaults."""

VARIANT_TARGETS: dict[tuple[str, str], Callable[..., Any]] = {("data", "chat_base"): ChatDataModule}
"""Further ``<group>/<name>`` nodes: a subclass's defaults on top of its group's (``data=chat``
builds a ``ChatDataModule``, which takes every ``TextDataModule`` argument too)."""


def stored_nodes() -> dict[str, set[str]]:
    """Each group's nodes :func:`register_defaults` stores (``base``, and the variants')."""
    nodes = {group: {"base"} for group in GROUP_TARGETS}
    for group, name in VARIANT_TARGETS:
        nodes[group].add(name)
    return nodes


def defaults_node(target: Callable[..., Any]) -> dict[str, Any]:
    """``{"_target_": ..., <keyword>: <default>, ...}`` for every keyword of ``target`` that has a
    default (arguments without one, like the data module's tokenizer, are passed by the caller)."""
    node: dict[str, Any] = {"_target_": f"{target.__module__}.{target.__qualname__}"}
    for name, parameter in inspect.signature(target).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            node[name] = copy.deepcopy(parameter.default)
    return node


def on_default_corpus(files: Any, dataset: Any, value: Any) -> Any:
    """``value`` when ``data.files`` and ``data.dataset.path`` are null (the embedded corpus),
    else null: for settings of the default run that must not follow a user to their own data
    (``conf/data/text.yaml``)."""
    return value if files is None and dataset is None else None


def steps_interval(max_steps: Any) -> Any:
    """``trainer.val_check_interval``'s default: validate at the last step, ``max_steps``; for
    a run bounded by epochs (``max_steps`` -1 or null), null: at each epoch's end (it was -1,
    refused as a setting the user never made)."""
    return None if max_steps in (None, -1) else max_steps


def epoch_checks(max_steps: Any) -> int | None:
    """``trainer.check_val_every_n_epoch``'s default: null (steps count) unless the run is bounded
    by epochs, 1 then (Lightning takes a fraction of an epoch only with it)."""
    return 1 if max_steps in (None, -1) else None


def config_node(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with each dataclass default (``data.dataset``'s) as a plain mapping of its
    fields: an untyped node, so that ``data.dataset.data_files`` takes a string, a list or a
    mapping, as ``datasets`` does."""
    return {
        key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        for key, value in node.items()
    }


def register_defaults() -> None:
    """Store each group's defaults as ``<group>/base`` (and :data:`VARIANT_TARGETS`'s; idempotent:
    the same node each time), the submitit launchers' as ``hydra/launcher/submitit_<kind>_base``
    (``cluster.py``), and the ``kd.*`` resolvers the YAML files use."""
    OmegaConf.register_new_resolver("kd.on_default_corpus", on_default_corpus, replace=True)
    OmegaConf.register_new_resolver("kd.steps_interval", steps_interval, replace=True)
    OmegaConf.register_new_resolver("kd.epoch_checks", epoch_checks, replace=True)
    store = ConfigStore.instance()
    for group, target in GROUP_TARGETS.items():
        store.store(group=group, name="base", node=config_node(defaults_node(target)))
    for (group, name), target in VARIANT_TARGETS.items():
        node = defaults_node(GROUP_TARGETS[group]) | defaults_node(target)
        store.store(group=group, name=name, node=config_node(node))
    register_launchers(store)


def compose_config(
    overrides: Sequence[str] = (),
    output_dir: str | Path | None = None,
    config_dirs: Sequence[str | Path] = (),
) -> DictConfig:
    """The config ``lightning-kd train <overrides>`` would run, with ``output_dir`` standing in
    for Hydra's run directory (required to build a trainer, optional to inspect values), and
    ``config_dirs`` searched before the shipped configs (``--config-dir DIR``). A key the config
    lacks is refused as the commands refuse it, with the nearest key (Hydra's advice,
    "+key=value", ended in a ``TypeError`` once the group was built)."""
    if absent := [str(d) for d in config_dirs if not Path(d).expanduser().is_dir()]:
        raise Refused(f"config_dirs: {absent} are no directories (Hydra would skip them unread)")
    try:
        return compose_unchecked(overrides, output_dir, config_dirs)
    except MissingConfigException as error:  # an option a group lacks: the command's message
        dirs = [CONF_DIR, *(Path(d).expanduser() for d in config_dirs)]
        found = group_option_errors(list(overrides), dirs, stored_nodes())
        raise Refused(
            "; ".join(found) or str(error).split("Config search path")[0].strip()
        ) from None
    except ConfigCompositionException as error:
        if (found := NOT_IN_CONFIG.search(str(error))) is None:
            raise
        key = found.group(1)
        words = [word for word in overrides if word.split("=", 1)[0].lstrip("+~") == key]
        rest = [word for word in overrides if word not in words]
        keys = dotted_keys(compose_config(rest, output_dir, config_dirs))  # names the next
        near = difflib.get_close_matches(key, keys, n=1, cutoff=0.7)
        hint = f"did you mean {near[0]}?" if near else "lightning-kd train --cfg job prints them"
        given = words[-1] if words else key
        raise Refused(f"{given}: the config has no key {key}; {hint}") from None


NOT_IN_CONFIG = re.compile(r"Could not override '([^']+)'")
"""Hydra's words for an override of a key the config does not have."""


def dotted_keys(cfg: DictConfig) -> list[str]:
    """Every key of ``cfg`` by its dotted path, a list's items by their index
    (``teachers.1.weight``); interpolations left as they are."""
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            path = f"{prefix}{key}"
            keys.append(path)
            if isinstance(value, dict | list):
                walk(value, f"{path}.")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return keys


def compose_unchecked(
    overrides: Sequence[str] = (),
    output_dir: str | Path | None = None,
    config_dirs: Sequence[str | Path] = (),
) -> DictConfig:
    """:func:`compose_config` with Hydra's own errors, for the checks that name them."""
    register_defaults()
    extra = [] if output_dir is None else [f"output_dir={output_dir}"]
    if config_dirs:
        paths = ",".join(f"file://{Path(d).resolve()}" for d in config_dirs)
        extra.append(f"hydra.searchpath=[{paths}]")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return string_domain_names(compose("config", overrides=[*overrides, *extra]))


JOB_RECORD = ".hydra"
"""Where a run directory keeps its launch's record (the name Hydra gives it)."""


def record_job(cfg: DictConfig, run_dir: Path) -> None:
    """Write what Hydra writes for a job — ``.hydra/config.yaml`` (``cfg``, unresolved),
    ``hydra.yaml`` and ``overrides.yaml`` — and log to ``RUN_DIR/<job name>.log``, once the run
    directory is this launch's. ``conf/config.yaml`` turns Hydra's own writing off, because
    Hydra writes before any code of the package runs: a launch refused for its directory (in use,
    or holding a finished run) replaced that run's record. Nothing to do outside a Hydra launch
    (a notebook's ``compose_config``)."""
    if not HydraConfig.initialized():
        return
    record = run_dir / JOB_RECORD
    record.mkdir(parents=True, exist_ok=True)
    hydra_cfg = HydraConfig.instance().cfg
    files = {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task),
    }
    for name, text in files.items():
        atomic_write_bytes(record / name, text.encode())
    log_to_file(run_dir / f"{hydra_cfg.hydra.job.name}.log")


def task_overrides(hydra: DictConfig) -> list[str]:
    """The overrides of the command line, as typed: a value interpolating a key of the job's
    config (``data.val_size=${data.batch_size}``) kept as its text. Read item by item,
    OmegaConf resolved it against Hydra's own config, which has no such key (a traceback)."""
    return [str(word) for word in OmegaConf.to_container(hydra.overrides.task, resolve=False)]


def config_options(hydra: DictConfig) -> list[str]:
    """The options besides the overrides that composed a run's config (``hydra``: its Hydra
    config): each ``--config-dir`` (recorded absolute, so valid from any directory) and another
    primary config's name. The command that resumes the run needs them: without them, the
    experiment in the user's own directory was not found. The shipped configs' path is not
    one: it is wherever the package is installed (another machine's, for a record)."""
    options = []
    for source in hydra.runtime.config_sources:
        if source.provider == "command-line" and source.schema == "file":
            options += ["--config-dir", str(source.path)]
    if hydra.job.config_name not in (None, "config"):
        options += ["--config-name", str(hydra.job.config_name)]
    return options


class JobRecord(Callback):
    """:func:`record_job` as a resumed ``fit`` starts, and the summary of the run it resumes
    past kept aside (``work_left.retire_summary``): after its checkpoint has been accepted
    (``training/provenance.py``), so a resume refused for its settings leaves the run's record
    and summary as the run wrote them."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            record_job(self.cfg, self.run_dir)
            retire_summary(self.run_dir)


def log_to_file(path: Path) -> None:
    """Add Hydra's job-log file handler (its format, appending) to the root logger, once."""
    root = logging.getLogger()
    target = str(path.resolve())
    if any(getattr(h, "baseFilename", None) == target for h in root.handlers):
        return
    handler = logging.FileHandler(target, delay=True)  # the file appears with its first line
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)


LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
"""Hydra's default job-log format (``conf/hydra/job_logging/console.yaml`` keeps it too)."""
