"""On-policy and mixed KD (GKD, Agarwal et al. 2024): micro-batches of the student's own answers.

With ``distill.on_policy=λ``, a training micro-batch is, with probability λ, replaced by the
student's completions of its prompts before the step runs: each row's prompt is its tokens before
its first scored label (the first answer token, as ``data=chat`` labels them); the student samples
a completion (eval mode, no graph, KV cache, ``distill.on_policy_temperature``, at most
``distill.on_policy_tokens`` tokens, cut after its end-of-sequence token); the new row is prompt +
completion, labelled on the completion only. The step then scores it under both models with the
configured divergence, as a dataset batch: the completions' token counts go into the same token
sums, so the window's mean over variable-length completions is exact (``accumulation.py``). The CE
term (``distill.ce_weight``) applies to the dataset's answers only, as in GKD: on the student's own
sample its expected gradient is zero at T = 1 (E_{y~q}[∇ log q(y)] = 0), so it would add noise
alone, and at another sampling temperature it would pull the student toward its own tempered
distribution; it is still computed and logged.

Generation runs outside the step's capture arming, so the capture lifecycle never sees its
forwards; eval mode turns activation checkpointing off for it. Which micro-batches are sampled and
what is sampled come from ``seed`` and the micro-batch's ``draw`` number (the optimizer step and
batch index under Lightning), so a resumed run samples what the uninterrupted one would have.

Under sharding (FSDP, DeepSpeed ZeRO-3) each forward of the student (and, interleaved, of the
teacher) gathers its weights with a collective, which every rank must join. Three things keep
the ranks in step:

- *The same micro-batches are sampled on every rank*: the choice is a function of ``seed``,
  ``draw`` and ``step`` alone, which every rank shares (Lightning gives each rank the same number
  of batches), never of the rank or its data; a rank sampling alone would wait forever.
- *The same token budget*: the widest prompt over the ranks sets every rank's room, so ranks
  agree on the most tokens, and on a refusal.
- *Decoding in step*: ``generate(synced_gpus=True)``, and the same in the interleaved loop, keep
  a rank whose completions have all ended running forwards (drawing nothing) until every rank's
  have: each rank writes what it would write alone, its completions as long as they are.

This applies only when a model is sharded and there is more than one rank
(``decoding.decodes_in_step``, asked of the models themselves, so a plain PyTorch loop gets it
too); DDP and one device decode alone, with no collective per token. Every rank seeds its
sampling with the same ``seed`` and ``draw``, as under DDP: ranks sample their own rows from the
same random stream.

With ``distill.on_policy_teacher_top_k=k`` the completions are written by interleaved sampling
(speculative KD, ``generation/interleaved.py``): a student token outside the teacher's top k is
replaced by the teacher's sample. ``tally`` counts how many of the written tokens were the
student's own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lightning_kd.generation.decoding import (
    TextStop,
    completions_batch,
    decodes_in_step,
    device_list,
    generate_in_eval,
    left_padded,
    prompt_tokens,
    stop_and_pad,
    until_stop,
    widest,
)
from lightning_kd.generation.interleaved import interleaved_sample
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.batch_positions import max_positions


@dataclass
class Tally:
    """Tokens interleaved sampling wrote, and how many of them were the student's own."""

    own: int = 0
    written: int = 0

    def add(self, own: int, written: int) -> None:
        self.own, self.written = self.own + own, self.written + written

    def take(self) -> float | None:
        """The student's share of the tokens written since the last call (None: none written)."""
        share = self.own / self.written if self.written else None
        self.own = self.written = 0
        return share


