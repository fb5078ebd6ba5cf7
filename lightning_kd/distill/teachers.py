"""Several teachers: the ``teachers`` list, each with its weight, same- or cross-tokenizer.

The distiller's own teacher (the ``teacher`` group's model, online or from its cache) is one
entry of the list; the others are held here, frozen, each with its own tokenizer path where its
tokenizer is not the student's. A step adds, for each of them, its weighted divergence term over
the same student positions, without CE (which the first term carries once):

    loss = kd_weight · Σ_t w_t · KD_t + ce_weight · CE    (Σ_t w_t = 1)

so the exact token-sum accumulation sees one objective; each teacher's own divergence is reported
beside it (``train/kd/<name>``). Each extra term runs the student's head again, a chunk at a time.
The list itself is read by ``teacher_entries.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.tasks import bits_per_byte
from lightning_kd.distill.teacher_domains import PER_TEACHER, DomainTeaching, rows_of
from lightning_kd.distill.teacher_entries import TeacherEntry, entry_errors
from lightning_kd.distill.teacher_sources import teacher_source
from lightning_kd.generation.decoding import decodes_in_step
from lightning_kd.losses.logits import weighted_sum
from lightning_kd.models.digests import config_digest, weights_digest
from lightning_kd.models.heads import final_hidden, output_head


class ExtraTeachers(nn.Module):
    """The teachers besides the distiller's own, each frozen online or read from its cache, with
    their weights and tokenizer paths."""

    def __init__(
        self,
        names: list[str],
        weights: list[float],
        sources: list[nn.Module | CachedTeacher],
        crosses: list[CrossTokenizer | None],
    ) -> None:
        super().__init__()
        self.names, self.weights, self.crosses = names, weights, crosses
        # Keyed by position: a module's name may not hold a dot, a teacher's may (qwen2.5).
        self.models = nn.ModuleDict(
            {
                str(index): model.requires_grad_(False).eval()
                for index, model in enumerate(sources)
                if is_model(model)
            }
        )
        self.caches = {
            name: source
            for name, source in zip(names, sources, strict=True)
            if not is_model(source)
        }
        """Name → the cache of each teacher that is not run: its model was released once its
        cache was opened, before the next teacher loaded."""
        self.eval()  # itself and its ModuleDict too: Lightning restores each module's own mode

    @classmethod
    def load(
        cls,
        entries: list[TeacherEntry],
        distill: DistillConfig,
        tokenizer: PreTrainedTokenizerBase | None,
        student: nn.Module,
        precision: str | None = None,
        data: Any = None,
    ) -> ExtraTeachers:
        """The non-main ``entries``' models, each loaded as a teacher is, one at a time: a cached
        one (given the run's set-up ``data`` to match its cache to) released as soon as its cache
        is open, so that cached teachers are never resident at once."""
        sources, crosses, others = [], [], [entry for entry in entries if not entry.main]
        for entry in others:
            with entry_errors(entry):
                source, cross = teacher_source(entry, distill, tokenizer, student, precision, data)
            sources.append(source)
            crosses.append(cross)
        names, weights = [e.name for e in others], [e.weight for e in others]
        return cls(names, weights, sources, crosses)

    def digests(self) -> dict[str, dict[str, str]]:
        """Name → the digests of each teacher's weights and config, as it runs (a cached one's as
        its cache records them), for the checkpoints' record (``training/provenance.py``)."""
        found = {}
        for index, name in enumerate(self.names):
            if name in self.caches:
                key = self.caches[name].key
                found[name] = {"weights": key.teacher_weights, "config": key.teacher_config}
            else:
                model = self.model(index)
                found[name] = {
                    "weights": weights_digest(model),
                    "config": config_digest(model.config),
                }
        return found

    def model(self, index: int) -> nn.Module | None:
        """Teacher ``index``'s model, or None where its cache stands in for it."""
        key = str(index)
        return self.models[key] if key in self.models else None  # noqa: SIM401 (no .get)

    def train(self, mode: bool = True) -> ExtraTeachers:
        """Teachers stay in eval mode whatever the distiller's mode."""
        return super().train(False)

    @torch.no_grad()
    def output(self, index: int, batch: dict[str, Tensor], temperature: float, split="train"):
        """Teacher ``index``'s hidden states on ``batch`` (its records, across tokenizers or
        from its cache: ``batch`` holds blocks of ``split``)."""
        name, cross = self.names[index], self.crosses[index]
        if name in self.caches:
            return self.caches[name].records(batch, split)[0]
        model = self.model(index)
        if cross is not None:  # validation keeps its bits per byte (teacher_bits)
            return cross.records(model, output_head(model), batch, temperature, split == "val")
        return final_hidden(model, batch, logits=False)

    def sides(self, task, batch: dict[str, Tensor], student_head, rows=None) -> list[tuple]:
        """``(name, output, heads, rows)`` of each teacher on a training ``batch``: what its term
        compares the student with, the (student, teacher) heads (no teacher head for records)
        and the rows it ran on: ``rows[i]`` (None: every row; no rows: the teacher is not run)."""
        found, temperature = [], task.objective.temperature
        for index, name in enumerate(self.names):
            ran_on = None if rows is None else rows[index]
            teacher_out = None
            if ran_on is None or len(ran_on):
                own = batch if ran_on is None else rows_of(batch, ran_on)
                teacher_out = self.output(index, own, temperature)
            elif decodes_in_step(self.model(index)):  # sharded: each forward is a collective,
                # which a rank with none of its rows skipped while another ran it (probe 39)
                self.output(index, rows_of(batch, ran_on.new_zeros(1)), temperature)  # unused
            found.append((name, teacher_out, self.head_pair(index, student_head), ran_on))
        return found

    def head_pair(self, index: int, student_head) -> tuple:
        """The (student, teacher) heads of teacher ``index``'s term (no teacher head for
        records: its cache's, or its top k across tokenizers)."""
        runs_head = self.model(index) is not None and self.crosses[index] is None
        return student_head, output_head(self.model(index)) if runs_head else None

    def terms(self, task, student_out: Tensor, batch: dict[str, Tensor], student_head) -> tuple:
        """Σ of each extra teacher's weighted divergence term (differentiable, no CE), each
        one's own divergence sum, by name, and the weighted sum of their span terms (None: no
        span term). A teacher of weight 0 is not run: it adds nothing to the loss, and is there
        for its validation figures (``kl/<name>``)."""
        total, kd, spans = student_out.new_zeros(()), {}, []  # spans: (weight, span term)
        nothing = torch.zeros(0, dtype=torch.long)  # rows to run on: none
        rows = [nothing if weight == 0 else None for weight in self.weights]
        sides = self.sides(task, batch, student_head, rows=rows)
        for (name, teacher_out, heads, _), weight in zip(sides, self.weights, strict=True):
            if weight == 0:
                continue
            value, sums = task.logit_terms(
                student_out, teacher_out, batch, heads, ce=False, kd_scale=weight
            )
            total, kd[name] = total + value, sums.kd
            spans.append((weight, sums.span))
        return total, kd, weighted_sum(spans)

    @torch.no_grad()
    def evaluation_sums(
        self,
        task,
        student_out: Tensor,
        batch,
        heads,
        main: tuple[str, dict, float | None],
        domains: DomainTeaching,
        lengths: Tensor | None = None,
    ) -> dict:
        """Validation: each teacher's own KL from the student (T = 1, ``kl/<name>``), top-1
        agreement with it (``agreement/<name>``) and, given the bytes of each student id
        (``lengths``; its own tokens' across tokenizers), its bits per byte
        (``teacher_bpb/<name>``), as sums and counts over the rows it teaches (``domains``), and
        the objective's logit terms over all teachers (``loss``); ``heads`` are the
        distiller's, ``main`` its own name, the metrics it measured against it (not measured
        again; their ``loss``, its own terms alone, is taken out of them) and its weight (no
        ``loss`` with teachers by domain, whose weights differ by row)."""
        name, measured, main_weight = main
        main_weight = None if domains.named else main_weight
        found = per_teacher(name, measured)
        loss, tokens = measured.pop("loss")  # the main teacher's terms alone
        loss = loss * (main_weight or 0.0)
        for index, name in enumerate(self.names):
            taught = domains.taught_batch(batch, index + 1)
            teacher_out = self.output(index, taught, task.objective.temperature, "val")
            theirs = self.head_pair(index, heads[0])
            metrics = task.metric_sums(student_out, teacher_out, taught, theirs)
            found |= per_teacher(name, metrics) | self.teacher_bits(index, taught, metrics, lengths)
            loss = loss + self.weights[index] * metrics["loss"][0]  # CE's weight stays: Σ w = 1
        return found | ({} if main_weight is None else {"loss": (loss, tokens)})

    def teacher_bits(self, index: int, batch: dict, metrics: dict, lengths) -> dict:
        """Teacher ``index``'s bits per byte of ``batch``'s scored text, as ``teacher_bpb/<name>``:
        over its own tokens across tokenizers, else from its perplexity's sums."""
        cross = self.crosses[index]
        if cross is not None:
            sums = cross.teacher_sums() if cross.kept is not None else {}
        else:
            sums = bits_per_byte(batch["labels"], lengths, metrics)
        bits = sums.get("teacher_bpb")
        return {} if bits is None else {f"teacher_bpb/{self.names[index]}": bits}


def per_teacher(name: str, metrics: dict) -> dict:
    """``metrics``' KL, agreement (and share aligned) under ``<metric>/<name>``."""
    return {f"{key}/{name}": metrics[key] for key in PER_TEACHER if key in metrics}


def is_model(source: nn.Module | CachedTeacher) -> bool:
    return isinstance(source, nn.Module)
