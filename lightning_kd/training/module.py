"""The LightningModule: Lightning's hooks around a ``distill.distiller.Distiller``.

The distiller owns the models and the step's math. This module builds it in ``configure_model``
(where a strategy can wrap it), keeps the teacher out of the optimizer and the checkpoints (and a
LoRA student's frozen base, rebuilt like the teacher), and makes accumulation exact: each
micro-batch returns its per-token loss *sum*, and ``on_before_optimizer_step`` (before clipping)
divides the window's gradients once by its scored tokens over all ranks. ``save_hyperparameters``
keeps the specs as plain data: ``load_from_checkpoint(path)`` rebuilds the teacher from its spec.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.optim import Optimizer
from transformers import PreTrainedTokenizerBase

from lightning_kd.distill.accumulation import Window
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.repair import RepairReport
from lightning_kd.distill.teacher_entries import teacher_entries
from lightning_kd.models.digests import config_digest, weights_digest
from lightning_kd.models.loading import StudentSpec, TeacherSpec
from lightning_kd.models.student import run_tokenizer
from lightning_kd.training.checkpoints import (
    STUDENT_PREFIX,
    check_trainable_keys,
    drop_rebuilt,
    frozen_student_keys,
    is_rebuilt,
    spec_changes,
)
from lightning_kd.training.finite import check_finite_loss
from lightning_kd.training.grad_norm import gradient_norm
from lightning_kd.training.metrics import ValidationMetrics, checked_monitors, log_at_steps_done
from lightning_kd.training.optim import optimizer_config
from lightning_kd.training.repair import BlockwiseRepair
from lightning_kd.training.strategies import int8_teachers, loss_divisor, mark_bodies, window_ends
from lightning_kd.utils.compat import attached_trainer, exclude_from_ddp, silence_eval_mode_warning
from lightning_kd.utils.plain_data import as_spec, plain_data
from lightning_kd.utils.rng import float32_init, rng_state, set_rng_state


class DistillationModule(LightningModule):
    """Distils ``teacher`` into ``student`` with the objective ``distill`` describes."""

    def __init__(
        self,
        teacher: TeacherSpec | dict,
        student: StudentSpec | dict,
        distill: DistillConfig | dict,
        optimizer: Callable[..., Optimizer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        teachers: list[dict] | None = None,
    ) -> None:
        super().__init__()
        self.teacher_spec = as_spec(teacher, TeacherSpec)
        self.teachers = teacher_entries(teachers, self.teacher_spec)
        """Every teacher with its weight, where the run has several (``distill/teachers.py``)."""
        self.student_spec = as_spec(student, StudentSpec)
        self.distill = as_spec(distill, DistillConfig)
        specs = {"teacher": self.teacher_spec, "student": self.student_spec}
        specs |= {"teachers": teachers} if teachers else {}
        self.save_hyperparameters(plain_data(specs | {"distill": self.distill}))
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.tokenizer = tokenizer
        self.distiller: Distiller | None = None
        self.strict_loading = False  # checkpoints omit the teacher (see on_load_checkpoint)
        names = tuple(entry.name for entry in self.teachers or ())
        self.val_metrics = ValidationMetrics(names)
        self.window = Window(span=self.distill.cross_span_weight > 0)  # train/span, every rank
        self.teacher_perplexity: float | None = None
        self.before: dict[str, float] = {}
        """The untrained student's validation metrics (``validate_before``), kept in checkpoints."""
        self.tokens_seen = 0
        """Scored training tokens so far, over all ranks."""
        self.resumed_rng: dict[str, Any] | None = None
        """A resumed checkpoint's random state, put back before its first batch."""
        self.fit_validation: tuple[int, dict[str, float]] | None = None
        """``(global_step, metrics)`` of the latest validation inside ``fit``."""
        self.teacher_digest: str | None = None
        """``digests.weights_digest`` of the teacher as loaded (checkpoints record it)."""
        self.rebuilt_student_keys: frozenset[str] = frozenset()
        """A LoRA student's frozen base: rebuilt on load like the teacher, never checkpointed."""
        self.student_base_digest: str | None = None
        """``weights_digest`` of a LoRA student's frozen base as built (checkpoints record it)."""
        self.teacher_config: str | None = None
        """``digests.config_digest`` of the teacher's Hugging Face config."""
        self.extra_digests: dict[str, dict[str, str]] = {}
        """With several teachers, each other teacher's weights and config digests, as loaded."""
        self.blockwise: RepairReport | None = None
        """What ``distill.blockwise_passes`` did before the first step (None: not run here);
        set by the :class:`~lightning_kd.training.repair.BlockwiseRepair` stage."""

    @property
    def teacher(self) -> nn.Module | None:
        return None if self.distiller is None else self.distiller.teacher

    @property
    def student(self) -> nn.Module | None:
        return None if self.distiller is None else self.distiller.student

    @float32_init  # under 64-true, Lightning's default dtype: the same seed, another model
    def configure_model(self) -> None:
        """Build teacher and student (Lightning calls this once per stage; build only once)."""
        if self.distiller is not None:
            return
        if self.tokenizer is None:
            self.tokenizer = run_tokenizer(self.teacher_spec, self.student_spec)
        trainer = attached_trainer(self)
        # teacher.dtype=auto follows the trainer's precision (bf16-mixed: a bf16 teacher).
        precision = str(trainer.precision) if trainer is not None else None
        distill = self.distill
        data = trainer.datamodule if trainer is not None else None
        if distill.teacher_cache is not None and data is None:
            # load_from_checkpoint (no trainer, no data to match a cache to): the teacher itself.
            distill = replace(distill, teacher_cache=None)
        self.distiller = Distiller.from_specs(
            self.teacher_spec,
            self.student_spec,
            distill,
            self.tokenizer,
            precision,
            data,
            self.teachers,
        )
        cached = self.distiller.cached_teacher
        # Before any strategy shards it; a cached teacher's is the one its cache was keyed by.
        self.teacher_digest = cached.key.teacher_weights if cached else weights_digest(self.teacher)
        self.teacher_config = (
            cached.key.teacher_config if cached else config_digest(self.teacher.config)
        )
        if (extra := self.distiller.extra_teachers) is not None:
            self.extra_digests = extra.digests()
        self.note_student_base()
        exclude_from_ddp(self, int8_teachers(self.distiller))
        mark_bodies(self.distiller)

    def note_student_base(self) -> None:
        """A LoRA student's frozen base: its keys (rebuilt on load, never checkpointed) and its
        digest, by the names as built, before a strategy wraps them."""
        if self.distiller.adapter is None:
            return
        self.rebuilt_student_keys = frozen_student_keys(self.student)
        base = {key.removeprefix(STUDENT_PREFIX) for key in self.rebuilt_student_keys}
        self.student_base_digest = weights_digest(self.student, base)

    def configure_optimizers(self) -> dict[str, Any]:
        params = self.distiller.trainable_parameters()  # never the teacher's

        def total_steps() -> int:
            return int(self.trainer.estimated_stepping_batches)

        return optimizer_config(self.optimizer_factory, self.scheduler_factory, params, total_steps)

    # ------------------------------------------------------------------------- training

    def on_fit_start(self) -> None:
        # Lightning warns about every module in eval mode when training starts: the teacher's
        # are meant to be; any other count (a student module left in eval) still warns.
        frozen = [m for m in (self.teacher, self.distiller.extra_teachers) if m is not None]
        teacher_modules = sum(len(list(model.modules())) for model in frozen)
        silence_eval_mode_warning(self.trainer, teacher_modules)
        self.window.reset()
        if (domains := self.distiller.domains).named and domains.weights is None:
            domains.know_data(self.trainer.datamodule)  # built without it

    def configure_callbacks(self) -> list[Callback]:
        """The block-wise repair is a stage of its own that runs before the first step
        (``training/repair.py``); declared here so that any Trainer fitting this module runs it."""
        attached = any(isinstance(c, BlockwiseRepair) for c in self.trainer.callbacks)
        # Lightning asks once per stage (validate, then fit): one repair stage is enough.
        return [BlockwiseRepair()] if self.distill.blockwise_passes and not attached else []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.resumed_rng is not None:
            set_rng_state(self.resumed_rng)
            self.resumed_rng = None

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # Numbers the micro-batch for distill.on_policy: the same draws again after a resume.
        step = self.global_step
        objective, sums = self.distiller(batch, draw=step * 1_000_003 + batch_idx, step=step)
        self.window.add(sums)
        return objective  # a token sum: on_before_optimizer_step turns it into the window's mean

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning's FSDP precision refuses clipping by norm: FSDP's own clip_grad_norm_ reduces
        # the norm over ranks. After on_before_optimizer_step, on the window-scaled gradients.
        fsdp = isinstance(self.trainer.model, FullyShardedDataParallel)
        if fsdp and gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            self.trainer.model.clip_grad_norm_(gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        if not window_ends(self.trainer):  # DeepSpeed: called after every micro-batch
            return
        totals = self.window.reduced(self.trainer.strategy)
        self.window.rescale_gradients(
            self.distiller.trainable_parameters(),
            totals["tokens"],
            loss_divisor(self.trainer),  # Lightning (and DeepSpeed) divided each loss by it
            self.trainer.world_size,
        )
        self.window.reset()
        parts = self.window.means(totals, self.distiller.objective)
        if not self.distiller.layer_pairs:
            del parts["features"]
        # Before the optimizer applies it: the weights stay those of the last finite step.
        check_finite_loss(self.trainer.global_step + 1, parts)
        self.log("train/loss", parts.pop("loss"), prog_bar=True, on_step=True, on_epoch=False)
        logged = {f"train/{name}": value for name, value in parts.items()}
        logged |= gradient_norm(self.trainer, self.distiller.trainable_parameters())
        if (sampler := self.distiller.on_policy) is not None and sampler.teacher_top_k:
            # NaN where the step wrote nothing: a value Lightning re-logged stale (probe 44).
            share = sampler.tally.take()  # interleaved: how much text was the student's own
            logged["train/student_token_share"] = math.nan if share is None else share
        self.log_dict(logged, on_step=True, on_epoch=False)
        self.tokens_seen += int(totals["tokens"])

    # ------------------------------------------------------------------------- validation

    def on_validation_start(self) -> None:
        # The metrics' plain tensor states move only with ``module.to``, which ZeRO-3 and FSDP do
        # not call: put them where the step's tensors are, or the first update fails on a GPU.
        self.val_metrics.to(self.trainer.strategy.root_device)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        # The teacher's perplexity too, at every validation: it costs nothing beside its KL, and
        # one kept from the first (a fit's validation of limit_val_batches) was another set's.
        for name, (total, count) in self.distiller.evaluate(batch).items():
            self.val_metrics.update(name, total, count)

    def on_validation_epoch_end(self) -> None:
        metrics = self.val_metrics.compute()
        self.val_metrics.reset()
        if self.trainer.sanity_checking:  # check_monitors_first: the names, before training
            checked_monitors(self.trainer.callbacks, metrics)
        elif "val/teacher_ppl" in metrics:  # a sanity check sees too few batches to measure it
            self.teacher_perplexity = float(metrics["val/teacher_ppl"])
        fitting = self.trainer.state.fn == "fit"
        # Reduced already, alike on every rank: their max is each, bit for bit (unsynced: warned)
        self.log_dict(metrics, prog_bar=True, logger=not fitting, sync_dist=True, reduce_fx="max")
        if fitting and not self.trainer.sanity_checking:
            values = {name: float(value) for name, value in metrics.items()}
            log_at_steps_done(self.trainer, values)
            self.fit_validation = (self.trainer.global_step, values)

    def validation_at(self, step: int) -> dict[str, float] | None:
        """The metrics of a validation inside ``fit`` at optimizer step ``step``, if one ran:
        the final student need not be validated a second time."""
        if self.fit_validation is None or self.fit_validation[0] != step:
            return None
        return dict(self.fit_validation[1])

    # ------------------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        drop_rebuilt(checkpoint["state_dict"], self.rebuilt_student_keys)
        checkpoint["tokens_seen"] = self.tokens_seen
        checkpoint["validation_before"] = self.before  # a resume reports them without rerunning
        checkpoint["fit_validation"] = self.fit_validation  # a resume at its step reuses it
        checkpoint["rng"] = rng_state()  # dropout (a LoRA adapter's, GPT-2's) goes on as it was

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state, own = checkpoint["state_dict"], self.state_dict()
        saved_student = checkpoint.get("hyper_parameters", {}).get("student")
        check_trainable_keys(
            state, own, self.rebuilt_student_keys, spec_changes(saved_student, self.hparams)
        )
        attached = attached_trainer(self) is not None
        if not attached:  # load_from_checkpoint: the models just built fill their keys
            rebuilt = {k: v for k, v in own.items() if is_rebuilt(k, self.rebuilt_student_keys)}
            state.update(rebuilt)
        self.tokens_seen = checkpoint.get("tokens_seen", 0)
        self.before = dict(checkpoint.get("validation_before", {}))
        self.fit_validation = checkpoint.get("fit_validation")  # (step, metrics) or None
        # Put back at the first resumed batch: the loader's iterator draws first (as at step 0).
        self.resumed_rng = checkpoint.get("rng") if attached else None

    @rank_zero_only
    def export_student(self, directory: str) -> None:
        """Save the student (without projectors or training state) with the run's tokenizer
        (the student's own where it has one, else the teacher's)."""
        self.distiller.export(directory, self.tokenizer)
