"""Decoding helpers shared by on-policy KD, the teacher's completions, prompt evaluation and the
samples callback: prompts cut from a batch, left padding, generation in eval mode, end tokens,
and whether ranks must decode in step (sharded models)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed import fsdp
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.chat_tokens import turn_end_id, turn_end_text
from lightning_kd.losses.logits import IGNORE_INDEX


def until_stop(tokens: Tensor, stops: Sequence[int]) -> Tensor:
    """A completion up to and including its first stop token (any of ``stops``)."""
    if not stops:
        return tokens
    ends = torch.isin(tokens, torch.tensor(list(stops), device=tokens.device)).nonzero()
    return tokens if len(ends) == 0 else tokens[: int(ends[0]) + 1]


@dataclass(frozen=True)
class TextStop:
    """Where a completion ends in text, under a chat template that closes an answer with no
    special token (``chat_tokens.turn_end_text``): at the first ``marker`` its text holds, the
    first ``keep`` characters of it kept (the answer's own closing, the newline before
    ``plain``'s ``User:``). Without it, completions ran on into turns of their own (probe 44)."""

    marker: str
    keep: int
    tokenizer: PreTrainedTokenizerBase = field(compare=False, repr=False)

    def cut(self, tokens: Tensor) -> Tensor:
        """``tokens`` up to the last one whose text ends within the answer: whole where their
        text holds no ``marker``."""
        at = self.tokenizer.decode(tokens).find(self.marker)
        if at < 0:
            return tokens
        end = at + self.keep
        kept = 0  # prefixes' texts grow with them: the longest within ``end``
        while kept < len(tokens) and len(self.tokenizer.decode(tokens[: kept + 1])) <= end:
            kept += 1
        return tokens[:kept]

    def options(self) -> dict:
        """What stops ``generate`` at the marker (the cut still decides what is kept)."""
        return {"stop_strings": [self.marker], "tokenizer": self.tokenizer}


def text_stop(tokenizer: PreTrainedTokenizerBase | None) -> TextStop | None:
    """The :class:`TextStop` of ``tokenizer``'s chat template, where its answers end with no
    special token (None where they do, where it has none, or none is given)."""
    if tokenizer is None or tokenizer.chat_template is None or turn_end_id(tokenizer) is not None:
        return None
    ends = turn_end_text(tokenizer)
    return None if ends is None else TextStop(*ends, tokenizer)


PLAIN_DECODING = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "renormalize_logits": False,
    "num_beams": 1,
    "num_return_sequences": 1,
}
"""Every logits processor a model's ``generation_config.json`` may switch on (a chat model's
``repetition_penalty``, ``no_repeat_ngram_size``, ...), switched off: transformers fills each
setting a call leaves unset from the model's file, so what it wrote there changed greedy and
sampled text alike, unrecorded."""
PLAIN_SAMPLING = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}
"""Sampling from the model's whole distribution: transformers' default ``top_k=50`` (or the
model's own ``top_k``, ``top_p``, ...) drew every token from a truncated one."""


@torch.no_grad()
def generate_in_eval(model: nn.Module, left: dict[str, Tensor], **options) -> Tensor:
    """The tokens ``model`` generates after the left-padded prompts ``left``, in eval mode (no
    dropout, no activation checkpointing), with the KV cache and no graph; its mode restored.
    Decoding is what ``options`` say and nothing else: :data:`PLAIN_DECODING` (and, sampling,
    :data:`PLAIN_SAMPLING`) under them."""
    plain = PLAIN_DECODING | (PLAIN_SAMPLING if options.get("do_sample") else {})
    with eval_mode(model):
        output = model.generate(**left, use_cache=True, **(plain | options))
    return output[:, left["input_ids"].shape[1] :]


def is_sharded(model: nn.Module) -> bool:
    """Whether a forward of ``model`` gathers weights from the other ranks: it holds an FSDP unit
    (FSDP1's wrapper, an FSDP2 module) or DeepSpeed ZeRO-3 partitioned parameters (``ds_id``).
    A model inside one FSDP unit alone is whole during that unit's forward: not sharded here."""
    units = tuple(
        unit
        for unit in (fsdp.FullyShardedDataParallel, getattr(fsdp, "FSDPModule", None))
        if unit is not None
    )
    if any(isinstance(module, units) for module in model.modules()):
        return True
    return any(hasattr(parameter, "ds_id") for parameter in model.parameters())


