"""The LightningModule: Lightning's hooks around a :class:`~lightning_kd.distiller.Distiller`.

The distiller owns the models and the step's math; this module adds what Lightning runs:

- the models are built in ``configure_model`` (where a sharding strategy can wrap them), once;
- the teacher is never handed to the optimizer and never written to a checkpoint;
- exact loss normalisation under gradient accumulation: each micro-batch returns the *sum* of its
  per-token loss, the window's scored tokens are counted as it goes, and the accumulated gradients
  are rescaled once in ``on_before_optimizer_step`` (before clipping): the applied gradient is that
  of the token mean over the whole window — in a last partial window too, and across ranks.

``save_hyperparameters`` stores the teacher, student and distill settings as plain data, so
``DistillationModule.load_from_checkpoint(path)`` rebuilds the module (teacher from
``teacher.path``) without the teacher in the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from torch.optim import Optimizer
from transformers import PreTrainedTokenizerBase

from lightning_kd.accumulation import Window
from lightning_kd.compat import silence_eval_mode_warning
from lightning_kd.config import plain_data
from lightning_kd.distiller import Distiller
from lightning_kd.finite import check_finite_loss
from lightning_kd.metrics import ValidationMetrics
from lightning_kd.models import StudentSpec, TeacherSpec, load_tokenizer
from lightning_kd.objective import DistillConfig
from lightning_kd.optim import decay_groups
from lightning_kd.provenance import weights_digest
from lightning_kd.strategies import ROLE

TEACHER_PREFIX = "distiller.teacher."
STUDENT_PREFIX = "distiller.student."


def as_spec(value: Any, spec: type) -> Any:
    """``value`` as a ``spec`` dataclass (checkpoints store specs as plain dicts)."""
    return value if isinstance(value, spec) else spec(**value)


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
    ) -> None:
        super().__init__()
        self.teacher_spec = as_spec(teacher, TeacherSpec)
        self.student_spec = as_spec(student, StudentSpec)
        self.distill = as_spec(distill, DistillConfig)
        specs = {
            "teacher": self.teacher_spec,
            "student": self.student_spec,
            "distill": self.distill,
        }
        self.save_hyperparameters(
            {name: plain_data(dataclasses.asdict(s)) for name, s in specs.items()}
        )
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.tokenizer = tokenizer
        self.distiller: Distiller | None = None
        # Checkpoints omit the teacher; on_load_checkpoint checks everything else is present.
        self.strict_loading = False
        self.val_metrics = ValidationMetrics()
        self.window = Window()
        self.teacher_perplexity: float | None = None
        self.tokens_seen = 0
        """Scored training tokens so far, over all ranks."""
        self.fit_validation: tuple[int, dict[str, float]] | None = None
        """``(global_step, metrics)`` of the latest validation inside ``fit``."""
        self.teacher_digest: str | None = None
        """``provenance.weights_digest`` of the teacher as loaded (checkpoints record it)."""

    @property
    def teacher(self) -> nn.Module | None:
        return None if self.distiller is None else self.distiller.teacher

    @property
    def student(self) -> nn.Module | None:
        return None if self.distiller is None else self.distiller.student

    def configure_model(self) -> None:
        """Build teacher and student (Lightning calls this once per stage; build only once)."""
        if self.distiller is not None:
            return
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.teacher_spec)
        # teacher.dtype=auto follows the trainer's precision (bf16-mixed: a bf16 teacher).
        precision = str(self._trainer.precision) if self._trainer is not None else None
        self.distiller = Distiller.from_specs(
            self.teacher_spec, self.student_spec, self.distill, self.tokenizer, precision
        )
        self.teacher_digest = weights_digest(self.teacher)  # before any strategy shards it
        for role in ("teacher", "student"):  # the bodies the step calls, for wrap policies
            setattr(getattr(self, role).base_model, ROLE, role)

    def configure_optimizers(self) -> dict[str, Any]:
        if self.optimizer_factory is None:
            raise ValueError(
                "DistillationModule has no optimizer (a module loaded with load_from_checkpoint "
                "does not store one): pass optimizer=functools.partial(torch.optim.AdamW, lr=...)"
            )
        optimizer = self.optimizer_factory(decay_groups(self.distiller.trainable_parameters()))
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = self.scheduler_factory(optimizer, total_steps=total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    # ------------------------------------------------------------------------- training

    def on_fit_start(self) -> None:
        # Lightning warns about every module in eval mode at the start of training. The teacher's
        # modules are meant to be; a warning naming exactly that many would only be noise, while
        # any other count (a student module left in eval) still warns.
        count = sum(1 for _ in self.teacher.modules())
        silence_eval_mode_warning(self.trainer, count)
        self.window.reset()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        objective, sums = self.distiller(batch)
        self.window.add(sums)
        # Lightning divides this by accumulate_grad_batches; on_before_optimizer_step turns the
        # accumulated gradient into that of the window's token mean.
        return objective

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        totals = self.window.reduced(self.trainer.strategy)
        self.window.rescale_gradients(
            self.distiller.trainable_parameters(),
            totals["tokens"],
            self.trainer.accumulate_grad_batches,
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
        self.log_dict(logged, on_step=True, on_epoch=False)
        self.tokens_seen += int(totals["tokens"])

    # ------------------------------------------------------------------------- validation

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        for name, (total, count) in self.distiller.evaluate(batch).items():
            # The teacher does not change: its perplexity is measured once.
            if name != "teacher_ppl" or self.teacher_perplexity is None:
                self.val_metrics.update(name, total, count)

    def on_validation_epoch_end(self) -> None:
        metrics = self.val_metrics.compute()
        self.val_metrics.reset()
        # A sanity check sees too few batches to be the teacher's perplexity.
        if "val/teacher_ppl" in metrics and not self.trainer.sanity_checking:
            self.teacher_perplexity = float(metrics["val/teacher_ppl"])
        self.log_dict(metrics, prog_bar=True)
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            values = {name: float(value) for name, value in metrics.items()}
            self.fit_validation = (self.trainer.global_step, values)

    def validation_at(self, step: int) -> dict[str, float] | None:
        """The metrics of a validation inside ``fit`` at optimizer step ``step``, if one ran:
        the final student need not be validated a second time."""
        if self.fit_validation is None or self.fit_validation[0] != step:
            return None
        return dict(self.fit_validation[1])

    # ------------------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Drop the frozen teacher's weights: they come from ``teacher.path``, not checkpoints."""
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith(TEACHER_PREFIX)]:
            del state[key]
        checkpoint["tokens_seen"] = self.tokens_seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint that lacks any trainable weight (only teacher keys may be absent)."""
        state = checkpoint["state_dict"]
        own = self.state_dict()
        missing = [k for k in own if not k.startswith(TEACHER_PREFIX) and k not in state]
        if missing:
            raise KeyError(
                f"checkpoint lacks {len(missing)} student weights (e.g. {missing[:3]}); it was "
                "saved from a different student configuration"
            )
        if self._trainer is None:
            # load_from_checkpoint: the teacher just loaded from teacher.path fills its own
            # keys, so loading reports no hundreds of "missing" teacher weights.
            state.update({k: v for k, v in own.items() if k.startswith(TEACHER_PREFIX)})
        self.tokens_seen = checkpoint.get("tokens_seen", 0)

    @rank_zero_only
    def export_student(self, directory: str) -> None:
        """Save the student (without projectors or training state) with the teacher's tokenizer."""
        self.distiller.export(directory, self.tokenizer)
