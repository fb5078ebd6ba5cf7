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

With ``distill.on_policy_teacher_top_k=k`` the completions are written by interleaved sampling
(speculative KD, ``interleaved.py``): a student token outside the teacher's top k is replaced by
the teacher's sample. ``tally`` counts how many of the written tokens were the student's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lightning_kd.interleaved import eval_mode, interleaved_sample
from lightning_kd.losses.logits import IGNORE_INDEX


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
    eos_token_id: int | None
    pad_token_id: int
    warmup: int = 0
    """Steps (``step`` of :meth:`replace`) trained on the dataset's answers alone first."""
    teacher_top_k: int | None = None
    """Interleaved sampling: the teacher's top k a student token must be in (None: off)."""
    tally: Tally = field(default_factory=Tally, compare=False)
    """Tokens written, and how many were the student's own, since the last :meth:`Tally.take`."""

    def chooses(self, draw: int, step: int = 0) -> bool:
        """Whether micro-batch ``draw`` of ``step`` is sampled: none before ``warmup``, then a
        Bernoulli(λ) draw of its own."""
        if step < self.warmup:
            return False
        if self.fraction >= 1 or self.fraction <= 0:
            return self.fraction >= 1
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + draw)
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
        left = left_padded(prompts, self.pad_token_id, batch["input_ids"].device)
        room = self.room(student, teacher) - left["input_ids"].shape[1]
        if room < 1:
            raise ValueError(
                f"distill.on_policy: a prompt of {left['input_ids'].shape[1]} tokens leaves the "
                "student no position to generate in; lower data.block_size"
            )
        with torch.random.fork_rng(devices=device_list(left["input_ids"])):
            torch.manual_seed(self.seed * 1_000_003 + draw)
            new, own = self.write(student, teacher, left, min(self.max_new_tokens, room))
        completions = [until_eos(row, self.eos_token_id) for row in new]
        if own is not None:  # interleaved: count the student's tokens among those kept
            self.tally.add(int(own.sum()), sum(len(completion) for completion in completions))
        return completions_batch(prompts, completions, self.pad_token_id)

    def write(
        self, student: nn.Module, teacher: nn.Module | None, left: dict[str, Tensor], tokens: int
    ) -> tuple[Tensor, Tensor | None]:
        """At most ``tokens`` new tokens after each prompt: the student's sample, or the
        interleaved one with which of its tokens are the student's own (None when all are)."""
        options = {"eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id}
        if self.teacher_top_k is None:
            options |= {"do_sample": True, "top_k": 0, "top_p": 1.0}
            new = generate_in_eval(
                student, left, max_new_tokens=tokens, temperature=self.temperature, **options
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
            **options,
        )

    def room(self, student: nn.Module, teacher: nn.Module | None) -> int:
        """The longest prompt + completion: the student's, and the teacher's when it writes."""
        if self.teacher_top_k is None or teacher is None:
            return positions(student)
        return min(positions(student), positions(teacher))


def until_eos(tokens: Tensor, eos_token_id: int | None) -> Tensor:
    """A completion up to and including its first end-of-sequence token."""
    if eos_token_id is None:
        return tokens
    ends = (tokens == eos_token_id).nonzero()
    return tokens if len(ends) == 0 else tokens[: int(ends[0]) + 1]


@torch.no_grad()
def generate_in_eval(model: nn.Module, left: dict[str, Tensor], **options) -> Tensor:
    """The tokens ``model`` generates after the left-padded prompts ``left``, in eval mode (no
    dropout, no activation checkpointing), with the KV cache and no graph; its mode restored."""
    with eval_mode(model):
        output = model.generate(**left, use_cache=True, **options)
    return output[:, left["input_ids"].shape[1] :]


def positions(model: nn.Module) -> int:
    """The longest sequence ``model`` takes (prompt + completion must fit)."""
    config = model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)


def device_list(tensor: Tensor) -> list[int]:
    """The CUDA device whose RNG ``fork_rng`` must also save, if ``tensor`` is on one."""
    return [tensor.device.index or 0] if tensor.is_cuda else []


def prompt_tokens(batch: dict[str, Tensor]) -> list[Tensor]:
    """Each row's prompt: its attended tokens before the first scored label (all of them for a
    row without one)."""
    prompts = []
    for ids, labels, mask in zip(
        batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True
    ):
        length = int(mask.sum())
        scored = (labels[:length] != IGNORE_INDEX).nonzero()
        end = int(scored[0]) if len(scored) else length
        if end == 0:
            raise ValueError(
                "distill.on_policy: a row is scored from its first token, so it has no prompt to "
                "complete; on-policy KD needs prompts (data=chat labels the answers only)"
            )
        prompts.append(ids[:end])
    return prompts


def left_padded(prompts: list[Tensor], pad_id: int, device: torch.device) -> dict[str, Tensor]:
    """Prompts right-aligned (generation continues every row from its last token)."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


def completions_batch(
    prompts: list[Tensor], completions: list[Tensor], pad_id: int
) -> dict[str, Tensor]:
    """Prompt + completion rows, right-padded; labelled on the completions only."""
    rows = [torch.cat([p, c]) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=rows[0].device)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, IGNORE_INDEX)
    for index, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
        labels[index, len(prompt) : len(row)] = row[len(prompt) :]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def on_policy_for(distill, student: nn.Module, task: str) -> OnPolicy | None:
    """The ``distill.on_policy`` sampler of ``student`` (None at λ = 0): its end-of-sequence
    token ends a completion, its padding token (else that end token) pads the prompts."""
    if distill.on_policy == 0:
        return None
    if task != "causal_lm":
        raise ValueError(f"distill.on_policy samples completions: a causal LM's, not a {task}'s")
    eos, pad = stop_and_pad(student, "distill.on_policy")
    return OnPolicy(
        distill.on_policy,
        distill.on_policy_tokens,
        distill.on_policy_temperature,
        distill.on_policy_seed,
        eos,
        pad,
        distill.on_policy_warmup,
        distill.on_policy_teacher_top_k,
    )


def stop_and_pad(model: nn.Module, who: str) -> tuple[int | None, int]:
    """``model``'s end-of-sequence token (ends a completion) and padding token (else that end
    token; pads prompts), from its generation config or its config."""
    config = model.generation_config if hasattr(model, "generation_config") else None
    eos = getattr(config, "eos_token_id", None) or model.config.eos_token_id
    eos = eos[0] if isinstance(eos, list | tuple) else eos
    pad = getattr(config, "pad_token_id", None) or model.config.pad_token_id
    pad = eos if pad is None else pad
    if pad is None:
        raise ValueError(f"{who}: the model has no pad or end-of-sequence token")
    return eos, pad
