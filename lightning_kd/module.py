"""The LightningModule: a frozen teacher, a trainable student, and the distillation step.

The teacher
- is built in ``configure_model`` (where a sharding strategy can wrap it), once;
- has ``requires_grad=False``, runs under ``torch.no_grad()`` with ``use_cache=False``;
- stays in eval mode through ``fit``/``validate`` and any ``module.train()`` (see :meth:`train`);
- is never handed to the optimizer and never written to a checkpoint.

Exact loss normalisation under gradient accumulation: each micro-batch returns the *sum* of its
per-token loss, the window's scored tokens are counted as it goes, and the accumulated gradients
are rescaled once in ``on_before_optimizer_step`` (which runs before clipping). The applied
gradient is then that of the token mean over the whole window, whatever the token count of each
micro-batch, in the last partial window too, and across ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor, nn
from torch.optim import Optimizer
from transformers import PreTrainedTokenizerBase

from lightning_kd.accumulation import Window
from lightning_kd.capture import ModuleCapture, capture_step
from lightning_kd.compat import silence_eval_mode_warning
from lightning_kd.features import LayerPair, layer_pairs, make_projectors
from lightning_kd.finite import check_finite_loss
from lightning_kd.losses.chunked import (
    OutputHead,
    chunked_distillation_sums,
    logit_chunks,
    matmul_dtype,
)
from lightning_kd.losses.divergences import get_divergence
from lightning_kd.losses.features import get_feature_loss, masked_feature_sum, mean_pool
from lightning_kd.losses.logits import (
    IGNORE_INDEX,
    LossSums,
    evaluation_sums,
    logit_distillation_sums,
    shift_for_next_token,
)
from lightning_kd.metrics import ValidationMetrics
from lightning_kd.models import (
    StudentSpec,
    TeacherSpec,
    build_student,
    check_vocabularies,
    load_teacher,
    load_tokenizer,
    logit_transform,
    student_tokenizer,
)
from lightning_kd.objective import DistillConfig
from lightning_kd.optim import decay_groups
from lightning_kd.provenance import weights_digest
from lightning_kd.strategies import ROLE

TEACHER_PREFIX = "teacher."


class DistillationModule(LightningModule):
    """Distils ``teacher`` into ``student`` with the objective ``distill`` describes."""

    def __init__(
        self,
        teacher: TeacherSpec,
        student: StudentSpec,
        distill: DistillConfig,
        optimizer: Callable[..., Optimizer],
        scheduler: Callable[..., Any] | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        super().__init__()
        self.teacher_spec = teacher
        self.student_spec = student
        self.distill = distill
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.tokenizer = tokenizer
        self.divergence = get_divergence(distill.divergence, beta=distill.beta, skew=distill.skew)
        self.teacher: nn.Module | None = None
        self.student: nn.Module | None = None
        self.layer_map: list[int] | None = None
        # Checkpoints omit the teacher; on_load_checkpoint checks everything else is present.
        self.strict_loading = False
        self.val_metrics = ValidationMetrics()
        self.teacher_perplexity: float | None = None
        self.layer_pairs: list[LayerPair] = []
        self.projectors = nn.ModuleList()
        self.captures: dict[str, ModuleCapture] = {}
        self.window = Window()
        self._heads_checked: set[str] = set()
        self.tokens_seen = 0
        """Scored training tokens so far, over all ranks."""
        self.fit_validation: tuple[int, dict[str, float]] | None = None
        """``(global_step, metrics)`` of the latest validation inside ``fit``."""
        self.teacher_digest: str | None = None
        """``provenance.weights_digest`` of the teacher as loaded (checkpoints record it)."""

    # ------------------------------------------------------------------------- models

    def configure_model(self) -> None:
        """Build teacher and student (Lightning calls this once per stage; build only once)."""
        if self.student is not None:
            return
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.teacher_spec)
        # teacher.dtype=auto follows the trainer's precision (bf16-mixed: a bf16 teacher).
        precision = str(self._trainer.precision) if self._trainer is not None else None
        teacher = load_teacher(self.teacher_spec, precision)
        self.teacher_digest = weights_digest(teacher)  # before any strategy shards it
        models = build_student(self.student_spec, teacher, self.teacher_spec.task)
        if self.teacher_spec.task == "causal_lm":
            check_vocabularies(
                teacher, models.student, self.tokenizer, student_tokenizer(self.student_spec)
            )
        self.teacher, self.student, self.layer_map = teacher, models.student, models.layer_map
        for role in ("teacher", "student"):  # the bodies the step calls, for wrap policies
            setattr(getattr(self, role).base_model, ROLE, role)
        self.layer_pairs = layer_pairs(
            self.distill.features,
            self.student,
            self.teacher,
            self.layer_map,
            self.distill.feature_loss,
            self.distill.feature_weight,
        )
        if self.layer_pairs:
            # Hooks go on once, here; the step decides when they record (capture.py).
            self.projectors = make_projectors(
                self.layer_pairs, self.student, self.teacher, self.distill.projector
            )
            self.captures = {
                "teacher": ModuleCapture(
                    self.teacher, [p.teacher for p in self.layer_pairs], "teacher"
                ),
                "student": ModuleCapture(
                    self.student, [p.student for p in self.layer_pairs], "student"
                ),
            }

    def train(self, mode: bool = True) -> DistillationModule:
        """Set train/eval mode on everything but the teacher, which always stays in eval."""
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter that learns: the student's (and projectors'), never the teacher's."""
        return (p for p in self.parameters() if p.requires_grad)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.optimizer_factory(decay_groups(self.trainable_parameters()))
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = self.scheduler_factory(optimizer, total_steps=total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    # ------------------------------------------------------------------------- forward passes

    @property
    def is_causal_lm(self) -> bool:
        return self.teacher_spec.task == "causal_lm"

    @property
    def uses_teacher_in_training(self) -> bool:
        """Whether a training step needs the teacher at all (a CE-only run skips it)."""
        return self.distill.kd_weight > 0 or bool(self.layer_pairs)

    def hidden_states(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """Final hidden states (after the last norm) of ``model``'s body: no head, no logits."""
        return model.base_model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            use_cache=False,
        ).last_hidden_state

    def logits(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """Full ``[batch, seq, vocab]`` logits (the unchunked path, kept for checking)."""
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            use_cache=False,
        ).logits

    def run(self, role: str, batch: dict[str, Tensor]) -> Tensor:
        """One forward of ``role`` with its capture armed: hidden states, or full logits.

        The teacher runs without a graph. Only this forward records captures: a forward
        elsewhere, or activation checkpointing's re-forward in backward, finds them disarmed.
        """
        model = getattr(self, role)
        capture = self.captures.get(role)
        if capture is not None:
            capture.ensure_attached()
        armed = capture.arm() if capture else nullcontext()
        with armed, torch.no_grad() if role == "teacher" else nullcontext():
            if self.is_causal_lm and not self.distill.chunked:
                return self.logits(model, batch)
            return self.hidden_states(model, batch)

    def scored_mask(self, batch: dict[str, Tensor]) -> Tensor:
        """``[batch, seq]``: the positions every loss term scores (and counts as tokens).

        For a causal LM, position t is scored when it predicts a label (``labels[t + 1]`` not
        −100); for an encoder, every attended position. A row whose labels are all −100 (the
        padding that evens out validation across ranks) scores nothing in either.
        """
        if not self.is_causal_lm:
            attended = batch["attention_mask"].bool()
            if "labels" not in batch:
                return attended
            return attended & (batch["labels"] != IGNORE_INDEX).any(dim=-1, keepdim=True)
        predicts = batch["labels"][:, 1:] != IGNORE_INDEX
        return torch.nn.functional.pad(predicts, (0, 1), value=False)

    def unsharded_parameters(self) -> list[nn.Parameter]:
        """What a sharding strategy must leave whole: the teacher's output head (its embedding,
        when tied), which the chunked loss reads outside any of the teacher's forwards."""
        head = self.teacher.get_output_embeddings() if self.is_causal_lm else None
        return [] if head is None else list(head.parameters())

    def output_head(self, model: nn.Module) -> OutputHead:
        """``model``'s output projection, as the chunked loss applies it."""
        head = model.get_output_embeddings()
        return OutputHead(head.weight, head.bias, logit_transform(model.config))

    def check_output_heads(self, batch: dict[str, Tensor], roles: tuple[str, ...]) -> None:
        """Once per model: the chunked path's hidden→head logits must equal the model's own.

        Catches architectures that post-process logits in a way :func:`logit_transform` does
        not know, before they silently train on wrong logits.
        """
        sample = {key: value[:1, :8] for key, value in batch.items()}
        for role in roles:
            if role in self._heads_checked:
                continue
            model = getattr(self, role)
            was_training = model.training
            model.eval()  # dropout would make the two forwards differ
            try:
                with torch.no_grad():
                    expected = self.logits(model, sample).float()
                    hidden = self.hidden_states(model, sample)
                    got = self.output_head(model).logits(hidden, matmul_dtype(hidden)).float()
            finally:
                model.train(was_training)
            if not torch.allclose(got, expected, rtol=2e-2, atol=2e-2):
                raise ValueError(
                    f"the {role} ({type(model).__name__}) computes its logits in a way the chunked "
                    "loss does not reproduce (max difference "
                    f"{(got - expected).abs().max():.3g}); set distill.chunked=false"
                )
            self._heads_checked.add(role)

    def logit_objective(
        self, student_out: Tensor, teacher_out: Tensor | None, batch: dict[str, Tensor]
    ) -> tuple[Tensor, LossSums]:
        """The logit terms' weighted token sum (differentiable) and the sums behind it."""
        if not self.is_causal_lm:  # an encoder has no logits: features are the whole objective
            tokens = self.scored_mask(batch).sum()
            zero = student_out.new_zeros((), dtype=torch.float32)
            return zero, LossSums(kd=zero, ce=zero, tokens=tokens)
        if not self.distill.chunked:
            sums = logit_distillation_sums(
                student_out, teacher_out, batch["labels"], self.divergence, self.distill.temperature
            )
            return self.objective(sums), sums
        return chunked_distillation_sums(
            student_out,
            self.output_head(self.student),
            teacher_out,
            self.output_head(self.teacher),
            batch["labels"],
            self.divergence,
            self.distill.temperature,
            self.distill.kd_weight,
            self.distill.ce_weight,
            self.distill.chunk_size,
            self.distill.compile,
        )

    def feature_sum(self, mask: Tensor) -> Tensor:
        """Σ over pairs of weight · Σ over scored positions of the pair's loss; reads and clears
        both captures."""
        student, teacher = self.captures["student"].pop(), self.captures["teacher"].pop()
        total = None
        for pair, projector in zip(self.layer_pairs, self.projectors, strict=True):
            value = pair.weight * masked_feature_sum(
                projector(student[pair.student]),
                teacher[pair.teacher],
                mask,
                get_feature_loss(pair.loss),
            )
            total = value if total is None else total + value
        return total

    def step_objective(self, batch: dict[str, Tensor]) -> tuple[Tensor, LossSums]:
        """The objective's token sum for one micro-batch (differentiable) and its parts."""
        with_teacher = self.uses_teacher_in_training
        if self.is_causal_lm and self.distill.chunked:
            self.check_output_heads(batch, ("student", "teacher") if with_teacher else ("student",))
        with capture_step(*self.captures.values()):
            teacher_out = self.run("teacher", batch) if with_teacher else None
            student_out = self.run("student", batch)
            objective, sums = self.logit_objective(student_out, teacher_out, batch)
            if self.layer_pairs:
                features = self.feature_sum(self.scored_mask(batch))
                objective = objective + features
                sums.features = features.detach()
        return objective, sums

    def objective(self, sums: LossSums) -> Tensor:
        """The weighted token *sum* of the logit terms."""
        return self.distill.kd_weight * sums.kd + self.distill.ce_weight * sums.ce

    # ------------------------------------------------------------------------- training

    def on_fit_start(self) -> None:
        # Lightning warns about every module in eval mode at the start of training. The teacher's
        # modules are meant to be; a warning naming exactly that many would only be noise, while
        # any other count (a student module left in eval) still warns.
        count = sum(1 for _ in self.teacher.modules())
        silence_eval_mode_warning(self.trainer, count)
        self.window.reset()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        objective, sums = self.step_objective(batch)
        self.window.add(sums)
        # Lightning divides this by accumulate_grad_batches; on_before_optimizer_step turns the
        # accumulated gradient into that of the window's token mean.
        return objective

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        totals = self.window.reduced(self.trainer.strategy)
        self.window.rescale_gradients(
            self.trainable_parameters(),
            totals["tokens"],
            self.trainer.accumulate_grad_batches,
            self.trainer.world_size,
        )
        self.window.reset()
        tokens = totals["tokens"].clamp(min=1)
        means = {name: (totals[name] / tokens).float() for name in ("kd", "ce", "features")}
        loss = self.distill.kd_weight * means["kd"] + self.distill.ce_weight * means["ce"]
        parts = {"loss": loss + means["features"], **means}
        if not self.layer_pairs:
            del parts["features"]
        # Before the optimizer applies it: the weights stay those of the last finite step.
        check_finite_loss(self.trainer.global_step + 1, parts)
        self.log("train/loss", parts.pop("loss"), prog_bar=True, on_step=True, on_epoch=False)
        logged = {f"train/{name}": value for name, value in parts.items()}
        self.log_dict(logged, on_step=True, on_epoch=False)
        self.tokens_seen += int(totals["tokens"])

    # ------------------------------------------------------------------------- validation

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        if self.is_causal_lm and self.distill.chunked:
            self.check_output_heads(batch, ("student", "teacher"))
        with capture_step(*self.captures.values()):
            teacher_out = self.run("teacher", batch)
            student_out = self.run("student", batch)
            mask = self.scored_mask(batch)
            if self.layer_pairs:
                self.val_metrics.update("features", self.feature_sum(mask), mask.sum())
        if self.is_causal_lm:
            self.update_logit_metrics(student_out, teacher_out, batch["labels"])
        else:
            cosine = torch.nn.functional.cosine_similarity(
                mean_pool(student_out, batch["attention_mask"]),
                mean_pool(teacher_out, batch["attention_mask"]),
                dim=-1,
            )
            scored = mask.any(dim=-1)  # passages, not the unscored padding rows
            self.val_metrics.update("embedding_cosine", cosine[scored].sum(), scored.sum())

    def update_logit_metrics(
        self, student_out: Tensor, teacher_out: Tensor, labels: Tensor
    ) -> None:
        """Perplexities, agreement and KL of one validation batch (chunked or full logits)."""
        if self.distill.chunked:
            chunks = logit_chunks(
                student_out,
                self.output_head(self.student),
                teacher_out,
                self.output_head(self.teacher),
                labels,
                self.distill.chunk_size,
            )
        else:
            student_logits, targets = shift_for_next_token(student_out, labels)
            teacher_logits, _ = shift_for_next_token(teacher_out, labels)
            mask = targets != IGNORE_INDEX
            chunks = [(student_logits[mask], teacher_logits[mask], targets[mask])]
        sums = evaluation_sums(chunks, self.divergence, self.distill.temperature)
        objective = self.objective(LossSums(sums.kd, sums.student_nll, sums.tokens))
        self.val_metrics.update("ppl", sums.student_nll, sums.tokens)
        self.val_metrics.update("kl", sums.forward_kl, sums.tokens)
        self.val_metrics.update("agreement", sums.agreement, sums.tokens)
        self.val_metrics.update("loss", objective, sums.tokens)
        if self.teacher_perplexity is None:  # the teacher does not change: measure it once
            self.val_metrics.update("teacher_ppl", sums.teacher_nll, sums.tokens)

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
        present = set(checkpoint["state_dict"])
        missing = [
            key
            for key in self.state_dict()
            if not key.startswith(TEACHER_PREFIX) and key not in present
        ]
        if missing:
            raise KeyError(
                f"checkpoint lacks {len(missing)} student weights (e.g. {missing[:3]}); it was "
                "saved from a different student configuration"
            )
        self.tokens_seen = checkpoint.get("tokens_seen", 0)

    @rank_zero_only
    def export_student(self, directory: str) -> None:
        """Save the student (without projectors or training state) with the teacher's tokenizer."""
        self.student.save_pretrained(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)
