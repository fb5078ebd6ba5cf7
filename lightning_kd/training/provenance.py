"""What a student learns from and how, recorded in every checkpoint and checked on resume.

Checkpoints leave the teacher out (it comes from ``teacher.path``), so a resume could silently
continue against another teacher. Each records the teacher (path, config and sampled-weights
digests, ``init_seed`` for a config-built one), the tokenizer (vocabulary digest), the objective,
a LoRA student's frozen base (digest), and the data (``data/provenance.py``) with the accumulation
that groups its batches into steps. A resume where any differs is refused with the differences
named, or only warned about with ``resume_mismatch=warn``; so is another gradient clipping, and
a ``student.dtype`` that would round the checkpoint's weights (``step_record.py``).

The optimizer's and the schedule's settings are recorded too, with which student parameters
train (``student.freeze_embeddings``, ``freeze_layers``: another set does not load the saved
optimizer state). A resume restores the optimizer's state — learning rate, betas, weight decay
included, and the schedule's base rates with them — so a new ``optimizer.lr`` would be silently
ignored; and the schedule is rebuilt from the config, so another ``scheduler`` or
``trainer.max_steps`` would silently reshape the learning rate mid-run (a longer cosine rises
again). A resume with any of them changed is refused (``resume_mismatch=warn`` cannot continue
it: that would be ignoring or hiding them) unless it says ``resume_reset_optimizer=true``, which
applies them on purpose: the optimizer starts afresh (no moments) with the new settings, and the
new schedule is moved to the checkpoint's step. ``trainer.max_steps`` below it is refused.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only

from lightning_kd.models.digests import vocab_digest
from lightning_kd.models.precision import AUTO, teacher_dtype_for
from lightning_kd.training.checkpoints import trained_set_error
from lightning_kd.training.differences import differences, resettable_line
from lightning_kd.training.optim import same_rates_from
from lightning_kd.training.regrouping import (
    Regrouping,
    continuing,
    grouping_record,
    regrouping,
    step_hint,
)
from lightning_kd.training.step_record import compute_changes, lossy_message, said_line, step_record
from lightning_kd.training.teacher_provenance import crosses, main_records, teachers_record
from lightning_kd.utils.refusal import Refused

KEY = "provenance"
"""Checkpoint entry holding the record."""
HOW_COMPUTED = ("foreach", "fused", "capturable", "differentiable", "maximize")
"""Optimizer arguments that change how its update is computed, not what it is."""
MODES = ("error", "warn")
OBJECTIVE_FIELDS = (
    *("divergence", "temperature", "kd_weight", "ce_weight", "beta", "skew", "on_policy"),
    *("features", "feature_loss", "feature_weight", "projector"),
    *("blockwise_passes", "blockwise_lr"),
)
"""The ``DistillConfig`` fields that define what is optimised (not how it is computed), the
block-wise repair before the first step included (a resume that adds one never runs it); one a
checkpoint does not record (a field added since it was saved) is not compared."""
CROSS_FIELDS = ("cross_loss", "cross_top_k", "cross_uld_weight", "cross_span_weight")
"""What a teacher with another tokenizer is compared by: recorded where a run has one."""
ON_POLICY_FIELDS = (
    *("on_policy_tokens", "on_policy_temperature", "on_policy_teacher_top_k"),
    *("on_policy_seed", "on_policy_warmup"),  # which micro-batches are sampled (probe 44)
)
"""How the student's own completions are drawn, and which: recorded where a run samples them."""


class ProvenanceMismatch(Refused):
    """A resume whose teacher, tokenizer or objective differs from the checkpoint's."""


def record(module: LightningModule, trainer: Trainer | None = None) -> dict[str, Any]:
    """The provenance of ``module``'s training: teacher, tokenizer, objective, and with the
    ``trainer`` fitting it, the data and the optimizer."""
    spec = module.teacher_spec
    auto = spec.dtype == AUTO
    teacher = {
        "path": spec.path,
        "gguf_file": spec.gguf_file,
        "task": spec.task,
        # auto follows trainer.precision: another precision is another teacher dtype, named so
        "dtype": teacher_dtype_for(str(trainer.precision)) if auto and trainer else spec.dtype,
        "quantize": spec.quantize,
        "init_seed": spec.init_seed if spec.config is not None else None,
        "config": module.teacher_config,
        "weights": module.teacher_digest,
        "records": main_records(module),
    }
    tokenizer = module.tokenizer
    distill = dataclasses.asdict(module.distill)
    keys = (*OBJECTIVE_FIELDS, *(CROSS_FIELDS if crosses(module) else ()))
    keys += ON_POLICY_FIELDS if module.distill.on_policy else ()
    found = {
        "teacher": teacher,
        "tokenizer": {"vocab": vocab_digest(tokenizer) if tokenizer is not None else None},
        "distill": json.loads(json.dumps({k: distill[k] for k in keys}, default=str)),
    }
    found["teachers"] = teachers_record(module)
    student = module.student_spec
    found["student"] = {
        "freeze_embeddings": student.frozen_embeddings,
        "freeze_layers": student.freeze_layers,
    }
    if module.student_base_digest is not None:  # LoRA: the base is not in the checkpoint either
        found["student"]["base"] = module.student_base_digest
    if trainer is not None:
        found |= run_settings(module, trainer)
    return found


