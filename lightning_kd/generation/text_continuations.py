"""Text prompts for sequence-level KD: a document's first words, continued by the teacher as text.

``lightning-kd generate generate.prompts=train_split`` on ``data=text`` asks the teacher (a base
model needs no chat template) to continue the start of each training document, and writes
``{"text": prefix + continuation, "prompt_line": "file:line"}``: text, so a student of any
tokenizer reads it back with ``data.files=[.../completions.jsonl]``.

- **The prefix** is the document's first ``generate.prefix_chars`` characters, cut back to the
  end of a word (a prompt that ends mid-word asks the teacher to finish a word its tokenizer
  would have split otherwise) and without trailing whitespace. Characters, not tokens: every
  teacher is given the same prompts, and a row starts with the document's own characters.
- **The prompt's tokens** are the teacher tokenizer's with its special tokens (a BOS where it
  adds one, as Gemma's does and needs); an end token it would append is dropped, the text going on.
- **The continuation** stops at the teacher's end of text (its generation config's EOS or its
  tokenizer's) or after ``generate.max_new_tokens``, and is decoded together with the prompt, so
  a SentencePiece space at the join is kept (decoded alone, a leading ``▁`` is often dropped).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.data.encoding import text_ids

WORD_END = re.compile(r".*\S(?=\s)", re.DOTALL)
"""The longest start of a text that ends a word (a non-space followed by a space)."""


def document_prefix(text: str, chars: int) -> str:
    """The first ``chars`` characters of ``text`` cut back to the end of a word, trailing space
    dropped (a first word longer than ``chars`` is cut inside it); all of a shorter text."""
    if len(text) <= chars:
        return text.rstrip()
    words = WORD_END.match(text[: chars + 1])  # one more: is the character after the cut a space?
    return (words.group(0) if words else text[:chars]).rstrip()


def text_prompt_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[Tensor]:
    """Each text as the start of a document the teacher reads: its special tokens added (a BOS
    where the tokenizer adds one), less an end token the tokenizer appends."""
    with_special = text_ids(tokenizer, texts, special=True)
    plain = text_ids(tokenizer, texts)
    eos = tokenizer.eos_token_id
    ids = []
    for special, own in zip(with_special, plain, strict=True):
        appended = eos is not None and special[-1:] == [eos] and own[-1:] != [eos]
        ids.append(torch.tensor(special[:-1] if appended else special))
    return ids


def end_tokens(teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens that end a continuation: the teacher's generation config's EOS (one or a list)
    and its tokenizer's (the token a packed ``data=text`` run separates documents with)."""
    config = getattr(teacher, "generation_config", None)
    ends = getattr(config, "eos_token_id", None)
    ends = [] if ends is None else list(ends) if isinstance(ends, list | tuple) else [ends]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ends:
        ends.append(tokenizer.eos_token_id)
    return ends


def continuations(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Tensor], new: Tensor, ends: list[int]
) -> list[str]:
    """The text each row of ``new`` (generated after ``prompts``) adds to its prompt, up to its
    first end token (``ends``): decoded with the prompt, the prompt's own decoding cut off."""
    texts = []
    for prompt, tokens in zip(prompts, new.to(prompts[0].device), strict=True):
        stops = torch.isin(tokens, torch.tensor(ends, dtype=tokens.dtype)).nonzero()
        tokens = tokens[: int(stops[0])] if len(stops) else tokens
        head = tokenizer.decode(prompt, skip_special_tokens=True)
        whole = tokenizer.decode(torch.cat([prompt, tokens]), skip_special_tokens=True)
        alone = tokenizer.decode(tokens, skip_special_tokens=True)
        texts.append(whole[len(head) :] if whole.startswith(head) else alone)
    return texts
