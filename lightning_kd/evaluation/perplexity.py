"""Perplexity of saved models on text files (the library half of ``lightning-kd evaluate``).

    lightning-kd evaluate --files heldout.jsonl -- smollm2 runs/kd/student runs/ce/student
    lightning-kd evaluate --prompts heldout.jsonl --teacher smollm2 -- runs/kd/student

Each model (a ``save_pretrained`` directory, a Hugging Face id, or ``smollm2`` for the packaged
teacher) scores the same text: the files are read as ``data.files`` reads them, tokenized with the
first model's tokenizer, joined with EOS and cut into ``--block-size`` blocks (the training
layout), and every block position that predicts a next token counts once. Prints a markdown table
and, with ``--out``, writes it as JSON. Use it for text the run never trained on — another domain,
to see how much of the teacher's language the student carries.

``--prompts`` judges answers instead: each model's greedy completions of chat prompts, scored by
``--teacher`` (its NLL of them, ROUGE-L to its own, the model's perplexity on its own;
``evaluation/judge.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lightning_kd.data.reading import expand_files, read_documents
from lightning_kd.data.text import pack_blocks, separator_id
from lightning_kd.evaluation.saved_models import load_model, load_tokenizer
from lightning_kd.losses.logits import scored_next_token


def blocks_of(files: list[str], tokenizer, block_size: int, text_field: str) -> torch.Tensor:
    """``[n, block_size]`` token blocks of every document in ``files``, joined with EOS."""
    documents = [
        text
        for path in expand_files(files)
        for text in read_documents(path, text_field)
        if text.strip()
    ]
    tokens = tokenizer(documents, add_special_tokens=False)["input_ids"]
    blocks = pack_blocks(tokens, block_size, separator_id(tokenizer))
    if len(blocks) == 0:
        raise ValueError(f"{files} hold fewer than {block_size} tokens: nothing to score")
    return blocks


@torch.no_grad()
def perplexity(model, blocks: torch.Tensor, batch_size: int) -> tuple[float, int]:
    """Token-mean next-token perplexity of ``model`` over ``blocks``, and the token count."""
    nll, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        ids = blocks[start : start + batch_size]
        logits, targets = scored_next_token(model(input_ids=ids, use_cache=False).logits, ids)
        nll += F.cross_entropy(logits.float(), targets, reduction="sum").item()
        count += targets.numel()
    return math.exp(nll / count), count


def score_files(
    models: list[str], files: list[str], block_size: int, batch_size: int, text_field: str
) -> list[dict]:
    """Each model's perplexity over the same blocks of ``files`` (tokenized with the first
    model's tokenizer; another tokenizer is refused)."""
    tokenizer = load_tokenizer(models[0])
    blocks = blocks_of(files, tokenizer, block_size, text_field)
    rows = []
    for name in models:
        model = load_model(name, tokenizer)
        ppl, tokens = perplexity(model, blocks, batch_size)
        rows.append({"model": name, "perplexity": ppl, "tokens": tokens})
        print(f"{name}: perplexity {ppl:.2f} over {tokens} tokens", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    """The perplexity rows as a markdown table."""
    lines = ["| model | perplexity |", "|---|---:|"]
    return "\n".join(lines + [f"| {row['model']} | {row['perplexity']:.2f} |" for row in rows])
