"""The distillation step as a plain ``torch.nn.Module``: usable from any training loop.

A :class:`Distiller` holds

- the **teacher**, frozen: ``requires_grad=False``, run under ``torch.no_grad()``, kept in eval
  mode through any ``.train()``;
- the **student**, trainable, and the **projectors** of feature pairs whose widths differ; a LoRA
  student (a ``PeftModel``) is held unwrapped, with the ``PeftModel`` kept for the export only
  (``lora.py``), so paths, forwards and heads are those of the plain model;
- the **captures**: forward hooks on the mapped modules, armed only inside :meth:`forward` and
  :meth:`evaluate` and read-and-cleared before they return (a re-forward by activation
  checkpointing finds them disarmed; an unread capture is an error, see ``capture.py``).

``distiller(batch)`` returns the step's objective as a *token sum* and its parts
(:class:`~lightning_kd.losses.logits.LossSums`): divide by the tokens of the whole accumulation
window (``accumulation.Window``) for the exact token mean. ``distiller.evaluate(batch)`` returns
the validation metrics as ``(sum, count)`` pairs. Nothing here imports Lightning.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.capture import ModuleCapture, capture_step
from lightning_kd.features import LayerPair, layer_pairs, make_projectors
from lightning_kd.lora import ADAPTER_DIR, Adapter, is_peft_model
from lightning_kd.losses.chunked import OutputHead, matmul_dtype
from lightning_kd.losses.features import get_feature_loss, masked_feature_sum
from lightning_kd.losses.logits import LossSums
from lightning_kd.models import StudentSpec, TeacherSpec, load_teacher, logit_transform
from lightning_kd.objective import DistillConfig
from lightning_kd.quantize import quantize_teacher
from lightning_kd.student import build_student, check_vocabularies, student_tokenizer
from lightning_kd.tasks import Heads, MetricSums, make_task

ROLES = ("teacher", "student")


def gathered(heads: Heads | None) -> AbstractContextManager:
    """The output heads' weights whole for the block, where DeepSpeed ZeRO-3 has partitioned them.

    ZeRO-3 gathers a parameter only inside its own module's forward; the chunked loss applies the
    heads outside any forward (from hidden states), so it gathers them itself, read-only. The
    head-weight gradient is computed inside the block and returned in backward, when the weight
    may be partitioned again. Nothing to do (and no DeepSpeed import) anywhere else.
    """
    params = [] if heads is None else [p for head in heads for p in (head.weight, head.bias)]
    partitioned = [p for p in params if p is not None and hasattr(p, "ds_id")]
    if not partitioned:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


class Distiller(nn.Module):
    """Distils ``teacher`` into ``student`` with the objective ``distill`` describes."""

    def __init__(
        self,
        teacher: PreTrainedModel,
        student: PreTrainedModel,
        distill: DistillConfig,
        *,
        task: str = "causal_lm",
        layer_map: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.teacher = teacher.requires_grad_(False).eval()
        self.adapter = Adapter(student) if is_peft_model(student) else None
        """A LoRA student's ``PeftModel``, outside the module tree (None for a plain student)."""
        if self.adapter is not None:  # the same model, adapters inside: plain paths and heads
            student = student.get_base_model()
        self.student = student
        self.distill = distill
        self.objective = distill.logit_objective()
        self.task = make_task(
            task, self.objective, distill.chunked, distill.chunk_size, distill.compile
        )
        self.layer_map = layer_map
        """``layer_map[j]``: the teacher layer student layer j was copied from (or None)."""
        self.layer_pairs: list[LayerPair] = layer_pairs(
            distill.features,
            student,
            teacher,
            layer_map,
            distill.feature_loss,
            distill.feature_weight,
        )
        self.projectors = nn.ModuleList()
        self.captures: dict[str, ModuleCapture] = {}
        if self.layer_pairs:
            # Hooks go on once, here; forward/evaluate decide when they record (capture.py).
            self.projectors = make_projectors(self.layer_pairs, student, teacher, distill.projector)
            for role in ROLES:
                paths = [getattr(pair, role) for pair in self.layer_pairs]
                self.captures[role] = ModuleCapture(getattr(self, role), paths, role)
        self._heads_checked: set[str] = set()

    @classmethod
    def from_specs(
        cls,
        teacher: TeacherSpec,
        student: StudentSpec,
        distill: DistillConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        precision: str | None = None,
    ) -> Distiller:
        """Load the teacher, build the student from it, quantize the teacher if
        ``teacher.quantize`` says so, check their vocabularies against ``tokenizer``;
        ``precision`` (a Lightning precision) resolves ``teacher.dtype=auto``."""
        teacher_model = load_teacher(teacher, precision)
        models = build_student(student, teacher_model, teacher.task)
        if teacher.quantize is not None:  # after the student copied full-precision layers
            quantize_teacher(teacher_model, teacher.quantize)
        if teacher.task == "causal_lm" and tokenizer is not None:
            check_vocabularies(teacher_model, models.student, tokenizer, student_tokenizer(student))
        return cls(
            teacher_model, models.student, distill, task=teacher.task, layer_map=models.layer_map
        )

    def train(self, mode: bool = True) -> Distiller:
        """Set train/eval mode on everything but the teacher, which always stays in eval."""
        super().train(mode)
        self.teacher.eval()
        return self

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter that learns: the student's (and projectors'), never the teacher's."""
        return (p for p in self.parameters() if p.requires_grad)

    @property
    def uses_teacher_in_training(self) -> bool:
        """Whether a training step needs the teacher at all (a CE-only run skips it)."""
        return self.distill.kd_weight > 0 or bool(self.layer_pairs)

    # ------------------------------------------------------------------------- forwards

    def run(self, role: str, batch: dict[str, Tensor]) -> Tensor:
        """One forward of ``role`` with its capture armed: final hidden states (after the last
        norm), or full logits where the task wants them.

        The teacher runs without a graph. Only this forward records captures: a forward
        elsewhere, or activation checkpointing's re-forward in backward, finds them disarmed.
        """
        model = getattr(self, role)
        capture = self.captures.get(role)
        if capture is not None:
            capture.ensure_attached()
        armed = capture.arm() if capture else nullcontext()
        with armed, torch.no_grad() if role == "teacher" else nullcontext():
            return self.forward_model(model, batch, logits=self.task.wants_logits)

    @staticmethod
    def forward_model(model: nn.Module, batch: dict[str, Tensor], logits: bool) -> Tensor:
        """``model``'s full logits, or its body's final hidden states (no head, no logits)."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if logits:
            return model(**inputs, use_cache=False).logits
        return model.base_model(**inputs, use_cache=False).last_hidden_state

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, LossSums]:
        """The objective's token sum for one micro-batch (differentiable) and its parts."""
        with_teacher = self.uses_teacher_in_training
        heads = self.heads(batch, ROLES if with_teacher else ("student",))
        with capture_step(*self.captures.values()):
            teacher_out = self.run("teacher", batch) if with_teacher else None
            student_out = self.run("student", batch)
            with gathered(heads):
                objective, sums = self.task.logit_terms(student_out, teacher_out, batch, heads)
            if self.layer_pairs:
                features = self.feature_sum(self.task.scored_mask(batch))
                objective = objective + features
                sums.features = features.detach()
        return objective, sums

    @torch.no_grad()
    def evaluate(self, batch: dict[str, Tensor]) -> MetricSums:
        """Validation metrics of one batch as ``name → (sum, count)`` (see ``tasks``)."""
        heads = self.heads(batch, ROLES)
        with capture_step(*self.captures.values()):
            teacher_out = self.run("teacher", batch)
            student_out = self.run("student", batch)
            metrics = {}
            if self.layer_pairs:
                mask = self.task.scored_mask(batch)
                metrics["features"] = (self.feature_sum(mask), mask.sum())
        with gathered(heads):
            return metrics | self.task.metric_sums(student_out, teacher_out, batch, heads)

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

    # ------------------------------------------------------------------------- output heads

    def output_head(self, role: str) -> OutputHead:
        """``role``'s output projection, as the chunked loss applies it."""
        model = getattr(self, role)
        head = model.get_output_embeddings()
        return OutputHead(head.weight, head.bias, logit_transform(model.config))

    def heads(self, batch: dict[str, Tensor], roles: tuple[str, ...]) -> Heads | None:
        """The (student, teacher) heads when the task applies them itself, checked once."""
        if not self.task.uses_heads:
            return None
        self.check_output_heads(batch, roles)
        return self.output_head("student"), self.output_head("teacher")

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
                    expected = self.forward_model(model, sample, logits=True).float()
                    hidden = self.forward_model(model, sample, logits=False)
                    got = self.output_head(role).logits(hidden, matmul_dtype(hidden)).float()
            finally:
                model.train(was_training)
            if not torch.allclose(got, expected, rtol=2e-2, atol=2e-2):
                raise ValueError(
                    f"the {role} ({type(model).__name__}) computes its logits in a way the chunked "
                    "loss does not reproduce (max difference "
                    f"{(got - expected).abs().max():.3g}); set distill.chunked=false"
                )
            self._heads_checked.add(role)

    def unsharded_parameters(self) -> list[nn.Parameter]:
        """What a sharding strategy must leave whole: the teacher's output head (its embedding,
        when tied), which the chunked loss reads outside any of the teacher's forwards — and which,
        tied, the full-logit forward applies after the body's unit has resharded it."""
        head = self.teacher.get_output_embeddings() if self.task.name == "causal_lm" else None
        return [] if head is None else list(head.parameters())

    def export(self, directory: str | Path, tokenizer: PreTrainedTokenizerBase | None) -> None:
        """Save the student (no projectors, no training state) with the teacher's tokenizer.

        A LoRA student is saved with its adapters merged into the weights (a plain model for
        ``from_pretrained``), and its adapter alone in ``directory/adapter``.
        """
        if self.adapter is None:
            self.student.save_pretrained(directory)
        else:
            self.adapter.merged().save_pretrained(directory)
            self.adapter.save(Path(directory) / ADAPTER_DIR)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
