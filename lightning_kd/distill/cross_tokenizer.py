"""The teacher's side of a step when its tokenizer is not the student's.

Each micro-batch of student ids is re-tokenised for the teacher (``data/alignment.py``), the teacher
runs on its own ids, and its top-k records are taken at the teacher positions aligned with the
student's scored positions (``losses/cross_vocab.py``), a chunk of positions at a time through
its output head: the chunked loss then reads them as it reads a cache's records, inside the same
exact token-sum accumulation (every student token counts in the denominator; unaligned ones add
CE only). Validation adds tokenizer-free numbers: bits per byte of both models over the same text
and the share of the student's positions that had a teacher partner.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.alignment import Aligner, TeacherView, vocabulary_map
from lightning_kd.losses.chunked import CHUNK_ELEMENTS, OutputHead, matmul_dtype
from lightning_kd.losses.cross_vocab import CrossTeacher, cross_records, twins
from lightning_kd.losses.logits import next_token_targets
from lightning_kd.models.heads import check_head, final_hidden
from lightning_kd.models.loading import TeacherSpec, load_tokenizer
from lightning_kd.models.student import same_tokenizer

MetricSums = dict[str, tuple[Tensor, Tensor]]


class CrossTokenizer:
    """Aligns student batches with the teacher's tokenisation and turns the teacher's outputs
    into records at the student's positions."""

    def __init__(
        self,
        student_tokenizer: PreTrainedTokenizerBase,
        teacher_tokenizer: PreTrainedTokenizerBase,
        student_vocab: int,
        teacher_vocab: int,
        *,
        top_k: int = 64,
        loss: str = "hybrid",
        uld_weight: float = 1.0,
        min_aligned: float = 0.9,
    ) -> None:
        self.aligner = Aligner(student_tokenizer, teacher_tokenizer)
        self.mapping = vocabulary_map(self.aligner.student, self.aligner.teacher, teacher_vocab)
        self.student_twins = twins(self.mapping, student_vocab)
        self.student_lengths = self.aligner.student.lengths(student_vocab)
        self.top_k = min(top_k, teacher_vocab)
        self.loss, self.uld_weight, self.min_aligned = loss, uld_weight, min_aligned
        self.checked = False
        self.head_checked = False
        self.kept: tuple | None = None
        """A validation batch's view and teacher states, until :meth:`teacher_sums` reads them."""

    @classmethod
    def for_models(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        teacher_tokenizer: PreTrainedTokenizerBase,
        student: nn.Module,
        teacher: nn.Module,
        distill,
    ) -> CrossTokenizer:
        """The cross-tokenizer path between ``student`` (reading ``tokenizer``) and ``teacher``
        (reading ``teacher_tokenizer``) with ``distill``'s ``cross_*`` settings."""
        return cls(
            tokenizer,
            teacher_tokenizer,
            student.get_output_embeddings().weight.shape[0],
            teacher.get_output_embeddings().weight.shape[0],
            top_k=distill.cross_top_k,
            loss=distill.cross_loss,
            uld_weight=distill.cross_uld_weight,
            min_aligned=distill.cross_min_aligned,
        )

    def view(self, batch: dict[str, Tensor]) -> TeacherView:
        """The teacher's tokenisation of ``batch``, checked once for how much text it spells
        back (the first batch a run sees: before step 0)."""
        view = self.aligner.view(
            batch["input_ids"].cpu(), batch.get("attention_mask"), batch["labels"].cpu()
        )
        if not self.checked:
            self.check(view)
            self.checked = True
        return view

    def check(self, view: TeacherView) -> None:
        """Refuse a pair of tokenizers whose texts disagree beyond normalisation."""
        if view.share < self.min_aligned:
            raise ValueError(
                f"the teacher's tokenizer spells back {view.share:.1%} of the student's text "
                f"(distill.cross_min_aligned={self.min_aligned}): the two tokenizers normalise "
                "the text differently (case, Unicode forms, whitespace), so too few positions can "
                "be aligned. Use a teacher whose tokenizer keeps the text as it is, or lower "
                "distill.cross_min_aligned if that share is what you expect"
            )

    @torch.no_grad()
    def teacher_hidden(self, teacher: nn.Module, view: TeacherView, device) -> Tensor:
        """The teacher's final hidden states on its own ids ``[batch, teacher_seq, hidden]``;
        its head is checked against its own logits once, on these ids."""
        inputs = {
            "input_ids": view.input_ids.to(device),
            "attention_mask": view.attention_mask.to(device),
        }
        if not self.head_checked:
            check_head(teacher, inputs, "teacher", "set distill.chunked=false")
            self.head_checked = True
        return final_hidden(teacher, inputs, logits=False)

    @torch.no_grad()
    def records(
        self,
        teacher: nn.Module,
        head: OutputHead,
        batch: dict[str, Tensor],
        temperature: float,
        keep: bool = False,
    ) -> CrossTeacher:
        """The teacher's records at the student positions 0 .. seq − 2 of ``batch``; ``keep``
        holds the teacher's states for :meth:`teacher_sums` (validation)."""
        records, view, states = self._records(teacher, head, batch, temperature)
        self.kept = (view, *states) if keep else None
        return records

    def _records(self, teacher, head, batch, temperature):
        view = self.view(batch)
        device = batch["input_ids"].device
        hidden = self.teacher_hidden(teacher, view, device)
        flat = hidden.reshape(-1, hidden.shape[-1])
        dtype = matmul_dtype(hidden)
        cast = head.cast(dtype)
        width = view.input_ids.shape[1]
        partner = view.partner[:, :-1].to(device)
        scored = next_token_targets(batch["labels"])[1]
        wanted = (partner >= 0) & scored
        rows = torch.arange(partner.shape[0], device=device).unsqueeze(1)
        index = (rows * width + partner)[wanted]
        chunk = max(1, CHUNK_ELEMENTS // max(1, head.weight.shape[0]))
        found = cross_records(
            lambda where: cast.logits(flat[where], dtype),
            index,
            torch.ones(index.numel(), dtype=torch.bool, device=device),
            self.mapping.to(device),
            self.student_twins.to(device),
            k=self.top_k,
            temperature=temperature,
            chunk=chunk,
            loss=self.loss,
            uld_weight=self.uld_weight,
        )
        return self._on_grid(found, wanted), view, (flat, cast, dtype)

    def _on_grid(self, found: CrossTeacher, wanted: Tensor) -> CrossTeacher:
        """``found`` (records of the ``wanted`` positions) spread over ``[batch, seq − 1]``,
        filler where nothing is wanted."""
        shape = (*wanted.shape, found.ids.shape[-1] if found.ids.ndim == 2 else self.top_k)

        def spread(values: Tensor, fill, per_position: bool) -> Tensor:
            grid = values.new_full(shape[:2] if per_position else shape, fill)
            grid[wanted] = values
            return grid

        return CrossTeacher(
            ids=spread(found.ids, 0, False),
            log_probs=spread(found.log_probs, -1.0e4, False),
            matched=spread(found.matched, False, False),
            tail=spread(found.tail, -1.0e4, True),
            top_probs=spread(found.top_probs, 0.0, False),
            aligned=spread(found.aligned, False, True),
            student_twins=found.student_twins,
            loss=found.loss,
            uld_weight=found.uld_weight,
        )

    # ------------------------------------------------------------------------- validation

    @torch.no_grad()
    def teacher_sums(self) -> MetricSums:
        """The teacher's bits per byte over the student's scored text, from the states the last
        ``records(..., keep=True)`` kept (then dropped)."""
        if self.kept is None:
            raise RuntimeError("teacher_sums reads the states of records(..., keep=True)")
        (view, flat, cast, dtype), self.kept = self.kept, None
        device = flat.device
        scored = view.scored[:, :-1].reshape(-1)
        index = torch.arange(view.scored.numel()).view(view.scored.shape)[:, :-1].reshape(-1)
        index, targets = index[scored].to(device), view.input_ids[:, 1:].reshape(-1)[scored]
        targets = targets.to(device)
        nll = flat.new_zeros((), dtype=torch.float64)
        chunk = max(1, CHUNK_ELEMENTS // max(1, cast.weight.shape[0]))
        for start in range(0, index.numel(), chunk):
            logits = cast.logits(flat[index[start : start + chunk]], dtype).double()
            picked = logits.gather(-1, targets[start : start + chunk].unsqueeze(-1)).squeeze(-1)
            nll += (torch.logsumexp(logits, -1) - picked).sum()
        teacher_bytes = view.target_bytes[:, :-1].reshape(-1)[scored].sum()
        return {"teacher_bpb": (nll / math.log(2), teacher_bytes.to(device))}


def teacher_tokenizer_for(
    teacher: TeacherSpec, distill, tokenizer: PreTrainedTokenizerBase | None
) -> PreTrainedTokenizerBase | None:
    """The teacher's tokenizer when the run distils across tokenizers (the run's ``tokenizer``,
    the student's, is not the teacher's, or ``distill.cross_tokenizer=always``), else None;
    what that path cannot serve is refused here, before any model loads."""
    if teacher.task != "causal_lm" or tokenizer is None:
        return None
    teacher_tokenizer = load_tokenizer(teacher)
    if distill.cross_tokenizer != "always" and same_tokenizer(tokenizer, teacher_tokenizer):
        return None
    if errors := distill.cross_errors():
        raise ValueError(
            "the student's tokenizer is not the teacher's (cross-tokenizer distillation), and "
            + "; ".join(errors)
        )
    return teacher_tokenizer