def decodes_in_step(*models: nn.Module | None) -> bool:
    """Whether every rank must run each decoding forward together: more than one rank, and one
    of ``models`` sharded, so that each of its forwards is a collective (a rank that stopped
    early would leave the others waiting in it). A DDP or one-device run decodes alone: no
    collective per token, and it samples what it always did."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    return any(model is not None and is_sharded(model) for model in models)


def widest(width: int, device: torch.device, in_step: bool) -> int:
    """``width`` (a prompt width), or the widest over ranks when they decode in step: every rank
    then gets the same token budget (the same refusal, too), and a rank that runs extra forwards
    for the others still stays within its model's positions."""
    if not in_step:
        return width
    value = torch.tensor(width, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value)


def device_list(tensor: Tensor) -> list[int]:
    """The CUDA device whose RNG ``fork_rng`` must also save, if ``tensor`` is on one."""
    return [tensor.device.index or 0] if tensor.is_cuda else []


def prompt_tokens(batch: dict[str, Tensor]) -> list[Tensor]:
    """Each row's prompt: its attended tokens before the first scored target (all of them for
    a row without one), wherever the row's padding is (a batch padded on the left, as a tokenizer
    may pad it, has its pads first: they are neither prompt nor attended). A row's first token
    is no target (nothing predicts it), so a row scored from its second token on has no prompt
    either: its first token's label, left-padded, was masked as the pad's prediction, and the
    row was read as a one-token prompt where unpadded it was refused (probe 51)."""
    prompts = []
    for ids, labels, mask in zip(
        batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True
    ):
        attended = mask.bool()
        targets = attended & F.pad(attended[:-1], (1, 0), value=False)  # after an attended one
        scored = (targets & (labels != IGNORE_INDEX)).nonzero()
        end = int(scored[0]) if len(scored) else len(ids)
        prompt = ids[:end][attended[:end]]
        if not len(prompt) or (len(prompt) == 1 and len(scored)):
            raise ValueError(
                "distill.on_policy: a row is scored from its first token, so it has no prompt to "
                "complete; on-policy KD needs prompts (data=chat labels the answers only)"
            )
        prompts.append(prompt)
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


def stop_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase | None = None) -> tuple[int, ...]:
    """The tokens each of which ends ``model``'s completion: every end-of-sequence id of its
    generation config (else of its config) and, given its ``tokenizer``, the token its chat
    template closes an answer with.

    Only the first of several ids was kept (Llama 3's ``<|end_of_text|>``, not ``<|eot_id|>``),
    and a template's end of turn that is not the model's EOS was none: a completion ran on past
    its answer into turns of its own, all of it scored (probe 43)."""
    config = model.generation_config if hasattr(model, "generation_config") else None
    eos = getattr(config, "eos_token_id", None)
    eos = model.config.eos_token_id if eos is None else eos
    stops = [] if eos is None else list(eos) if isinstance(eos, list | tuple) else [eos]
    turn_end = None if tokenizer is None else turn_end_id(tokenizer)
    if turn_end is not None and turn_end not in stops:
        stops.append(turn_end)
    return tuple(stops)


def stop_and_pad(
    model: nn.Module, who: str, tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[tuple[int, ...], int]:
    """``model``'s :func:`stop_ids` and its padding token (else its first stop; pads prompts)."""
    stops = stop_ids(model, tokenizer)
    config = model.generation_config if hasattr(model, "generation_config") else None
    pad = getattr(config, "pad_token_id", None)
    pad = model.config.pad_token_id if pad is None else pad
    pad = (stops[0] if stops else None) if pad is None else pad
    if pad is None:
        raise ValueError(f"{who}: the model has no pad or end-of-sequence token")
    return stops, pad


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (no dropout, no activation checkpointing), its mode restored."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
