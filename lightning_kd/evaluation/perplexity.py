"""Perplexity and bits per byte of saved models on text files (the library half of
``lightning-kd evaluate --files``).

    lightning-kd evaluate --files heldout.jsonl -- smollm2 runs/kd/student runs/ce/student
    lightning-kd evaluate --prompts prompts.jsonl --teacher smollm2 -- runs/kd/student

Each model (a ``save_pretrained`` directory, a Hugging Face id, or ``smollm2`` for the packaged
teacher) reads the same documents (as ``data.files`` reads them) through its own tokenizer, the
one saved with it, so models with different tokenizers can be compared. Two figures per model:

- **perplexity**: exp of the mean NLL per scored token. A token is its tokenizer's own unit, so
  perplexities compare only models that share a tokenizer: the ``tokenizer`` column names, for
  each model, the first model listed whose tokenizer is the same.
- **bits per byte**: Σ NLL (nats) / (ln 2 · B), B the UTF-8 bytes the scored tokens spell
  (``data.token_bytes``: each id's exact bytes). Text is text whatever the tokenizer, so it
  compares every row.

The layout: each document is scored on its own, as ``[start] + its tokens + [EOS]``. ``start`` is
the BOS the tokenizer puts before a text by itself (Gemma's; a model trained with it is lost
without it), or else the EOS, the boundary that precedes every document in a packed training
stream. A document longer than ``--block-size`` is cut into windows of ``--block-size`` tokens
that overlap by one: each window's first token is context only, the last target of the window
before, so every token after ``start`` is scored exactly once. Windows are batched by length,
padded on the right (padding is masked and never scored).

What counts: every token of every document and its closing EOS, each once (a row marked
``"finished": false``, a continuation ``generate`` cut at its budget, has no EOS: it did not end
there, as training leaves out the separator after one). An EOS target adds
its NLL and 0 bytes (the end of a document is information: a model must predict it, and it spells
no text); ``start`` is context, never a target. So B is exactly the documents' UTF-8 bytes for any
tokenizer whose pieces spell its input back (byte-level BPE, Gemma's SentencePiece; one that adds
a ``▁`` before each text counts that space too), and two tokenizers' bits per byte are means over
the same text. That is why documents, not the training layout's packed blocks: a block's first
token is context only and the tail shorter than a block is dropped, at places that depend on the
tokenizer, so two tokenizers would score different spans of the text (of the 4,590 bytes of
``kd_heldout_prose``, blocks of 256 score 3,560 through SmolLM2's tokenizer, 3,643 through
Gemma 3's). The price is that a document's first tokens have only ``start`` as context, not the
documents before it: perplexities here read a little higher than a run's ``val/ppl`` on the same
text (``val/bpb`` counts bytes by the same rule).

``--prompts`` judges answers instead: each model's greedy completions of chat prompts, scored by
``--teacher`` (its NLL of them, ROUGE-L to its own, the model's perplexity on its own;
``evaluation/judge.py``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.encoding import text_ids
from lightning_kd.data.reading import cut_texts, expand_files, read_documents
from lightning_kd.data.token_bytes import TokenBytes, decoder_kind, token_bytes
from lightning_kd.evaluation.saved_models import load_model, load_tokenizer
from lightning_kd.evaluation.score_table import REWRITES, tokenizer_names
from lightning_kd.losses.chunked import OutputHead, auto_chunk_size, matmul_dtype
from lightning_kd.losses.logits import IGNORE_INDEX, scored_next_token
from lightning_kd.models.heads import check_head, final_hidden, output_head
from lightning_kd.utils.refusal import Refused


class CutText(str):
    """A document from a row marked ``"finished": false`` (``generate``'s continuation cut at
    its token budget): it did not end there, so its closing EOS is no target."""


def documents_of(files: list[str], text_field: str) -> list[str]:
    """Every distinct non-blank document in ``files``, read as ``data.files`` reads them (a
    repeat kept once, with a warning: it was scored twice; a cut row's a :class:`CutText`);
    files of no text are refused."""
    paths = expand_files(files, key="--files")
    cut = cut_texts(paths, text_field)
    documents = [
        CutText(text) if text in cut else text
        for path in paths
        for text in read_documents(path, text_field, key="--text-field")
        if text.strip()
    ]
    if not documents:
        raise ValueError(f"--files {files} hold no text: nothing to score")
    distinct = list(dict.fromkeys(documents))
    if len(distinct) < len(documents):
        warnings.warn(
            f"--files: {len(documents) - len(distinct)} of {len(documents)} documents repeat "
            "another (identical text): each is scored once",
            stacklevel=2,
        )
    return distinct


@dataclass(frozen=True)
class Windows:
    """One tokenizer's rows of the documents (each at most ``--block-size`` long) and what their
    scored targets spell."""

    ids: list[list[int]]
    labels: list[list[int]]
    """The ids again, ``IGNORE_INDEX`` where a position is no target (context, padding)."""
    start: tuple[int, ...]
    """The ids each document starts from (its tokenizer's BOS, else its EOS)."""
    text_bytes: int
    """The UTF-8 bytes the scored targets spell (EOS targets: 0)."""
    rewritten: int = 0
    """Documents whose tokens spell other text than theirs (a tokenizer that normalises,
    lower-cases, or reads a character as ``<unk>``): their bits per byte are of that text."""

    @property
    def tokens(self) -> int:
        """How many targets are scored."""
        return sum(label != IGNORE_INDEX for row in self.labels for label in row[1:])


def start_ids(table: TokenBytes, name: str) -> tuple[int, ...]:
    """What each document starts from: the BOS the tokenizer adds by itself, else its EOS."""
    if not table.prefix and table.end is None:
        raise Refused(
            f"{name}'s tokenizer adds no BOS and has no EOS: a document has no boundary to start "
            "from. Save a tokenizer with an eos_token beside the model"
        )
    return table.prefix or (table.end,)


def document_windows(
    ids: list[int], context: int, block_size: int
) -> Iterator[tuple[list[int], list[int]]]:
    """``ids`` cut into windows of at most ``block_size`` that overlap by one token, each with
    its labels (``IGNORE_INDEX`` where a position is no target there): every position from
    ``context`` on is a target exactly once."""
    for start in range(0, len(ids) - 1, block_size - 1):
        window = ids[start : start + block_size]
        first = min(max(context - start, 1), len(window))  # before it: context, or scored before
        yield window, [IGNORE_INDEX] * first + window[first:]


def windows_of(
    documents: list[str], tokenizer: PreTrainedTokenizerBase, block_size: int, name: str
) -> Windows:
    """Each document as ``[start] + tokens + [EOS]`` in ``tokenizer``'s ids, cut into overlapping
    windows (:func:`document_windows`), sorted by length so that batches pad little."""
    if not getattr(tokenizer, "is_fast", False):
        raise Refused(
            f"{name}'s tokenizer ({type(tokenizer).__name__}) is a slow (Python) tokenizer: bits "
            "per byte reads each token's bytes from a fast tokenizer's vocabulary. Save a fast "
            "one beside the model (AutoTokenizer.from_pretrained(path, use_fast=True)"
            ".save_pretrained(path); it needs the tokenizers package)"
        )
    if decoder_kind(tokenizer) == "wordpiece":  # the distillation's refusal spoke of a pair
        raise Refused(
            f"{name}'s tokenizer is WordPiece (BERT-style), an encoder's: its tokens do not spell "
            "the text's bytes, so no bits per byte can be counted, and an encoder reads ahead, "
            "so it has no next-token perplexity; evaluate scores causal language models"
        )
    table = token_bytes(tokenizer)
    start, end, lengths = start_ids(table, name), table.end, table.lengths()
    rows: list[tuple[list[int], list[int]]] = []
    rewritten = 0
    for document, tokens in zip(documents, text_ids(tokenizer, documents), strict=True):
        ending = [] if isinstance(document, CutText) else [end]  # cut by a budget: no end
        rows += document_windows([*start, *tokens, *ending], len(start), block_size)
        rewritten += not spells(table, document, tokens)
    rows.sort(key=lambda row: len(row[0]))
    targets = torch.tensor([t for _, labels in rows for t in labels if t != IGNORE_INDEX])
    text_bytes = int(lengths[targets].sum()) if len(targets) else 0
    ids, labels = [ids for ids, _ in rows], [labels for _, labels in rows]
    return Windows(ids, labels, start, text_bytes, rewritten)


def spells(table: TokenBytes, document: str, tokens: list[int]) -> bool:
    """Whether ``tokens`` spell ``document``'s UTF-8 bytes back (a space the tokenizer puts
    before a text allowed)."""
    spelled = b"".join(table.pieces[t] if t < len(table.pieces) else b"" for t in tokens)
    text = document.encode()
    return spelled == text or spelled == b" " + text


def batches(windows: Windows, batch_size: int) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """``(input_ids, attention_mask, labels)`` of ``batch_size`` rows at a time, padded on the
    right to the longest row (padding masked, labelled ``IGNORE_INDEX``)."""
    for first in range(0, len(windows.ids), batch_size):
        ids = windows.ids[first : first + batch_size]
        labels = windows.labels[first : first + batch_size]
        width = max(len(row) for row in ids)
        pad = [width - len(row) for row in ids]
        yield (
            torch.tensor([row + [row[-1]] * n for row, n in zip(ids, pad, strict=True)]),
            torch.tensor([[1] * len(row) + [0] * n for row, n in zip(ids, pad, strict=True)]),
            torch.tensor([row + [IGNORE_INDEX] * n for row, n in zip(labels, pad, strict=True)]),
        )


@torch.no_grad()
def nll_sum(model, windows: Windows, batch_size: int) -> float:
    """``model``'s summed next-token NLL (nats) over every target of ``windows``: its head
    applied a chunk of scored positions at a time (``losses/chunked.py``), so no ``[batch,
    seq, vocab]`` logits (Gemma's 262k columns: 2 GB at 8 × 256 positions, 5.1 GB resident
    with their log-softmax). A model whose logits the chunked head does not reproduce is
    scored from its own logits."""
    head, total = None, 0.0
    for number, (ids, mask, labels) in enumerate(batches(windows, batch_size)):
        inputs = {"input_ids": ids, "attention_mask": mask}
        if number == 0:
            head = chunkable_head(model, inputs)
        if head is None:
            total += logits_nll(model, inputs, labels)
            continue
        hidden, targets = scored_next_token(final_hidden(model, inputs, logits=False), labels)
        # Four training chunks a time: fewer, larger products (Gemma: 128 positions, 128 MB).
        step = 4 * auto_chunk_size(head.weight.shape[0], len(targets))
        for start in range(0, len(targets), step):
            logits = head.logits(hidden[start : start + step], matmul_dtype(hidden)).float()
            total += F.cross_entropy(logits, targets[start : start + step], reduction="sum").item()
    return total


def logits_nll(model, inputs: dict[str, Tensor], labels: Tensor) -> float:
    """The summed NLL of ``labels`` from ``model``'s own ``[batch, seq, vocab]`` logits."""
    logits, targets = scored_next_token(final_hidden(model, inputs, logits=True), labels)
    return F.cross_entropy(logits.float(), targets, reduction="sum").item()


def chunkable_head(model, inputs: dict[str, Tensor]) -> OutputHead | None:
    """``model``'s output head if applying it to the final hidden states gives the model's
    logits (``models.heads.check_head``), else None."""
    try:
        check_head(model, inputs, "model", "")
    except ValueError:
        return None
    return output_head(model)


def score_row(name: str, tokenizer: str, nll: float, windows: Windows) -> dict:
    """A table row: perplexity per token, bits per byte, and the counts they divide by."""
    tokens, text_bytes = windows.tokens, windows.text_bytes
    return {
        "model": name,
        "tokenizer": tokenizer,
        "perplexity": math.exp(nll / tokens),
        "bits_per_byte": nll / (math.log(2) * text_bytes),
        "tokens": tokens,
        "bytes": text_bytes,
        "rewritten_documents": windows.rewritten,
    }


def score_documents(
    models: list[str], documents: list[str], block_size: int, batch_size: int, trust=False
) -> list[dict]:
    """Each model's perplexity and bits per byte over ``documents``, each through its own
    tokenizer (``trust``: their own code run). Every tokenizer reads the text before any model
    loads."""
    tokenizers = {name: load_tokenizer(name, trust) for name in models}
    views = {name: windows_of(documents, tokenizers[name], block_size, name) for name in models}
    rows = []
    ids = {name: view.ids for name, view in views.items()}
    for name, tokenizer in zip(models, tokenizer_names(models, tokenizers, ids), strict=True):
        nll = nll_sum(load_model(name, trust=trust), views[name], batch_size)
        rows.append(row := score_row(name, tokenizer, nll, views[name]))
        print(
            f"{name}: perplexity {row['perplexity']:.2f} over {row['tokens']} tokens, "
            f"{row['bits_per_byte']:.4f} bits per byte over {row['bytes']} bytes",
            flush=True,
        )
        if views[name].rewritten:
            print(f"{name}: {REWRITES.format(views[name].rewritten, len(documents))}", flush=True)
    return rows
