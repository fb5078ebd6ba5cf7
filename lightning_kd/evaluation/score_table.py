"""Which rows of ``lightning-kd evaluate --files`` compare, and the table that says so: a
perplexity compares only models whose tokenizers read the text alike; bits per byte compare
every row but those whose tokenizer rewrites the text."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REWRITES = (
    "its tokenizer spells {} of the {} documents back as other text (it normalises or "
    "lower-cases them, or reads characters as <unk>): its bits per byte are of that text, and "
    "compare with no other row"
)


def tokenizer_names(
    models: list[str], tokenizers: dict[str, PreTrainedTokenizerBase], ids: dict[str, list]
) -> list[str]:
    """For each model, the first model listed whose tokenizer is the same here: the same
    vocabulary, and the same ``ids`` for every document (a tokenizer that normalises or splits
    the text otherwise was called the same for its vocabulary alone): the rows whose
    perplexities compare."""
    seen: list[tuple[str, dict, list]] = []
    names = []
    for name in models:
        vocab = tokenizers[name].get_vocab()
        same = next((first for first, v, i in seen if alike(v, vocab) and i == ids[name]), None)
        if same is None:
            seen.append((name, vocab, ids[name]))
        names.append(same or name)
    return names


def alike(one: dict[str, int], other: dict[str, int]) -> bool:
    """Whether two vocabularies map the same tokens to the same ids, but for tokens added past
    the end of the smaller (transformers' GGUF reader adds ``<|endoftext|>`` to a byte-level
    vocabulary that has none: an export read back is its source's tokenizer)."""
    size = min(len(one), len(other))
    kept = [{token: i for token, i in vocab.items() if i < size} for vocab in (one, other)]
    return kept[0] == kept[1]


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table, with a note on which columns compare which rows."""
    lines = [
        "| model | perplexity | bits per byte | tokenizer | tokens | bytes |",
        "|---|---:|---:|---|---:|---:|",
    ]
    lines += [
        f"| {row['model']} | {row['perplexity']:.2f} | {row['bits_per_byte']:.4f}"
        f"{' †' if row.get('rewritten_documents') else ''} | "
        f"{row['tokenizer']} | {row['tokens']} | {row['bytes']} |"
        for row in rows
    ]
    note = (
        "\nPerplexity is per token of a model's tokenizer: it compares only rows of the same "
        "`tokenizer`. Bits per byte compares every row"
    )
    if any(row.get("rewritten_documents") for row in rows):
        note += " but those marked †, whose tokenizer rewrites the text (see above)."
    else:
        note += "."
    return "\n".join(lines) + "\n" + note
