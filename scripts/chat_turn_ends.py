"""What a teacher with another tokenizer loses on chat data where the student's EOS ends turns.

SmolLM2's chat template ends each turn with its EOS (``<|im_end|>``). The cross-tokenizer view
(``data/alignment.py``) cuts the student's rows at the EOS, so the teacher reads each turn end as
a document end: its own EOS, then its BOS before the next turn. This scores the teacher's bits per
byte of the assistant answers two ways — that view, and the same rendered conversation read as
one text (the markers spelled out) — over the first ``--count`` conversations of the embedded
``smollm2_generated`` corpus:

    python scripts/chat_turn_ends.py --count 64
"""

from __future__ import annotations

import argparse
import gzip
import json
import math

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.data.alignment import Aligner
from lightning_kd.data.chat_tokens import encode_chat
from lightning_kd.data.reading import TEACHER_CORPUS
from lightning_kd.models.sources import teacher_dir


@torch.no_grad()
def nll(model, ids: torch.Tensor, scored: torch.Tensor) -> float:
    """The summed NLL (nats) of the tokens ``ids[1:]`` whose predicting position is scored."""
    logits = model(ids[None]).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]
    return -float((picked * scored[: len(picked)]).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=64)
    args = parser.parse_args()
    student = AutoTokenizer.from_pretrained(teacher_dir("smollm2"))
    gemma = teacher_dir("gemma3_270m")
    tokenizer = AutoTokenizer.from_pretrained(gemma)
    model = AutoModelForCausalLM.from_pretrained(gemma, dtype=torch.float32).eval()
    aligner = Aligner(student, tokenizer)
    with gzip.open(TEACHER_CORPUS, "rt") as handle:
        rows = [json.loads(line) for line in handle][: args.count]
    cut = whole = answer_bytes = 0.0
    for row in rows:
        turns = [{"role": "user", "content": row["prompt"]}]
        turns.append({"role": "assistant", "content": row["text"]})
        example = encode_chat(student, turns, "row")
        view = aligner.view(example.tokens[None], None, example.labels[None])
        # The view: positions predicting an answer token (text, not the turn's end).
        cut += nll(model, view.input_ids[0], (view.scored[0] & (view.target_bytes[0] > 0)).float())
        # One text: the rendered conversation tokenised whole, the answer's tokens scored.
        text = student.decode(example.tokens)
        start = text.rindex(row["text"])
        encoded = tokenizer(text, return_offsets_mapping=True)
        ids = torch.tensor(encoded["input_ids"])
        inside = [start <= a < start + len(row["text"]) for a, _ in encoded["offset_mapping"]]
        whole += nll(model, ids, torch.tensor(inside[1:], dtype=torch.float32))
        answer_bytes += len(row["text"].encode())
    bits = 1 / math.log(2) / answer_bytes
    print(f"{len(rows)} conversations, {answer_bytes:.0f} answer bytes")
    print(f"teacher bits per answer byte, turn ends as document ends: {cut * bits:.4f}")
    print(f"teacher bits per answer byte, the conversation as one text: {whole * bits:.4f}")


if __name__ == "__main__":
    main()
