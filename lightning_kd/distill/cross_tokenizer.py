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
import warnings
from functools import cached_property

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.alignment import Aligner, TeacherView
from lightning_kd.data.vocab_maps import first_token_map, vocabulary_map
from lightning_kd.distill.spelled_share import SpelledShare
from lightning_kd.losses.chunked import CHUNK_ELEMENTS, OutputHead, matmul_dtype
from lightning_kd.losses.cross_spans import span_grid, teacher_spans_at
from lightning_kd.losses.cross_top import TeacherSide, TeacherTop, teacher_top
from lightning_kd.losses.cross_vocab import CrossTeacher, at_column, cross_records, twins
from lightning_kd.losses.logits import next_token_targets
from lightning_kd.models.batch_positions import max_positions
from lightning_kd.models.heads import check_head, final_hidden
from lightning_kd.utils.refusal import Refused

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
        span_weight: float = 0.0,
        min_aligned: float = 0.9,
    ) -> None:
        self.aligner = Aligner(student_tokenizer, teacher_tokenizer)
        self.student_vocab, self.teacher_vocab = student_vocab, teacher_vocab
        self.student_lengths = self.aligner.student.lengths(student_vocab)
        self.top_k = min(top_k, teacher_vocab)
        if top_k > teacher_vocab:  # the whole distribution is what asking for more can mean
            warnings.warn(
                f"distill.cross_top_k={top_k} is more than the teacher's {teacher_vocab}-token "
                f"vocabulary: its whole distribution is kept ({teacher_vocab} a position)",
                stacklevel=2,
            )
        self.loss, self.uld_weight, self.span_weight = loss, uld_weight, span_weight
        self.spelled, self.head_checked = SpelledShare(min_aligned), False
        self.kept: tuple[Tensor, Tensor] | None = None
        """A validation batch's teacher NLL and bytes per row, until :meth:`teacher_sums` reads
        them."""

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
            span_weight=distill.cross_span_weight,
            min_aligned=distill.cross_min_aligned,
        )

    @property
    def teacher_tokenizer(self) -> PreTrainedTokenizerBase:
        return self.aligner.teacher_tokenizer

    # The maps of the two vocabularies are built on first use: writing a cache aligns and takes
    # the teacher's own top k, and never maps them (for Gemma's 262k tokens: 0.4 s one to one,
    # 8 s for the projection's first-token map, measured on a shared 2-core CPU). The first use
    # may be a validation step: built outside inference mode, the maps stay usable by autograd.
    @cached_property
    def mapping(self) -> Tensor:
        """``[teacher_vocab (+ 1)]``: each teacher id's student id, or −1, and where the
        teacher's end has two meanings for the student, the second (``data/vocab_maps.py``)."""
        tables = (self.aligner.student, self.aligner.teacher, self.teacher_vocab)
        with torch.inference_mode(False):
            if self.loss == "projected":  # many to one: each teacher token to the student's first
                mapping = first_token_map(self.aligner.student_tokenizer, *tables)
            else:
                mapping = vocabulary_map(*tables)
            return mapping.masked_fill(mapping >= self.student_vocab, -1)  # ids past the head

    @cached_property
    def student_twins(self) -> Tensor:
        """``[student_vocab]``: which student ids some teacher id maps to."""
        with torch.inference_mode(False):
            return twins(self.mapping, self.student_vocab)

    def view(self, batch: dict[str, Tensor]) -> TeacherView:
        """The teacher's tokenisation of ``batch``, counted for how much text it spells back."""
        view = self.aligner.view(
            batch["input_ids"].cpu(), batch.get("attention_mask"), batch["labels"].cpu()
        )
        self.spelled.add(view)
        return view

    @torch.no_grad()
    def teacher_hidden(self, teacher: nn.Module, view: TeacherView, device) -> Tensor:
        """The teacher's final hidden states on its own ids ``[batch, teacher_seq, hidden]``;
        its head is checked against its own logits once, on these ids."""
        inputs = {
            "input_ids": view.input_ids.to(device),
            "attention_mask": view.attention_mask.to(device),
        }
        width, limit = view.input_ids.shape[1], max_positions(teacher.config)
        if limit is not None and width > limit:  # learned positions: an IndexError in the embedding
            ours = view.partner.shape[1]
            raise Refused(
                f"the teacher reads a row of {ours} student tokens as {width} of its own, beyond "
                f"its {limit} positions (config max_position_embeddings): a row fits in about "
                f"{ours * limit // width} student tokens of this text. Lower data.block_size, and "
                "with on-policy KD distill.on_policy_tokens too (a row is then the prompt and "
                "the student's sampled answer)"
            )
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
        holds the teacher's bits per byte for :meth:`teacher_sums` (validation)."""
        side = self.teacher_side(teacher, head, batch, temperature, keep)
        self.kept = (side.nll, side.text_bytes) if keep else None
        return self.mapped(side.top, side.wanted, side.span, batch["labels"])

    @torch.no_grad()
    def teacher_side(
        self,
        teacher: nn.Module,
        head: OutputHead,
        batch: dict[str, Tensor],
        temperature: float,
        keep: bool = False,
        k: int | None = None,
    ) -> TeacherSide:
        """The teacher's own top ``k`` (``distill.cross_top_k`` by default) at its positions
        aligned with the student's scored ones, with ``keep`` each row's teacher NLL and
        byte count over the student's scored text, and with ``keep`` or a span term the
        teacher's log-probability of each span (``losses/cross_spans.py``), from one pass of
        its head."""
        view = self.view(batch)
        device = batch["input_ids"].device
        hidden = self.teacher_hidden(teacher, view, device)
        flat = hidden.reshape(-1, hidden.shape[-1])
        dtype = matmul_dtype(hidden)
        cast = head.cast(dtype)
        width = view.input_ids.shape[1]
        partner = view.partner[:, :-1].to(device)
        wanted = (partner >= 0) & next_token_targets(batch["labels"])[1]
        rows = torch.arange(partner.shape[0], device=device).unsqueeze(1)
        index = (rows * width + partner)[wanted]
        targets = where = span = None
        measure = keep or self.span_weight > 0
        if measure:  # the teacher's own scored positions join the pass, with their next tokens
            index, targets, where = self._with_scored(view, index, device)
        top, target_log_probs = teacher_top(
            lambda at: cast.logits(flat[at], dtype),
            index,
            k=k or self.top_k,
            temperature=temperature,
            chunk=max(1, CHUNK_ELEMENTS // max(1, head.weight.shape[0])),
            targets=targets,
        )
        batch_size = partner.shape[0]
        nll = torch.zeros(batch_size, dtype=torch.float64, device=device)
        text_bytes = torch.zeros(batch_size, dtype=torch.long, device=device)
        if keep:
            nll.index_add_(0, index // width, -target_log_probs)
            scored = view.scored[:, :-1]
            text_bytes = (view.target_bytes[:, :-1] * scored).sum(-1).to(device)
        if measure:
            top = top[where]
            span = teacher_spans_at(partner, wanted, view.scored, index, target_log_probs)
        return TeacherSide(top, wanted, nll, text_bytes, span)

    def mapped(
        self,
        top: TeacherTop,
        wanted: Tensor,
        span: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> CrossTeacher:
        """Records on the student's grid ``[batch, seq − 1]`` of the teacher's ``top`` at the
        ``wanted`` positions (in order), through this pair's map of the two vocabularies; with
        a span term, its spans from the teacher's ``span`` values at those positions and which
        positions ``labels`` scores."""
        if labels is not None and len(self.mapping) > self.teacher_vocab:  # before a document end
            ends = next_token_targets(labels)[0].to(wanted.device)[wanted] == self.mapping[-1]
            top = at_column(top, ends, self.aligner.teacher.end, self.teacher_vocab)
        found = cross_records(
            top,
            self.mapping.to(top.ids.device),
            self.student_twins.to(top.ids.device),
            loss=self.loss,
            uld_weight=self.uld_weight,
        )
        records = found.spread(wanted)
        if self.span_weight == 0:
            return records
        if span is None or labels is None:
            raise ValueError(
                "distill.cross_span_weight needs the teacher's log-probability of each span, "
                "which this teacher's records lack"
            )
        scored = next_token_targets(labels)[1].to(wanted.device)
        return records.with_spans(*span_grid(wanted, scored, span), self.span_weight)

    def cached_records(
        self, stored: TeacherSide, labels: Tensor, counted: Tensor | None = None
    ) -> CrossTeacher:
        """Records from a cache's ``stored`` top k on the student's grid (its ``wanted``: the
        positions that had a partner), narrowed to ``distill.cross_top_k``, at the positions
        ``labels`` scores; ``counted`` (validation: the rows that are real blocks) keeps the
        teacher's bits per byte for :meth:`teacher_sums`."""
        wanted = stored.wanted & next_token_targets(labels)[1]
        top = stored.top[wanted]
        span = None if stored.span is None else stored.span[wanted]
        if top.ids.shape[-1] > self.top_k:  # the top of the top K, the rest into the tail
            dropped = torch.logsumexp(top.log_probs[:, self.top_k :], -1)
            top = TeacherTop(
                top.ids[:, : self.top_k],
                top.log_probs[:, : self.top_k],
                torch.logaddexp(top.rest, dropped),
            )
        self.kept = None
        if counted is not None:
            self.kept = (stored.nll.where(counted, 0), stored.text_bytes.where(counted, 0))
        return self.mapped(top, wanted, span, labels)

    @staticmethod
    def _with_scored(view: TeacherView, index: Tensor, device) -> tuple[Tensor, Tensor, Tensor]:
        """The union of ``index`` (partner positions) and the teacher's scored positions, the
        next token of each scored one (−1 elsewhere), and where ``index``'s rows are in it."""
        scored = view.scored.clone()
        scored[:, -1] = False
        flat_scored = scored.reshape(-1).nonzero().squeeze(-1).to(device)
        union = torch.unique(torch.cat([index, flat_scored]))
        next_ids = torch.cat([view.input_ids[:, 1:], view.input_ids[:, :1]], 1).reshape(-1)
        targets = torch.where(scored.reshape(-1), next_ids, -1).to(device)[union]
        return union, targets, torch.searchsorted(union, index)

    # ------------------------------------------------------------------------- validation

    def teacher_sums(self, rows: Tensor | None = None) -> MetricSums:
        """The teacher's bits per byte over the student's scored text, which the last
        ``records(..., keep=True)`` measured (then dropped), over ``rows`` (a ``[batch]`` mask:
        those it teaches; None: every row)."""
        if self.kept is None:
            raise RuntimeError("teacher_sums reads what records(..., keep=True) measured")
        (nll, text_bytes), self.kept = self.kept, None
        if rows is not None:  # not a product: a row another teacher teaches may be NaN here
            rows = rows.to(nll.device)
            nll, text_bytes = nll.where(rows, 0), text_bytes.where(rows, 0)
        return {"teacher_bpb": (nll.sum() / math.log(2), text_bytes.sum())}
