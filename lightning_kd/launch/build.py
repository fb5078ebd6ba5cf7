"""The wiring, written once: a composed config → module, data module and trainer.

``run.py``, the tests, the benchmark and the notebooks build through these functions, so each
runs the objects users get from ``python run.py``. Config stops here: what is built receives
plain arguments.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError
from transformers import PreTrainedTokenizerBase

from lightning_kd.cache.reader import written_dtype
from lightning_kd.data.text import TextDataModule
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.teacher_entries import teacher_entries
from lightning_kd.launch.logger_checks import logger_configs
from lightning_kd.models.precision import PrecisionChoice, probe_hardware, resolve_precision
from lightning_kd.models.student import run_tokenizer
from lightning_kd.training.module import DistillationModule
from lightning_kd.training.same_config import SameConfig
from lightning_kd.training.stop_reason import DecidedStop
from lightning_kd.training.strategies import check_accelerator
from lightning_kd.training.summary import TrainTimer
from lightning_kd.utils.compat import validate_every_steps
from lightning_kd.utils.plain_data import plain_data
from lightning_kd.utils.refusal import Refused


def with_values(cfg: DictConfig, values: dict[str, Any]) -> DictConfig:
    """A copy of ``cfg`` with the dotted keys of ``values`` set."""
    cfg = copy.deepcopy(cfg)
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def with_precision(
    cfg: DictConfig, announce: bool = True, training: bool = False
) -> tuple[DictConfig, PrecisionChoice]:
    """``cfg`` with ``trainer.precision`` and ``teacher.dtype`` concrete, and the choice (said
    once, on rank 0); ``training`` from a teacher cache directory, an ``auto`` teacher dtype is
    the cache's."""
    choice = resolve_precision(
        cfg.trainer.get("precision"),
        cfg.teacher.get("dtype"),
        probe_hardware(cfg.trainer.get("accelerator")),
    )
    cache = cfg.distill.get("teacher_cache") if training else None
    stored = written_dtype(cache) if cfg.teacher.get("dtype") in (None, "auto") else None
    if stored not in (None, choice.teacher_dtype):  # the teacher loads as its writer loaded it
        reason = f"{choice.reason}; teacher.dtype as the teacher cache {cache} was written"
        choice = replace(choice, teacher_dtype=stored, reason=reason)
    if announce and rank_zero_only.rank == 0:
        print(choice.line(), flush=True)
    values = {"trainer.precision": choice.precision, "teacher.dtype": choice.teacher_dtype}
    return with_values(cfg, values), choice


def build_datamodule(cfg: DictConfig, tokenizer: PreTrainedTokenizerBase) -> TextDataModule:
    """The data module of ``cfg.data``, tokenizing with ``tokenizer``; a refusal of its
    settings raised as itself (Hydra wraps what a constructor raises in its own error, which
    the commands would print as a traceback around the message's repr)."""
    try:
        return instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    except InstantiationException as error:
        if isinstance(error.__cause__, Refused):
            raise error.__cause__ from None
        raise


def build_module(
    cfg: DictConfig, tokenizer: PreTrainedTokenizerBase | None = None
) -> DistillationModule:
    """The LightningModule of ``cfg`` (its models are built by ``configure_model``)."""
    teacher = instantiate(cfg.teacher, _convert_="all")
    student = instantiate(cfg.student, _convert_="all")
    return DistillationModule(
        teacher=teacher,
        student=student,
        distill=instantiate(cfg.distill, _convert_="all"),
        optimizer=instantiate(cfg.optimizer, _convert_="all"),
        scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        tokenizer=tokenizer if tokenizer is not None else run_tokenizer(teacher, student),
        teachers=plain_data(cfg.get("teachers")),
    )


def build_distiller(cfg: DictConfig) -> tuple[Distiller, PreTrainedTokenizerBase]:
    """The plain-PyTorch distiller of ``cfg`` (models built, no Lightning) and the tokenizer.

    ``teacher.dtype`` must be concrete (``launch.auto.resolve``) or ``auto`` (then the
    teacher takes the dtype this machine computes fast).
    """
    teacher = instantiate(cfg.teacher, _convert_="all")
    student = instantiate(cfg.student, _convert_="all")
    tokenizer = run_tokenizer(teacher, student)
    entries = teacher_entries(plain_data(cfg.get("teachers")), teacher)
    distill = instantiate(cfg.distill, _convert_="all")
    distiller = Distiller.from_specs(teacher, student, distill, tokenizer, teachers=entries)
    return distiller, tokenizer