@dataclass(frozen=True)
class OnPolicy:
    """How often and how the student's own completions replace a micro-batch's answers."""

    fraction: float
    max_new_tokens: int
    temperature: float
    seed: int
    stop_ids: tuple[int, ...]
    """The tokens that end a completion (``decoding.stop_and_pad``; none: the token limit)."""
    pad_token_id: int
    warmup: int = 0
    """Steps (``step`` of :meth:`replace`) trained on the dataset's answers alone first."""
    teacher_top_k: int | None = None
    """Interleaved sampling: the teacher's top k a student token must be in (None: off)."""
    scorer_limits: tuple[int, ...] = ()
    """The position limits of the other teachers that score a completion (``teachers``)."""
    text_stop: TextStop | None = None
    """Where a completion ends in text, under a template that ends answers with no token."""
    tally: Tally = field(default_factory=Tally, compare=False)
    """Tokens written, and how many were the student's own, since the last :meth:`Tally.take`."""

    def chooses(self, draw: int, step: int = 0) -> bool:
        """Whether micro-batch ``draw`` of ``step`` is sampled: none before ``warmup``, then a
        Bernoulli(λ) draw of its own."""
        if step < self.warmup:
            return False
        if self.fraction >= 1 or self.fraction <= 0:
            return self.fraction >= 1
        generator = torch.Generator().manual_seed(draw_seed(self.seed, draw, "choose"))
        return bool(torch.rand((), generator=generator) < self.fraction)

    def replace(
        self,
        student: nn.Module,
        batch: dict[str, Tensor],
        draw: int,
        step: int = 0,
        teacher: nn.Module | None = None,
    ) -> dict[str, Tensor]:
        """``batch``, or the student's completions of its prompts if ``draw`` is chosen."""
        return self.sample(student, batch, draw, teacher) if self.chooses(draw, step) else batch

    @torch.no_grad()
    def sample(
        self,
        student: nn.Module,
        batch: dict[str, Tensor],
        draw: int,
        teacher: nn.Module | None = None,
    ) -> dict[str, Tensor]:
        """``batch`` with each answer replaced by the student's completion of its prompt (with
        ``teacher_top_k``, by the interleaved completion ``teacher`` vetoes)."""
        prompts = prompt_tokens(batch)
        device = batch["input_ids"].device
        left = left_padded(prompts, self.pad_token_id, device)
        in_step = decodes_in_step(student, teacher if self.teacher_top_k is not None else None)
        width = widest(left["input_ids"].shape[1], device, in_step)
        limit = self.room(student, teacher)
        room = self.max_new_tokens if limit is None else limit - width
        if room < 1:
            raise ValueError(
                f"distill.on_policy: a prompt of {width} tokens leaves the student no position to "
                "generate in; lower data.block_size"
            )
        with torch.random.fork_rng(devices=device_list(left["input_ids"])):
            torch.manual_seed(draw_seed(self.seed, draw, "sample"))
            new, own = self.write(student, teacher, left, min(self.max_new_tokens, room), in_step)
        completions = [until_stop(row, self.stop_ids) for row in new]
        if self.text_stop is not None:
            completions = [self.text_stop.cut(completion) for completion in completions]
        if own is not None:  # interleaved: count the student's tokens among those kept
            kept = [mine[: len(c)].sum() for mine, c in zip(own, completions, strict=True)]
            self.tally.add(int(sum(kept)), sum(len(completion) for completion in completions))
        written = completions_batch(prompts, completions, self.pad_token_id)
        padding = (batch["labels"] == IGNORE_INDEX).all(-1)  # a rank's padding row (Unscored)
        written["labels"][padding.to(written["labels"].device)] = IGNORE_INDEX
        return written

    def write(
        self,
        student: nn.Module,
        teacher: nn.Module | None,
        left: dict[str, Tensor],
        tokens: int,
        in_step: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """At most ``tokens`` new tokens after each prompt: the student's sample, or the
        interleaved one with which of its tokens are the student's own (None when all are);
        ``in_step``: every rank runs each forward until all ranks are done (sharded models)."""
        if self.teacher_top_k is None:
            options = {"do_sample": True, "top_k": 0, "top_p": 1.0, "synced_gpus": in_step}
            options["eos_token_id"] = list(self.stop_ids) or None
            options |= self.text_stop.options() if self.text_stop is not None else {}
            new = generate_in_eval(
                student,
                left,
                max_new_tokens=tokens,
                temperature=self.temperature,
                pad_token_id=self.pad_token_id,
                **options,
            )
            return new, None
        if teacher is None:
            raise ValueError(
                "distill.on_policy_teacher_top_k: interleaved sampling needs the teacher"
            )
        return interleaved_sample(
            student,
            teacher,
            left,
            max_new_tokens=tokens,
            temperature=self.temperature,
            top_k=self.teacher_top_k,
            stop_ids=self.stop_ids,
            pad_token_id=self.pad_token_id,
            in_step=in_step,
        )

    def room(self, student: nn.Module, teacher: nn.Module | None) -> int | None:
        """The longest prompt + completion: the student's, and every teacher's that scores it
        (a teacher of another tokenizer counted in its own tokens, as if they were the
        student's: its step refuses a row beyond them); None where no config states a limit."""
        models = [student] if teacher is None else [student, teacher]
        limits = [limit for model in models if (limit := max_positions(model.config))]
        return min([*limits, *self.scorer_limits], default=None)


def draw_seed(seed: int, draw: int, use: str) -> int:
    """The seed of micro-batch ``draw``'s ``use`` ("choose" it, "sample" it) under
    ``distill.on_policy_seed`` ``seed``: hashed, as a sum (seed · 1,000,003 + draw, with a draw
    numbered step · 1,000,003 + batch) made seed 1 draw what seed 0 drew a step later (probe 43)."""
    digest = hashlib.blake2b(f"{seed}/{draw}/{use}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # within torch.manual_seed's range


def on_policy_for(distill, student: nn.Module, task: str, extra=None) -> OnPolicy | None:
    """The ``distill.on_policy`` sampler of ``student`` (None at λ = 0): its stop tokens end a
    completion (``decoding.stop_and_pad``; ``Distiller.from_specs`` adds the chat template's
    end of turn), its padding token pads the prompts; the
    other teachers ``extra`` (``ExtraTeachers``) score its completions too, within their
    positions (past them, a teacher of learned positions raises an IndexError, and one of
    rotary positions scores text it was never trained at)."""
    if distill.on_policy == 0:
        return None
    if task != "causal_lm":
        raise ValueError(f"distill.on_policy samples completions: a causal LM's, not a {task}'s")
    stops, pad = stop_and_pad(student, "distill.on_policy")
    return OnPolicy(
        distill.on_policy,
        distill.on_policy_tokens,
        distill.on_policy_temperature,
        distill.on_policy_seed,
        stops,
        pad,
        distill.on_policy_warmup,
        distill.on_policy_teacher_top_k,
        scorer_limits(extra),
    )


def scorer_limits(extra) -> tuple[int, ...]:
    """The stated position limits of ``extra``'s teacher models (none for a cached one)."""
    models = [] if extra is None else extra.models.values()
    return tuple(limit for model in models if (limit := max_positions(model.config)))
