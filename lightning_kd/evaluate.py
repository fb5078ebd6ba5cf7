"""Perplexity of saved models on text files: ``python -m lightning_kd.evaluate``.

    python -m lightning_kd.evaluate --files heldout.jsonl -- smollm2 runs/kd/student runs/ce/student
    python -m lightning_kd.evaluate --prompts heldout.jsonl --teacher smollm2 -- runs/kd/student

Each model (a ``save_pretrained`` directory, a Hugging Face id, or ``smollm2`` for the packaged
teacher) scores the same text: the files are read as ``data.files`` reads them, tokenized with the
first model's tokenizer, joined with EOS and cut into ``--block-size`` blocks (the training
layout), and every block position that predicts a next token counts once. Prints a markdown table
and, with ``--out``, writes it as JSON. Use it for text the run never trained on — another domain,
to see how much of the teacher's language the student carries.

``--prompts`` judges answers instead: each model's greedy completions of chat prompts, scored by
``--teacher`` (its NLL of them, ROUGE-L to its own, the model's perplexity on its own;
``lightning_kd/prompt_eval.py``).
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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--files", nargs="+", help="text as data.files takes it: perplexity")
    source.add_argument(
        "--prompts", type=Path, help="prompt rows: answers judged by --teacher (prompt_eval.py)"
    )
    parser.add_argument("--teacher", help="with --prompts: the judge (a directory, or smollm2)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--samples", type=int, help="with --prompts: also K sampled completions per prompt"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="with --samples")
    parser.add_argument("--seed", type=int, default=0, help="with --samples")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.prompts is not None:
        return main_prompts(args, parser)
    if args.samples is not None:
        parser.error("--samples samples answers to --prompts: it has no meaning with --files")
    tokenizer = AutoTokenizer.from_pretrained(model_location(args.models[0]))
    blocks = blocks_of(args.files, tokenizer, args.block_size, args.text_field)
    rows = []
    for name in args.models:
        model = load_model(name, tokenizer)
        ppl, tokens = perplexity(model, blocks, args.batch_size)
        rows.append({"model": name, "perplexity": ppl, "tokens": tokens})
        print(f"{name}: perplexity {ppl:.2f} over {tokens} tokens", flush=True)
    print("\n| model | perplexity |\n|---|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['perplexity']:.2f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"files": args.files, "rows": rows}, indent=2))
    return rows


def load_model(name: str, tokenizer=None, reference: str = "the first model"):
    """``name``'s causal LM in fp32, eval mode; refused if its tokenizer is not ``tokenizer``
    (``reference``'s, named in the refusal)."""
    location = model_location(name)
    if tokenizer is not None:
        other = AutoTokenizer.from_pretrained(location)
        if other.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"{name} has another tokenizer than {reference}: not comparable")
    return AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32).eval()


def main_prompts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[dict]:
    """``--prompts``: each model's greedy answers judged by ``--teacher`` (prompt_eval.py)."""
    from lightning_kd.prompt_eval import Sampling, evaluate_prompts, markdown, read_prompt_file

    if args.teacher is None:
        parser.error("--prompts needs --teacher: the model that judges the answers (smollm2)")
    sampling = None
    if args.samples is not None:
        sampling = Sampling(args.samples, args.temperature, args.seed)
    prompts = read_prompt_file(args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(model_location(args.teacher))
    if tokenizer.chat_template is None:
        raise ValueError(f"--teacher {args.teacher}'s tokenizer has no chat template")
    teacher = load_model(args.teacher)
    judge = f"the teacher ({args.teacher})"
    models = {name: load_model(name, tokenizer, judge) for name in args.models}
    rows = evaluate_prompts(
        models, teacher, tokenizer, prompts, args.max_new_tokens, args.batch_size, sampling
    )
    print("\n" + markdown(rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"prompts": str(args.prompts), "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
