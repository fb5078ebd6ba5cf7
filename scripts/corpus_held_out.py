"""The default corpus's held-out text as ``.jsonl`` documents, by source, for ``evaluate --files``.

    python scripts/corpus_held_out.py --split dev --out /tmp/dev   # /tmp/dev_python.jsonl, _smollm2
    python scripts/corpus_held_out.py --split val --out /tmp/val
    lightning-kd evaluate --files /tmp/dev_python.jsonl -- runs/ce/student runs/kd/student

``val``: the blocks of the default run's validation split. ``dev``: training-split blocks the
default run never reads (it keeps the first ``data.max_train_examples`` = 180 blocks of its
split; a run reading more trains on them, so they are a dev split for the default budget only).
Each block is cut at its document separators and every piece spelled back as text (pieces under
40 characters dropped) and filed by the corpus file it comes from: the Python reference or
SmolLM2's answers. The results page chooses settings on ``dev`` and reports on ``val``.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from lightning_kd.data.reading import EMBEDDED
from lightning_kd.data.text import TextDataModule
from lightning_kd.models.loading import TeacherSpec, load_tokenizer

SOURCES = {"python": "python_reference", "smollm2": "smollm2_generated"}
DEFAULT_BUDGET = 180  # blocks: the default data.max_train_examples on the default corpus


def source_texts() -> dict[str, str]:
    """Each source's whole text, to find a piece in."""
    found = {}
    for source, stem in SOURCES.items():
        with gzip.open(EMBEDDED[stem], "rt", encoding="utf-8") as handle:
            found[source] = "\n".join(json.loads(line)["text"] for line in handle)
    return found


def held_out_blocks(tokenizer, split: str, count: int) -> list[list[int]]:
    """The validation blocks, or the first ``count`` training blocks the default run skips."""
    full = TextDataModule(tokenizer, max_train_examples=None)
    full.setup("fit")
    if split == "val":
        return [block.tolist() for block in full.val_examples]
    read = TextDataModule(tokenizer, max_train_examples=DEFAULT_BUDGET)
    read.setup("fit")
    seen = {tuple(block.tolist()) for block in read.train_examples}
    unread = [block.tolist() for block in full.train_examples]
    return [block for block in unread if tuple(block) not in seen][:count]


def pieces(block: list[int], separator: int, tokenizer) -> list[str]:
    """The texts of ``block``'s documents (cut at ``separator``), 40 characters or more."""
    texts, piece = [], []
    for token in [*block, separator]:
        if token != separator:
            piece.append(token)
            continue
        text = tokenizer.decode(piece).strip()
        piece = []
        if len(text) >= 40:
            texts.append(text)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("val", "dev"), required=True)
    parser.add_argument("--out", required=True, help="prefix: writes PREFIX_<source>.jsonl")
    parser.add_argument("--blocks", type=int, default=160, help="dev: this many blocks")
    args = parser.parse_args()
    tokenizer = load_tokenizer(TeacherSpec())  # the default run's: SmolLM2's
    texts = source_texts()
    by_source: dict[str, list[str]] = {source: [] for source in SOURCES}
    for block in held_out_blocks(tokenizer, args.split, args.blocks):
        for text in pieces(block, tokenizer.eos_token_id, tokenizer):
            probe = text[5:65]  # past a first token a cut may have split
            source = next((s for s, whole in texts.items() if probe in whole), None)
            if source is None:
                raise SystemExit(f"a piece in no source file: {text[:60]!r}")
            by_source[source].append(text)
    for source, documents in by_source.items():
        out = Path(f"{args.out}_{source}.jsonl")
        with open(out, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"text": text}) + "\n" for text in documents)
        size = sum(len(text.encode()) for text in documents)
        print(f"{out}: {len(documents)} documents, {size:,} bytes")


if __name__ == "__main__":
    main()
