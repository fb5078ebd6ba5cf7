"""Logger choices checked before anything loads: the package a logger runs on is installed, and
a callback that logs has a logger (Lightning would say so only once the models are built)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.util import find_spec
from typing import Any

LOGGER_PACKAGES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "TensorBoardLogger": ("tensorboard", ("tensorboard", "tensorboardX"), "tensorboard"),
    "MLFlowLogger": ("mlflow", ("mlflow",), "mlflow"),
    "MLflowRunLogger": ("mlflow", ("mlflow",), "mlflow"),  # logger=mlflow (training/mlflow_log)
    "WandbLogger": ("wandb", ("wandb",), "wandb"),
}
"""Lightning logger class -> (its ``logger=`` option, modules any one of which it runs on, the
pip package to install). Lightning itself would say so only once the models are built."""

NEEDS_LOGGER = ("LearningRateMonitor", "StepLearningRates", "DeviceStatsMonitor")
"""Callbacks that Lightning refuses to run without a logger."""


def _class_name(node: Any) -> str:
    target = node.get("_target_") if isinstance(node, Mapping) else None
    return str(target).rsplit(".", 1)[-1] if target else ""


def logger_configs(cfg: Mapping) -> dict[str, Any]:
    """``cfg.logger`` as ``{name: logger config}``: the logger group's form, or one config with
    its own ``_target_``; empty without a logger (``~logger``)."""
    logger = cfg.get("logger")
    if not isinstance(logger, Mapping):
        return {}
    if "_target_" in logger:
        return {"logger": logger}
    return {name: node for name, node in logger.items() if isinstance(node, Mapping)}


def logger_errors(cfg: Mapping) -> list[str]:
    loggers = logger_configs(cfg)
    if not loggers:
        callbacks = cfg.get("callbacks")
        names = [
            name
            for name, node in (callbacks.items() if isinstance(callbacks, Mapping) else ())
            if _class_name(node) in NEEDS_LOGGER
        ]
        removals = " ".join(f"'~callbacks.{name}'" for name in names)
        return [
            f"no logger, but callbacks.{name} ({_class_name(callbacks[name])}) logs to one: "
            f"keep a logger (e.g. logger=csv) or also remove the callback: ~logger {removals}"
            for name in names
        ]
    errors = []
    for name, node in loggers.items():
        option, modules, package = LOGGER_PACKAGES.get(_class_name(node), (name, (), ""))
        if modules and not any(find_spec(module) for module in modules):
            errors.append(
                f"logger={option} ({node['_target_']}) needs the {package} package, which is "
                f"not installed: pip install {package} (or choose another logger, e.g. logger=csv)"
            )
    return errors
