"""Interleaved sampling (speculative KD, Xu et al., ICLR 2025): the student writes, the teacher
vetoes.

On-policy KD trains on the student's own samples; from a weak student they are word salad, and the
teacher's distributions on word salad teach little (``docs/results.md#instruct``). Speculative KD
keeps the samples the student's — they follow its distribution wherever it agrees with the teacher —
but at each position the student's sampled token must be among the teacher's ``top_k`` most likely
next tokens; where it is not, the teacher samples that token instead and both models continue from
it. A token is therefore drawn from

    q(y) · 1[y ∈ K_t]  +  (1 − q(K_t)) · p(y)

(q the student's, p the teacher's distribution at the temperature, K_t the teacher's top k). A
``top_k`` of the vocabulary size is plain on-policy sampling; ``top_k`` 1 keeps only the
student's tokens that are the teacher's first choice.

Both models decode with their own KV cache, one token per step, in eval mode with no graph;
the caller owns the random stream (``on_policy.py`` forks and seeds it per micro-batch). Under
sharding the ranks decode in step: each forward gathers weights with a collective, so a rank
whose rows have all ended keeps running forwards, drawing nothing, until every rank's have.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_kd.generation.decoding import eval_mode


@torch.no_grad()
def interleaved_sample(
    student: nn.Module,
    teacher: nn.Module,
    left: dict[str, Tensor],
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    stop_ids: Sequence[int],
    pad_token_id: int,
    in_step: bool = False,
) -> tuple[Tensor, Tensor]:
    """The tokens written after the left-padded prompts ``left`` (``[batch, ≤ max_new_tokens]``,
    ``pad_token_id`` after a row's stop token, any of ``stop_ids``) and which of them are the
    student's own (True) rather than the teacher's replacements (False; padding is False too).

    ``in_step`` (sharded models, ``decoding.decodes_in_step``): every rank decodes until all are
    done, each forward being a collective; a rank done early keeps running both models without
    drawing (as ``generate(synced_gpus=True)`` does), so what it writes is what it writes alone.
    """
    ids, mask = left["input_ids"], left["attention_mask"]
    position = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each row counts from 0
    decoders = [Decoder(student), Decoder(teacher)]
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    stops = torch.tensor(list(stop_ids), dtype=torch.long, device=ids.device)
    tokens, own = [], []
    with eval_mode(student):
        for _ in range(max_new_tokens):
            logits = [decoder.next_logits(ids, mask, position) for decoder in decoders]
            if not bool(done.all()):
                token, accepted = vetoed_draw(*logits, temperature, top_k)
                token = token.masked_fill(done, pad_token_id)
                tokens.append(token)
                own.append(accepted & ~done)
                done = done | torch.isin(token, stops)
            if all_done(bool(done.all()), in_step, ids.device):
                break
            ids, position = token[:, None], position[:, -1:] + 1
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(tokens, dim=1), torch.stack(own, dim=1)


def all_done(done: bool, in_step: bool, device: torch.device) -> bool:
    """Whether decoding stops: this rank is ``done``, and with ``in_step`` every rank is (one
    all-reduce of the ranks still writing)."""
    if not in_step:
        return done
    writing = torch.tensor(0 if done else 1, device=device)
    dist.all_reduce(writing)
    return int(writing) == 0


class Decoder:
    """One model decoding token by token with its own KV cache."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.keyword, self.cache = model, cache_keyword(model), None

    def next_logits(self, ids: Tensor, mask: Tensor, position: Tensor) -> Tensor:
        """The next-token logits after ``ids`` (the whole prompts first, then one token a row),
        the cache grown by them."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position,
            use_cache=True,
            **{self.keyword: self.cache},
        )
        self.cache = out[self.keyword]
        return out.logits[:, -1]


def cache_keyword(model: nn.Module) -> str:
    """The name a model's forward takes its KV cache by, and its output returns it by:
    ``cache`` in transformers 5.x, ``past_key_values`` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def vetoed_draw(
    student_logits: Tensor, teacher_logits: Tensor, temperature: float, top_k: int
) -> tuple[Tensor, Tensor]:
    """One token per row: the student's sample where it is in the teacher's ``top_k``, else
    the teacher's sample; and whether it was the student's. Both samples are always drawn, so
    the random stream does not depend on which is kept."""
    proposal = sample(student_logits, temperature)
    replacement = sample(teacher_logits, temperature)
    allowed = teacher_logits.topk(min(top_k, teacher_logits.shape[-1]), dim=-1).indices
    accepted = (allowed == proposal[:, None]).any(dim=-1)
    return torch.where(accepted, proposal, replacement), accepted


def sample(logits: Tensor, temperature: float) -> Tensor:
    """One token per row from ``softmax(logits / temperature)`` (fp32 math)."""
    probabilities = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probabilities, 1).squeeze(-1)