def run_settings(module: LightningModule, trainer: Trainer) -> dict[str, Any]:
    """The data, the step's grouping of batches and the optimizer of this fit."""
    found: dict[str, Any] = {}
    datamodule = trainer.datamodule
    if datamodule is not None and hasattr(datamodule, "provenance"):
        found["data"] = datamodule.provenance() | grouping_record(trainer)
    optimizer = factory_settings(getattr(module, "optimizer_factory", None))
    found["optimizer"] = {k: v for k, v in optimizer.items() if k not in HOW_COMPUTED}
    schedule = factory_settings(getattr(module, "scheduler_factory", None))
    if schedule["name"] is not None:  # its length is the run's: another max_steps reshapes it
        schedule["max_steps"] = trainer.max_steps
        if trainer.max_steps in (None, -1):  # by epochs: their count is its length (probe 47)
            schedule["max_epochs"] = trainer.max_epochs
    found["schedule"] = schedule
    return found | step_record(module, trainer)


def factory_settings(factory: Any) -> dict[str, Any]:
    """``{"name": ..., <keyword>: <value>}`` of an optimizer factory (Hydra's ``_partial_``
    gives a ``functools.partial``), JSON-safe; ``{"name": None}`` for none."""
    if factory is None:
        return {"name": None}
    func = getattr(factory, "func", factory)
    name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"
    keywords = getattr(factory, "keywords", {}) or {}
    return json.loads(json.dumps({"name": name} | dict(keywords), default=str))


