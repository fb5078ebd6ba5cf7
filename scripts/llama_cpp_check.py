"""llama.cpp reads a GGUF export as the Hugging Face model it came from.

    python scripts/llama_cpp_check.py STUDENT_DIR TEXT_FILE GGUF [GGUF ...] [--tokens 1024]

Needs ``llama-cpp-python`` (``pip install llama-cpp-python``: it compiles llama.cpp). For each
GGUF (``lightning-kd export STUDENT_DIR --gguf f16``), llama.cpp tokenizes the text's start and
scores the Hugging Face tokenizer's ids for it; the table gives how many of llama.cpp's tokens
equal the Hugging Face ones and the perplexity of each against the Hugging Face student's (fp32).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np


def hf_side(student: Path, text: str, tokens: int) -> tuple[list[int], float]:
    """The Hugging Face tokenizer's first ``tokens`` ids of ``text``, and the student's
    perplexity on them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(student)
    model = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).eval()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item()
    return ids, math.exp(nll)


def llama_side(gguf: Path, text: str, ids: list[int]) -> tuple[int, float]:
    """How many of llama.cpp's own tokens of ``text`` equal ``ids``, and its perplexity on
    ``ids``."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=len(ids) + 8, logits_all=True, verbose=False)
    own = llm.tokenize(text.encode(), add_bos=False, special=False)[: len(ids)]
    llm.reset()
    llm.eval(ids)
    scores = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    top = scores.max(1, keepdims=True)
    log_z = np.log(np.exp(scores - top).sum(1)) + top[:, 0]
    nll = float(np.mean(log_z[:-1] - scores[np.arange(len(ids) - 1), ids[1:]]))
    return sum(a == b for a, b in zip(own, ids, strict=False)), math.exp(nll)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student", type=Path)
    parser.add_argument("text", type=Path)
    parser.add_argument("ggufs", type=Path, nargs="+")
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    text = args.text.read_text()
    ids, reference = hf_side(args.student, text, args.tokens)
    print("| model | tokens equal | perplexity | against the HF export |\n|---|---:|---:|---:|")
    print(f"| {args.student} (transformers) | — | {reference:.3f} | — |")
    for gguf in args.ggufs:
        same, ppl = llama_side(gguf, text, ids)
        change = 100 * (ppl / reference - 1)
        print(f"| {gguf} (llama.cpp) | {same}/{len(ids)} | {ppl:.3f} | {change:+.3f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
