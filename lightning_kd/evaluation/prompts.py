"""Answers to held-out prompts, judged by the teacher: ``evaluate --prompts``.

    lightning-kd evaluate --prompts prompts.jsonl --teacher smollm2 -- runs/kd/student

Every model (and the teacher) answers each prompt greedily — rendered with the teacher's chat
template and the generation prompt, up to ``--max-new-tokens`` tokens, stopped after its end
token — and is scored on:

- ``teacher_nll``: the teacher's negative log-likelihood per token of the model's *own* completion
  (token-weighted over all prompts; lower is better): how likely the teacher finds what the model
  says, the quantity on-policy KD minimises;
- ``rouge_l``: ROUGE-L F1 of the completion against the teacher's greedy completion of the same
  prompt (torchmetrics, the mean over prompts);
- ``ppl_on_teacher``: the model's perplexity on the teacher's greedy completions (their tokens, as
  generated): how well it predicts what the teacher says;
- ``repeated`` (the share of a completion's token 4-grams that repeat an earlier one, the mean
  over prompts), ``tokens`` (mean completion length) and ``ended`` (the share that end with the
  end token before the cap). Read the teacher NLL with them: a loop ("jazz, jazz, jazz, ...") is
  text a teacher predicts well once it has started, so a model that loops scores a low NLL;
- ``fresh_nll`` and ``fresh_tokens``: the teacher NLL per token of each completion's *fresh
  prefix* — up to the first token that completes a repeated 4-gram, the text before the model
  starts repeating itself — and that prefix's mean length: the loop-robust reading.

With ``--samples K`` every model (the teacher too) also *samples* K completions of each prompt at
``--temperature`` (seeded by ``--seed``, the same random stream for every model), and the
``sampled_*`` columns score them as above: ``sampled_nll`` is then a Monte-Carlo estimate of the
cross-entropy of the model's own answer distribution under the teacher — on-policy KD's quantity
without greedy decoding's loops, which dominate the greedy columns of a small model.

Prompt rows are read as ``lightning-kd generate`` reads them (a trailing answer is
dropped), so the ``completions.jsonl`` of ``generate.prompts=val_split`` is the held-out set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.text.rouge import ROUGEScore
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.chat_tokens import prompt_ids
from lightning_kd.generation.decoding import (
    completions_batch,
    generate_in_eval,
    left_padded,
    stop_and_pad,
    text_stop,
    until_stop,
)
from lightning_kd.losses.logits import scored_next_token


@dataclass(frozen=True)
class Answers:
    """One model's greedy completions of the prompts: token ids (end token kept) and text."""

    tokens: list[Tensor]
    texts: list[str]
    ends: list[bool]
    """Whether each completion ended (a stop token, or a template's end of answer in text)."""

    @property
    def mean_tokens(self) -> float:
        return sum(len(t) for t in self.tokens) / len(self.tokens)

    @property
    def repeated(self) -> float:
        """The mean over completions of the share of 4-grams that repeat an earlier one."""
        return sum(repeated_ngrams(t.tolist()) for t in self.tokens) / len(self.tokens)

    @property
    def ended(self) -> float:
        """The share of completions that ended before the token limit."""
        return sum(self.ends) / len(self.ends)


