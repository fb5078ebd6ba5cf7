"""The distillation step as a plain ``torch.nn.Module``: usable from any training loop.

A :class:`Distiller` holds

- the **teacher**, frozen: ``requires_grad=False``, run under ``torch.no_grad()``, kept in eval
  mode through any ``.train()`` — or, with ``distill.teacher_cache``, its cached top-k records
  instead (``cache/teacher.py``); with another tokenizer than the student's, its re-tokenisation
  (``cross_tokenizer.py``); with several teachers, the others (``teachers.py``), maybe each on its
  own data domain (``teacher_domains.py``);
- the **student**, trainable, and the **projectors** of feature pairs whose widths differ; a LoRA
  student (a ``PeftModel``) is held unwrapped, with the ``PeftModel`` kept for the export only
  (``lora.py``), so paths, forwards and heads are those of the plain model;
- the **captures**: forward hooks on the mapped modules, armed only inside :meth:`forward` and
  :meth:`evaluate` and read-and-cleared before they return (a re-forward by activation
  checkpointing finds them disarmed; an unread capture is an error, see ``capture.py``).

``distiller(batch)`` returns the step's objective as a *token sum* and its parts (``LossSums``):
divide by the tokens of the whole accumulation window (``accumulation.Window``) for the exact
token mean. ``distiller.evaluate(batch)`` returns the validation metrics as ``(sum, count)``
pairs, each over its own rows. Nothing here imports Lightning.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.distill.assembly import assemble, check_teacher_source, id_rows, learning
from lightning_kd.distill.batches import checked_batch
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.domain_terms import domain_terms
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.on_policy import on_policy_for
from lightning_kd.distill.tasks import Heads, MetricSums, bits_per_byte, make_task
from lightning_kd.distill.teacher_domains import DomainTeaching, extra_rows
from lightning_kd.distill.teachers import ExtraTeachers
from lightning_kd.losses.chunked import OutputHead
from lightning_kd.losses.features import get_feature_loss, masked_feature_sum
from lightning_kd.losses.logits import LossSums, weighted_sum
from lightning_kd.losses.topk import TopKTeacher
from lightning_kd.models.capture import ModuleCapture, capture_step
from lightning_kd.models.heads import check_head, final_hidden, gathered, output_head
from lightning_kd.models.layer_pairs import configured_pairs, make_projectors, repair_pairs
from lightning_kd.models.lora import Adapter, is_peft_model, save_student

ROLES = ("teacher", "student")


class Distiller(nn.Module):
    """Distils ``teacher`` into ``student`` with the objective ``distill`` describes."""

    def __init__(
        self,
        teacher: PreTrainedModel | None,
        student: PreTrainedModel,
        distill: DistillConfig,
        *,
        task: str = "causal_lm",
        layer_map: list[int] | None = None,
        cache: CachedTeacher | None = None,
        cross: CrossTokenizer | None = None,
        token_lengths: Tensor | None = None,
        extra: ExtraTeachers | None = None,
        teacher_weight: tuple[str, float] = ("teacher", 1.0),
        repair_source: PreTrainedModel | None = None,
    ) -> None:
        super().__init__()
        check_teacher_source(teacher, cache, distill, student, cross)
        self.other_sides(cross, extra, teacher_weight, token_lengths)
        self.teacher = None if teacher is None else teacher.requires_grad_(False).eval()
        self.cached_teacher = cache
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
        self.on_policy = on_policy_for(distill, student, task, extra)
        self.draws = 0  # micro-batches numbered here when the caller does not number them
        self.layer_map = layer_map  # [j]: the teacher layer student layer j copies (or None)
        self.teacher_rows = id_rows(teacher, cross)  # it reads the batch's ids too, if not None
        self.repair_source = None if repair_source is None else repair_source.requires_grad_(False)
        """``student.source``'s model, whose layers the student copied: what the repair reads."""
        own = layer_map if repair_source is None else None  # a source's map is not the teacher's
        self.layer_pairs = configured_pairs(distill, student, teacher, own)
        self.repair_pairs = repair_pairs(distill, student, self.repair_teacher, layer_map)
        """Student layer ↔ end of its teacher span, for ``distill.blockwise_passes``."""
        self.projectors = nn.ModuleList()
        self.captures: dict[str, ModuleCapture] = {}
        if self.layer_pairs:
            # Hooks go on once, here; forward/evaluate decide when they record (capture.py).
            self.projectors = make_projectors(self.layer_pairs, student, teacher, distill.projector)
            for role in ROLES:
                paths = [getattr(pair, role) for pair in self.layer_pairs]
                self.captures[role] = ModuleCapture(getattr(self, role), paths, role)
        self._heads_checked: set[str] = set()

    def other_sides(self, cross, extra, teacher_weight, lengths) -> None:
        """Besides the teacher: another tokenizer's path, the other teachers and this one's
        name and weight, each student id's bytes (for bits per byte)."""
        self.cross: CrossTokenizer | None = cross
        self.extra_teachers: ExtraTeachers | None = extra
        self.teacher_name, self.teacher_weight = teacher_weight
        self.domains = DomainTeaching()  # teachers by data domain: who teaches which rows
        self.token_lengths = cross.student_lengths if cross and lengths is None else lengths

    from_specs = classmethod(assemble)  # specs → models loaded, its sides chosen (assembly.py)

    def replace_teacher(self, cache: CachedTeacher) -> None:
        """Drop the teacher (and its hooks) for ``cache``, which holds its outputs: from here on
        no step runs or holds it. The feature pairs and projectors built on it stay."""
        if "teacher" in self.captures:
            self.captures.pop("teacher").remove()
        self.teacher = None
        self.cached_teacher = cache

    @property
    def repair_teacher(self) -> nn.Module | None:
        """The model the block-wise repair reads: ``student.source``'s, else the teacher."""
        return self.repair_source if self.repair_source is not None else self.teacher

    def release_repair_source(self) -> None:
        """Drop ``student.source``'s model once the repair is done (or skipped by a resume)."""
        self.repair_source = None

    def train(self, mode: bool = True) -> Distiller:
        """Set train/eval mode on everything but the teachers, which always stay in eval."""
        super().train(mode)
        for model in (self.teacher, self.repair_source):
            if model is not None:
                model.eval()
        return self

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter that learns: the student's (and projectors'), never a teacher's."""
        return learning(self.parameters(), self.teacher, self.repair_source, self.extra_teachers)

    @property
    def uses_teacher_in_training(self) -> bool:
        """Whether a training step needs the teacher at all (a CE-only run skips it)."""
        return self.distill.uses_teacher_in_training

    def run(self, role: str, batch: dict[str, Tensor]) -> Tensor:
        """One forward of ``role`` with its capture armed: final hidden states (after the last
        norm), or full logits where the task wants them. The teacher runs without a graph. Only
        this forward records captures: a forward elsewhere, or activation checkpointing's
        re-forward in backward, finds them disarmed."""
        if (capture := self.captures.get(role)) is not None:
            capture.ensure_attached()
        armed = capture.arm() if capture else nullcontext()
        with armed, torch.no_grad() if role == "teacher" else nullcontext():
            return final_hidden(getattr(self, role), batch, logits=self.task.wants_logits)

    def teacher_output(
        self, batch: dict[str, Tensor], split: str
    ) -> tuple[Tensor | TopKTeacher, dict[str, Tensor] | None]:
        """What the loss compares the student with: the teacher's forward (its features then
        come from the capture), or the cached records and features of the batch's blocks."""
        if self.cached_teacher is not None:
            return self.cached_teacher.records(batch, split)
        if self.cross is not None:
            head, temperature = self.output_head("teacher"), self.objective.temperature
            keep = split == "val"  # validation reads the teacher's own bits per byte too
            return self.cross.records(self.teacher, head, batch, temperature, keep), None
        return self.run("teacher", batch), None

    def forward(
        self, batch: dict[str, Tensor], draw: int | None = None, step: int | None = None
    ) -> tuple[Tensor, LossSums]:
        """The objective's token sum for one micro-batch (differentiable) and its parts; with
        ``distill.on_policy``, maybe of the student's completions (``draw`` numbers the batch,
        ``step`` is the optimizer step ``distill.on_policy_warmup`` counts; both default to this
        distiller's count of micro-batches), scored without the CE term (``on_policy.py``)."""
        given = batch = checked_batch(batch, self.task.name, self.student, self.teacher_rows)
        if self.on_policy is not None:
            count, self.draws = self.draws, self.draws + 1
            draw, step = (count if draw is None else draw), (count if step is None else step)
            batch = self.on_policy.replace(self.student, batch, draw, step, self.teacher)
        with_teacher = self.uses_teacher_in_training
        heads = self.heads(batch, ROLES if with_teacher else ("student",))
        with capture_step(*self.captures.values()):
            none = (None, None)  # a CE-only step runs no teacher
            teacher_out, cached = self.teacher_output(batch, "train") if with_teacher else none
            student_out = self.run("student", batch)
            with gathered(heads):
                if self.domains.named and with_teacher:
                    objective, sums = self.domain_terms(student_out, teacher_out, batch, heads)
                else:
                    objective, sums = self.task.logit_terms(
                        student_out, teacher_out, batch, heads, batch is given, self.teacher_weight
                    )
                if self.extra_teachers is not None and with_teacher and not sums.teachers:
                    objective = objective + self.extra_terms(sums, student_out, batch, heads)
            if self.layer_pairs:
                mask = self.domains.main_rows(batch, self.task.scored_mask(batch))
                features = self.feature_sum(mask, cached)
                objective = objective + features
                sums.features = features.detach()
        return objective, sums

    def domain_terms(self, student_out, teacher_out, batch, heads: Heads) -> tuple:
        """The step's terms domain by domain, each teacher on the rows it teaches."""
        sides = [(self.teacher_name, teacher_out, heads, None)]
        if self.extra_teachers is not None:
            rows = extra_rows(self.domains, batch, len(self.extra_teachers.names))
            sides += self.extra_teachers.sides(self.task, batch, heads[0], rows=rows)
        return domain_terms(self.task, self.domains, student_out, sides, batch, True)

    def extra_terms(self, sums: LossSums, student_out, batch, heads: Heads) -> Tensor:
        """The other teachers' weighted terms; ``sums.kd`` (``.span``) becomes the weighted sum
        of every teacher's divergence (span term), ``sums.teachers`` holds each one's own."""
        extra = self.extra_teachers
        objective, kd, span = extra.terms(self.task, student_out, batch, heads[0])
        sums.teachers = {self.teacher_name: sums.kd, **kd}
        weighted = [w * kd[name] for name, w in zip(extra.names, extra.weights, strict=True) if w]
        sums.kd = self.teacher_weight * sums.kd + sum(weighted)
        sums.span = weighted_sum([(self.teacher_weight, sums.span), (1.0, span)])
        return objective

    @torch.no_grad()
    def evaluate(self, batch: dict[str, Tensor]) -> MetricSums:
        """Validation metrics of one batch as ``name → (sum, count)`` (see ``tasks``)."""
        batch = checked_batch(batch, self.task.name, self.student, self.teacher_rows)
        heads = self.heads(batch, ROLES)
        with capture_step(*self.captures.values()):
            metrics, (teacher_out, cached) = {}, self.teacher_output(batch, "val")
            if self.cross is not None:  # its own numbers on its own tokens
                metrics = self.cross.teacher_sums(self.domains.main_taught(batch))
            student_out = self.run("student", batch)
            if self.layer_pairs:  # over the rows the main teacher teaches, as in training
                mask = self.domains.main_rows(batch, self.task.scored_mask(batch))
                metrics["features"] = (self.feature_sum(mask, cached), mask.sum())
        with gathered(heads):
            metrics |= self.task.metric_sums(student_out, teacher_out, batch, heads)
            own = (student_out, teacher_out, batch, heads, self.token_lengths)
            metrics |= self.domains.own_figures(self.task, *own)
            if (extra := self.extra_teachers) is not None:  # kl/<name>, agreement/<name>, loss
                own = (self.teacher_name, metrics, self.teacher_weight)
                metrics |= extra.evaluation_sums(
                    self.task, student_out, batch, heads, own, self.domains, self.token_lengths
                )
        return bits_per_byte(batch.get("labels"), self.token_lengths, metrics) | metrics  # own rows

    def feature_sum(self, mask: Tensor, cached: dict[str, Tensor] | None = None) -> Tensor:
        """Σ over pairs of weight · Σ over scored positions of the pair's loss; reads and clears
        both captures (the student's only, given the teacher's ``cached`` outputs)."""
        student = self.captures["student"].pop()
        teacher = cached if cached is not None else self.captures["teacher"].pop()
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

    def output_head(self, role: str) -> OutputHead:
        """``role``'s output projection, as the chunked loss applies it."""
        return output_head(getattr(self, role))

    def heads(self, batch: dict[str, Tensor], roles: tuple[str, ...]) -> Heads | None:
        """The (student, teacher) heads when the task applies them itself, each checked once
        against its model's own logits (no teacher head for a cached teacher)."""
        if not self.task.uses_heads:
            return None
        for role in roles:
            if role == "teacher" and self.cross is not None:
                continue  # its ids are not the batch's: the cross path checks it on its own
            if getattr(self, role) is not None and role not in self._heads_checked:
                check_head(getattr(self, role), batch, role, "set distill.chunked=false")
                self._heads_checked.add(role)
        own_head = self.teacher is not None and self.cross is None
        teacher = self.output_head("teacher") if own_head else None
        return self.output_head("student"), teacher

    def unsharded_parameters(self) -> list[nn.Parameter]:
        """What a sharding strategy must leave whole: each teacher's output head (its tied
        embedding), which the chunked loss reads outside the teachers' forwards."""
        if self.task.name != "causal_lm":
            return []
        extra = () if self.extra_teachers is None else self.extra_teachers.models.values()
        heads = [t.get_output_embeddings() for t in (self.teacher, *extra) if t is not None]
        return [parameter for head in heads if head is not None for parameter in head.parameters()]

    def export(self, directory: str | Path, tokenizer: PreTrainedTokenizerBase | None) -> None:
        """Save the student with the run's tokenizer (``lora.save_student``: LoRA merged)."""
        save_student(self.student, self.adapter, directory, tokenizer)