def build_trainer(cfg: DictConfig) -> tuple[L.Trainer, TrainTimer]:
    """The Trainer of ``cfg.trainer`` with the configured callbacks and logger, and the timer
    whose seconds the summary reports."""
    check_output_dir(cfg)
    strategy = cfg.trainer.get("strategy")
    check_accelerator(
        strategy.get("_target_") if isinstance(strategy, DictConfig) else strategy,
        cfg.trainer.get("accelerator"),
    )
    timer = TrainTimer()
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    callbacks += [timer, SameConfig(cfg), DecidedStop()]  # SameConfig: every process given it
    # The logger group's {name: config} (logger=[csv,tensorboard] for two); none with ~logger.
    logger = [instantiate(c) for c in logger_configs(cfg).values()] or False
    settings = in_batches(cfg) | logged_steps(cfg)
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, **settings)
    if "val_check_interval" in settings and trainer.accumulate_grad_batches > 1:
        validate_every_steps(trainer, cfg.trainer.val_check_interval)  # steps, counted as such
    return trainer, timer


def check_output_dir(cfg: DictConfig) -> None:
    """Refuse a config composed in Python without its run directory (``output_dir`` is Hydra's
    run directory, which only a launch sets): OmegaConf said "HydraConfig was not set"."""
    try:
        cfg.output_dir  # noqa: B018  # resolving it is the check
    except InterpolationResolutionError:
        raise Refused(
            "the config has no run directory (output_dir, which the command's Hydra sets): "
            "compose it with compose_config(overrides, output_dir=DIR), DIR the directory the "
            "run writes into"
        ) from None


def in_batches(cfg: DictConfig) -> dict[str, int | None]:
    """``trainer.val_check_interval``, which the configs give in optimizer steps, in the batches
    Lightning counts (× ``trainer.accumulate_grad_batches``): taken as batches, validations fell
    inside accumulation windows — several a step, of weights no step had changed, early stopping
    counting them — and the checkpoints after them (a resume skipped their window's batches)."""
    interval = cfg.trainer.get("val_check_interval")
    accumulate = cfg.trainer.get("accumulate_grad_batches") or 1
    if isinstance(interval, bool) or not isinstance(interval, int):
        return {}
    # Counted over the run, not restarted each epoch: an epoch-bounded run validated on each
    # epoch's batch grid (steps 3, 7, 11 for every 3), and refused, in Lightning's traceback,
    # an interval longer than an epoch (probe 50).
    return {"val_check_interval": interval * accumulate, "check_val_every_n_epoch": None}


def logged_steps(cfg: DictConfig) -> dict[str, int]:
    """``trainer.log_every_n_steps`` no longer than the run: a run of fewer optimizer steps
    logged no training loss at all (4 steps at the default 5)."""
    steps, every = cfg.trainer.get("max_steps"), cfg.trainer.get("log_every_n_steps")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (steps, every)):
        return {}
    return {"log_every_n_steps": steps} if 0 < steps < every else {}


def build(
    cfg: DictConfig, datamodule: TextDataModule | None = None
) -> tuple[DistillationModule, TextDataModule, L.Trainer, TrainTimer]:
    """Module, data module (``datamodule`` where given, already built from ``cfg.data``) and
    trainer from ``cfg`` (the models are built in the trainer).

    ``trainer.precision`` and ``teacher.dtype`` left ``auto`` are chosen for this machine as
    ``lightning-kd train`` chooses them (:func:`with_precision`, said in a line): a config
    composed in Python builds as the command would run it (Lightning refused ``auto``).
    """
    if "auto" in (cfg.trainer.get("precision"), cfg.teacher.get("dtype")):
        cfg, _ = with_precision(cfg, training=True)
    module = build_module(cfg, datamodule.tokenizer if datamodule is not None else None)
    datamodule = datamodule if datamodule is not None else build_datamodule(cfg, module.tokenizer)
    trainer, timer = build_trainer(cfg)
    return module, datamodule, trainer, timer
