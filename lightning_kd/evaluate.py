"""Perplexity of saved models on text files: ``python -m lightning_kd.evaluate``.

    python -m lightning_kd.evaluate --files heldout.jsonl -- smollm2 runs/kd/student runs/ce/student

Each model (a ``save_pretrained`` directory, a Hugging Face id, or ``smollm2`` for the packaged
teacher) scores the same text: the files are read as ``data.files`` reads them, tokenized with the
first model's tokenizer, joined with EOS and cut into ``--block-size`` blocks (the training
layout), and every block position that predicts a next token counts once. Prints a markdown table
and, with ``--out``, writes it as JSON. Use it for text the run never trained on — another domain,
to see how much of the teacher's language the student carries.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.data import expand_files, pack_blocks, read_documents, separator_id
from lightning_kd.losses.logits import scored_next_token
from lightning_kd.sources import teacher_dir


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


def model_location(name: str) -> str:
    """``from_pretrained``'s argument for ``name`` (packaged models converted once)."""
    return teacher_dir(name) if not Path(name).is_dir() else name


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m lightning_kd.evaluate", description=__doc__)
    parser.add_argument("models", nargs="+", help="model directories, HF ids or smollm2")
    parser.add_argument("--files", nargs="+", required=True, help="text as data.files takes it")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    locations = [model_location(name) for name in args.models]
    tokenizer = AutoTokenizer.from_pretrained(locations[0])
    blocks = blocks_of(args.files, tokenizer, args.block_size, args.text_field)
    rows = []
    for name, location in zip(args.models, locations, strict=True):
        other = AutoTokenizer.from_pretrained(location)
        if other.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"{name} has another tokenizer than {args.models[0]}: not comparable")
        model = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32).eval()
        ppl, tokens = perplexity(model, blocks, args.batch_size)
        rows.append({"model": name, "perplexity": ppl, "tokens": tokens})
        print(f"{name}: perplexity {ppl:.2f} over {tokens} tokens", flush=True)
    print("\n| model | perplexity |\n|---|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['perplexity']:.2f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"files": args.files, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
