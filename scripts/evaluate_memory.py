"""Memory and time of ``lightning-kd evaluate``'s scoring: through the model's head a chunk of
positions at a time (what it does), beside the model's own full logits, side by side.

    python scripts/evaluate_memory.py gemma3_270m smollm2 [--documents 6] [--block-size 256]

For each model, each way runs in a child process of its own over the first ``--documents``
documents of the embedded Python reference, batches of 8: the resident memory scoring adds
(``ru_maxrss`` after scoring minus before it: the loaded model and text are not counted), the
seconds it takes and the summed NLL (which the two ways must agree on).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_kd.data.reading import DEFAULT_FILES, read_documents  # noqa: E402
from lightning_kd.evaluation.perplexity import (  # noqa: E402
    batches,
    logits_nll,
    nll_sum,
    windows_of,
)
from lightning_kd.evaluation.saved_models import load_model, load_tokenizer  # noqa: E402


@torch.no_grad()
def full_logits_nll(model, windows, batch_size: int) -> float:
    """The summed NLL from the model's own ``[batch, seq, vocab]`` logits, as evaluate scored."""
    return sum(
        logits_nll(model, {"input_ids": ids, "attention_mask": mask}, labels)
        for ids, mask, labels in batches(windows, batch_size)
    )


def child(model_name: str, way: str, documents: int, block_size: int) -> dict:
    """Score in this process; what it added to the resident memory, its time and NLL."""
    texts = list(read_documents(DEFAULT_FILES[0]))[:documents]
    windows = windows_of(texts, load_tokenizer(model_name), block_size, model_name)
    model = load_model(model_name)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    score = nll_sum if way == "chunked" else full_logits_nll
    nll = score(model, windows, 8)
    seconds = time.perf_counter() - start
    added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {
        "model": model_name,
        "way": way,
        "tokens": windows.tokens,
        "added_mb": added,
        "seconds": seconds,
        "nll": nll,
    }


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("models", nargs="+")
    options.add_argument("--documents", type=int, default=6)
    options.add_argument("--block-size", type=int, default=256)
    options.add_argument("--child", choices=("chunked", "full"), help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.child:
        print(json.dumps(child(args.models[0], args.child, args.documents, args.block_size)))
        return
    print("| model | way | tokens | memory added (MB) | seconds | NLL |")
    print("|---|---|---:|---:|---:|---:|")
    for model in args.models:
        for way in ("full", "chunked"):
            command = [
                sys.executable,
                __file__,
                model,
                "--child",
                way,
                "--documents",
                str(args.documents),
                "--block-size",
                str(args.block_size),
            ]
            found = subprocess.run(command, capture_output=True, text=True, check=True)
            row = json.loads(found.stdout.strip().splitlines()[-1])
            print(
                f"| {model} | {way} | {row['tokens']} | {row['added_mb']:.0f} | "
                f"{row['seconds']:.1f} | {row['nll']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
