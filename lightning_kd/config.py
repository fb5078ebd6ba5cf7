"""One source for every default, and one way to compose the config.

The defaults of the ``teacher``, ``student``, ``distill`` and ``data`` groups are those of the
objects they build — the dataclasses :class:`~lightning_kd.models.TeacherSpec`,
:class:`~lightning_kd.models.StudentSpec`, :class:`~lightning_kd.objective.DistillConfig` and the
signature of :class:`~lightning_kd.data.TextDataModule` — registered with Hydra's ``ConfigStore``
as ``<group>/base``. The YAML files of ``conf/`` list ``base`` first and add only what differs
(a teacher's path, the smoke test's tiny sizes), so a default cannot drift between the two.

:func:`compose_config` is what ``python run.py <overrides>`` composes, without launching: the
tests, the benchmark and the notebooks use it, so they run the configuration users run.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from lightning_kd.cache.format import CacheSpec
from lightning_kd.data import TextDataModule
from lightning_kd.generate import GenerateSpec
from lightning_kd.models import StudentSpec, TeacherSpec
from lightning_kd.objective import DistillConfig

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
"""The repository's ``conf/`` (run.py's ``config_path``)."""

GROUP_TARGETS: dict[str, Callable[..., Any]] = {
    "teacher": TeacherSpec,
    "student": StudentSpec,
    "distill": DistillConfig,
    "data": TextDataModule,
    "cache": CacheSpec,
    "generate": GenerateSpec,
}
"""Config group → what its node instantiates; its keyword defaults are the group's defaults."""


def defaults_node(target: Callable[..., Any]) -> dict[str, Any]:
    """``{"_target_": ..., <keyword>: <default>, ...}`` for every keyword of ``target`` that has a
    default (arguments without one, like the data module's tokenizer, are passed by the caller)."""
    node: dict[str, Any] = {"_target_": f"{target.__module__}.{target.__qualname__}"}
    for name, parameter in inspect.signature(target).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            node[name] = copy.deepcopy(parameter.default)
    return node


def on_default_corpus(files: Any, value: Any) -> Any:
    """``value`` when ``data.files`` is null (the embedded corpus), else null: for settings of the
    default run that must not follow a user to their own files (``conf/data/text.yaml``)."""
    return value if files is None else None


def register_defaults() -> None:
    """Store each group's defaults as ``<group>/base`` (idempotent: the same node each time), and
    the ``kd.*`` resolvers the YAML files use."""
    OmegaConf.register_new_resolver("kd.on_default_corpus", on_default_corpus, replace=True)
    store = ConfigStore.instance()
    for group, target in GROUP_TARGETS.items():
        store.store(group=group, name="base", node=defaults_node(target))


def compose_config(
    overrides: Sequence[str] = (), output_dir: str | Path | None = None
) -> DictConfig:
    """The config ``python run.py <overrides>`` would run, with ``output_dir`` standing in for
    Hydra's run directory (required to build a trainer, optional to inspect values)."""
    register_defaults()
    extra = [] if output_dir is None else [f"output_dir={output_dir}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[*overrides, *extra])


def plain_data(value: Any) -> Any:
    """``value`` with every dataclass and mapping a dict and every sequence a list (a Hydra
    ``ListConfig`` included): what a checkpoint read with ``weights_only=True`` can hold."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {key: plain_data(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [plain_data(item) for item in value]
    return value


def as_spec(value: Any, spec: type) -> Any:
    """``value`` as a ``spec`` dataclass (checkpoints store specs as plain dicts)."""
    return value if isinstance(value, spec) else spec(**value)