class Provenance(Callback):
    """Writes the record into each checkpoint and checks it when a run resumes; with
    ``reset_optimizer`` (``resume_reset_optimizer=true``) a resume starts the optimizer afresh
    and moves the schedule to the checkpoint's step (see the module doc)."""

    def __init__(self, on_mismatch: str = "error", reset_optimizer: bool = False) -> None:
        if on_mismatch not in MODES:
            raise ValueError(f"resume_mismatch={on_mismatch!r}: choose one of {list(MODES)}")
        if not isinstance(reset_optimizer, bool):
            raise ValueError(f"resume_reset_optimizer={reset_optimizer!r}: use true or false")
        self.on_mismatch = on_mismatch
        self.reset_optimizer = reset_optimizer
        self._record: dict[str, Any] | None = None
        self._fast_forward = False  # the fresh schedule still has to reach the resumed step
        self._split: Regrouping | None = None  # the epoch's position to move (regrouping.py)

    def current(self, trainer: Trainer, module: LightningModule) -> dict[str, Any]:
        if self._record is None:  # the teacher, objective and data never change within a run
            self._record = record(module, trainer)
        return self._record

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        checkpoint[KEY] = self.current(trainer, pl_module)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        saved = checkpoint.get(KEY)
        where = trainer.ckpt_path or "the checkpoint"
        if self.reset_optimizer and trainer.state.fn == "fit":
            self._reset(trainer, checkpoint)
        check_steps_left(checkpoint.get("global_step", 0), trainer.max_steps, where)
        if saved is None:  # judged by its optimizer alone (below)
            warnings.warn(
                f"{where} records no teacher, tokenizer or distill config (saved by an older "
                "version): resuming without checking them",
                stacklevel=2,
            )
        else:
            current, regrouped = self.current(trainer, pl_module), []
            hint = step_hint(saved, current, checkpoint)
            if split := regrouping(saved, current, checkpoint):  # the same steps, other batches
                current, regrouped = split.as_saved(current), split.lines(pl_module.student)
                self._split = split if trainer.state.fn == "fit" else None
            step, then = checkpoint.get("global_step", 0), saved.get("schedule", {})
            same_rates = same_rates_from(
                getattr(pl_module, "scheduler_factory", None),
                step,
                then.get("max_steps", -1),
                trainer.max_steps,
            )
            self._compare(saved, current, where, same_rates, regrouped, hint)
        if error := trained_set_error(checkpoint, trainer, pl_module, where):
            raise ProvenanceMismatch(error)

    def _compare(
        self,
        saved: dict[str, Any],
        current: dict[str, Any],
        where: str,
        same_rates: bool = False,
        regrouped: list[str] | None = None,
        hint: str = "",
    ) -> None:
        """Refuse (or, with ``resume_mismatch=warn``, warn about) what differs from ``saved``;
        say the computations that change (``step_record.py``), ``regrouped`` among them (the
        same steps in other batches, ``regrouping.py``; ``hint``: why a split could not be).
        ``same_rates``: a longer ``max_steps`` whose rates from the checkpoint's step on are its
        plan's is no change."""
        found = differences(saved, current)
        if same_rates:  # lengthened, the same rates from its step on (optim.py)
            found = [line for line in found if not line.startswith("schedule.max_steps:")]
        lossy, said = compute_changes(saved, current)
        said += regrouped or []
        resettable = [line for line in found if resettable_line(line)]
        others = [line for line in found if line not in resettable]
        refused = [] if self._fast_forward else resettable
        message = ""
        if others:
            message += (
                f"{where} was trained with a different teacher, tokenizer, objective, data or "
                "gradient clipping:\n  "
                + "\n  ".join(others)
                + hint
                + "\nResume with the same settings, start a new run, or pass "
                "resume_mismatch=warn to continue anyway"
            )
        if lossy:
            message += ("\n" if message else "") + f"{where}: " + lossy_message(lossy)
        if message and self.on_mismatch == "warn" and not refused:
            warnings.warn(message + continuing(others), stacklevel=2)
            message = ""
        if refused:  # named with the rest: one refusal says everything to change
            message += ("\n" if message else "") + resettable_message(refused, where)
        if message:
            raise ProvenanceMismatch(message)
        if said:
            rank_zero_only(print)(said_line(said, where))

    def _reset(self, trainer: Trainer, checkpoint: dict[str, Any]) -> None:
        """Leave the checkpoint's optimizer and scheduler states out of the restore: Lightning
        loads them pairwise with the run's, so none are loaded and the run's fresh ones stay."""
        if not trainer.strategy.lightning_restore_optimizer:
            raise ValueError(
                f"resume_reset_optimizer=true: {type(trainer.strategy).__name__} restores its "
                "optimizer itself, and cannot start it afresh; resume without it"
            )
        checkpoint["optimizer_states"] = []
        checkpoint["lr_schedulers"] = []
        self._fast_forward = True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._split is not None:
            self._split.move(trainer)
            self._split = None
        if not self._fast_forward:
            return
        self._fast_forward = False
        for config in trainer.lr_scheduler_configs:
            steps = trainer.global_step if config.interval == "step" else trainer.current_epoch
            with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(steps // config.frequency):
                    config.scheduler.step()
        print(
            f"\nresume_reset_optimizer=true: a fresh optimizer from optimizer step "
            f"{trainer.global_step}, learning rate now {lr_now(trainer):.3g}"
        )


def resettable_message(refused: list[str], where: str) -> str:
    """The refusal's paragraph for the optimizer, schedule and trained-set differences."""
    return (
        f"{where} was trained with other optimizer, schedule or trained-parameter settings, "
        "which a resume would ignore (the optimizer's state), apply silently mid-run (the "
        "schedule) or fail to load (another set of trained parameters):\n  "
        + "\n  ".join(refused)
        + "\nResume with the checkpoint's settings, or apply the new ones on purpose with "
        "resume_reset_optimizer=true (a fresh optimizer, the new schedule at the checkpoint's "
        "step)"
    )


def check_steps_left(step: int, max_steps: int, where: str) -> None:
    """Refuse a resume whose ``trainer.max_steps`` is below the checkpoint's optimizer step: it
    would train nothing and end as if it had (the student exported, the summary rewritten)."""
    if max_steps is not None and 0 <= max_steps < step:
        raise ProvenanceMismatch(
            f"trainer.max_steps={max_steps} but {where} is at optimizer step {step}: there is "
            f"nothing left to train; resume with trainer.max_steps={step} or more"
        )


def lr_now(trainer: Trainer) -> float:
    """The first optimizer's first parameter group's learning rate."""
    return float(trainer.optimizers[0].param_groups[0]["lr"]) if trainer.optimizers else 0.0