def repeated_ngrams(tokens: list[int], n: int = 4) -> float:
    """The share of ``tokens``' n-grams that occurred earlier in it (0 with no n-gram)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def fresh_prefix(tokens: Tensor, n: int = 4) -> Tensor:
    """The longest prefix of ``tokens`` in which no n-gram occurs twice."""
    seen: set[tuple[int, ...]] = set()
    values = tokens.tolist()
    for start in range(len(values) - n + 1):
        gram = tuple(values[start : start + n])
        if gram in seen:
            return tokens[: start + n - 1]
        seen.add(gram)
    return tokens


@dataclass(frozen=True)
class Sampling:
    """``--samples``: K sampled completions per prompt at a temperature, from one seed."""

    samples: int
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"--samples {self.samples}: give at least 1 (or leave it out)")
        if not self.temperature > 0:
            raise ValueError(f"--temperature {self.temperature}: give a positive temperature")

    def options(self) -> dict:
        return {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}


def greedy_answers(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Tensor],
    max_new_tokens: int,
    batch_size: int,
    sampling: Sampling | None = None,
) -> Answers:
    """``model``'s greedy completions of ``prompts`` (left-padded batches, the KV cache), or with
    ``sampling`` its sampled ones (``prompts`` given once per sample)."""
    stops, pad = stop_and_pad(model, "--prompts", tokenizer)  # the answer's end of turn too
    in_text = text_stop(tokenizer)  # plain's: the newline before its next "User:"
    device = next(model.parameters()).device
    options = {"do_sample": False} if sampling is None else sampling.options()
    options |= in_text.options() if in_text is not None else {}
    if sampling is not None:
        torch.manual_seed(sampling.seed)  # every model draws from the same random stream
    tokens: list[Tensor] = []
    ends: list[bool] = []
    for start in range(0, len(prompts), batch_size):
        left = left_padded(prompts[start : start + batch_size], pad, device)
        new = generate_in_eval(
            model,
            left,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(stops) or None,
            pad_token_id=pad,
            **options,
        )
        for row in new:
            answer = until_stop(row, stops)
            ended = len(answer) > 0 and int(answer[-1]) in stops
            if in_text is not None and len(cut := in_text.cut(answer)) < len(answer):
                answer, ended = cut, True
            tokens.append(answer.cpu())
            ends.append(ended)
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
    return Answers(tokens, texts, ends)


@torch.no_grad()
def completion_nll(
    model: nn.Module, prompts: list[Tensor], completions: list[Tensor], batch_size: int
) -> tuple[float, int]:
    """``model``'s summed negative log-likelihood of ``completions`` after their ``prompts``
    (completion tokens only), and the number of those tokens."""
    _, pad = stop_and_pad(model, "--prompts")
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(prompts), batch_size):
        batch = completions_batch(
            prompts[start : start + batch_size], completions[start : start + batch_size], pad
        )
        batch = {key: value.to(device) for key, value in batch.items()}
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits
        logits, targets = scored_next_token(logits, batch["labels"])
        wide = torch.promote_types(logits.dtype, torch.float32)  # bf16 up, fp64 kept
        total += F.cross_entropy(logits.to(wide), targets, reduction="sum").item()
        count += targets.numel()
    return total, count


def rouge_l(predictions: list[str], references: list[str]) -> list[float]:
    """ROUGE-L F1 of each prediction against its reference."""
    score = ROUGEScore(rouge_keys=("rougeL",))
    return [
        float(score(p, r)["rougeL_fmeasure"]) for p, r in zip(predictions, references, strict=True)
    ]


def judged(
    answers: Answers,
    model: nn.Module,
    teacher: nn.Module,
    prompts: list[Tensor],
    reference: Answers,
    batch_size: int,
) -> dict:
    """The scores of one model's ``answers`` (see the module doc), and the answers."""
    nll, count = completion_nll(teacher, prompts, answers.tokens, batch_size)
    if model is teacher and answers is reference:  # the teacher's row: the same sum, once
        own, own_count = nll, count
    else:
        own, own_count = completion_nll(model, prompts, reference.tokens, batch_size)
    rouge = rouge_l(answers.texts, reference.texts)
    fresh = [fresh_prefix(tokens) for tokens in answers.tokens]
    fresh_nll, fresh_count = completion_nll(teacher, prompts, fresh, batch_size)
    return {
        "teacher_nll": nll / count,
        "fresh_nll": fresh_nll / max(fresh_count, 1),
        "fresh_tokens": fresh_count / len(fresh),
        "rouge_l": sum(rouge) / len(rouge),
        "ppl_on_teacher": math.exp(own / own_count),
        "repeated": answers.repeated,
        "tokens": answers.mean_tokens,
        "ended": answers.ended,
        "completions": answers.texts,
    }


def sampled(
    model: nn.Module,
    teacher: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Tensor],
    max_new_tokens: int,
    batch_size: int,
    sampling: Sampling,
) -> dict:
    """The ``sampled_*`` scores: ``model``'s sampled completions judged by ``teacher``."""
    repeated = [ids for ids in prompts for _ in range(sampling.samples)]
    answers = greedy_answers(model, tokenizer, repeated, max_new_tokens, batch_size, sampling)
    nll, count = completion_nll(teacher, repeated, answers.tokens, batch_size)
    fresh = [fresh_prefix(tokens) for tokens in answers.tokens]
    fresh_nll, fresh_count = completion_nll(teacher, repeated, fresh, batch_size)
    return {
        "sampled_nll": nll / count,
        "sampled_fresh_nll": fresh_nll / max(fresh_count, 1),
        "sampled_fresh_tokens": fresh_count / len(fresh),
        "sampled_repeated": answers.repeated,
        "sampled_tokens": answers.mean_tokens,
        "sampled_ended": answers.ended,
        "sampled_completions": answers.texts,
    }


def evaluate_prompts(
    models: dict[str, nn.Module],
    teacher: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    sampling: Sampling | None = None,
) -> list[dict]:
    """A row of scores for the teacher and for each of ``models`` on the same ``prompts``."""
    ids = prompt_ids(tokenizer, prompts)
    reference = greedy_answers(teacher, tokenizer, ids, max_new_tokens, batch_size)
    rows = []
    for name, model in {"teacher": teacher, **models}.items():
        answers = reference
        if model is not teacher:
            answers = greedy_answers(model, tokenizer, ids, max_new_tokens, batch_size)
        rows.append({"model": name} | judged(answers, model, teacher, ids, reference, batch_size))
        if sampling is not None:
            rows[-1] |= sampled(
                model, teacher, tokenizer, ids, max_new_tokens, batch_size, sampling
            )
        print(f"{name}: teacher NLL {rows[-1]['teacher_nll']:.3f}", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| model | teacher NLL of its completions | of their fresh prefixes | fresh tokens | "
        "ROUGE-L to teacher | ppl on teacher's completions | repeated 4-grams | tokens | ended |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['model']} | {r['teacher_nll']:.3f} | {r['fresh_nll']:.3f} | "
        f"{r['fresh_tokens']:.1f} | {r['rouge_l']:.3f} | {r['ppl_on_teacher']:.2f} | "
        f"{r['repeated']:.2f} | {r['tokens']:.1f} | {r['ended']:.2f} |"
        for r in rows
    ]
    if "sampled_nll" in rows[0]:
        lines += [
            "",
            "| model | teacher NLL of its sampled completions | of their fresh prefixes | "
            "fresh tokens | repeated 4-grams | tokens | ended |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['model']} | {r['sampled_nll']:.3f} | {r['sampled_fresh_nll']:.3f} | "
            f"{r['sampled_fresh_tokens']:.1f} | {r['sampled_repeated']:.2f} | "
            f"{r['sampled_tokens']:.1f} | {r['sampled_ended']:.2f} |"
            for r in rows
        ]
    return "\n".join(lines)
