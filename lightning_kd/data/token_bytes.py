"""What text each token id stands for, as bytes: the common ground of two tokenizers.

Two tokenizers split the same text differently, but every token of either is a run of the text's
UTF-8 bytes. :class:`TokenBytes` is that table for one tokenizer: ``id → bytes``, read from the
tokenizer's own vocabulary and decoder, so a row of ids maps to byte offsets exactly (no
re-tokenisation, no guessing from ``decode`` of single ids, which turns half a UTF-8 character
into U+FFFD):

- byte-level BPE (GPT-2, Llama 3, SmolLM2: a ``ByteLevel`` decoder): each symbol of a token's
  string is one byte, through GPT-2's printable byte alphabet;
- SentencePiece-style vocabularies (Llama 2, Gemma: ``▁`` for a space, ``<0xNN>`` byte pieces):
  ``▁`` is a space, a byte piece its byte;
- added tokens (chat markers): their content, as the text they render.

The tokenizer's document boundary (its EOS; :func:`separator_id`) and the special tokens it
adds by itself (a BOS) carry no text: they are :attr:`TokenBytes.boundaries`, where a text ends.
Only fast tokenizers (the ``tokenizers`` backend) expose the vocabulary and decoder this reads;
a slow one is refused with the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import SLOW_TO_FAST_CONVERTERS

from lightning_kd.data.errors import DataError

BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
"""A SentencePiece byte-fallback piece: ``<0x0A>`` is the byte 0x0A."""


def separator_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token that ends a document: EOS for causal LMs, SEP for BERT-style encoders."""
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id


@cache
def byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: printable symbol → the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    symbols = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return {symbol: byte for byte, symbol in symbols.items()}


def check_fast(tokenizer: PreTrainedTokenizerBase, role: str) -> None:
    """Refuse a tokenizer without the ``tokenizers`` backend: no vocabulary-to-bytes table, no
    offsets to align by."""
    if getattr(tokenizer, "is_fast", False):
        return
    name = type(tokenizer).__name__
    slow = (
        f"the {role}'s tokenizer ({name}) is a slow (Python) tokenizer: cross-tokenizer "
        "distillation aligns token offsets, which only fast tokenizers give. "
    )
    if name not in SLOW_TO_FAST_CONVERTERS:  # use_fast=True would load the same slow one
        raise DataError(
            slow + f"transformers has no fast version of {name} to convert it to: use a model "
            "whose tokenizer is a fast (tokenizers) one, a byte-level BPE or SentencePiece"
        )
    raise DataError(
        slow + "Save a fast one beside the model (AutoTokenizer.from_pretrained(path, "
        "use_fast=True).save_pretrained(path); it needs the tokenizers package) or use a model "
        "that has one"
    )


def decoder_kind(tokenizer: PreTrainedTokenizerBase) -> str:
    """How the tokenizer's tokens become text: ``byte_level``, ``sentencepiece``, ``wordpiece``
    or ``plain``."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    decoder = state.get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {part.get("type") for part in parts}
    if "WordPiece" in types:
        return "wordpiece"
    if "ByteLevel" in types:
        return "byte_level"
    replaces_space = any(
        part.get("type") == "Replace" and part.get("pattern", {}).get("String") == "▁"
        for part in parts
    )
    if types & {"Metaspace", "ByteFallback"} or replaces_space:
        return "sentencepiece"
    return "plain"


def piece_bytes(piece: str, kind: str) -> tuple[bytes, bool]:
    """The bytes of one vocabulary piece and whether it is a byte-fallback piece."""
    if kind == "byte_level":
        alphabet = byte_alphabet()
        if all(symbol in alphabet for symbol in piece):
            return bytes(alphabet[symbol] for symbol in piece), False
        return piece.encode(), False
    if kind == "sentencepiece":
        if match := BYTE_PIECE.match(piece):
            return bytes([int(match.group(1), 16)]), True
        return piece.replace("▁", " ").encode(), False
    return piece.encode(), False


@dataclass(frozen=True)
class TokenBytes:
    """A tokenizer's ``id → bytes`` table, its boundary tokens, and what it adds around a text."""

    pieces: list[bytes]
    """The bytes of each id (empty for a boundary token)."""
    byte_pieces: frozenset[int]
    """Ids of byte-fallback pieces (``<0xNN>``): used only where no other piece fits."""
    boundaries: frozenset[int]
    """Ids that end or start a document and carry no text (EOS, a BOS the tokenizer adds)."""
    end: int | None
    """The id that ends a document (EOS), or None."""
    prefix: tuple[int, ...]
    """Ids the tokenizer puts before a text by itself (a BOS), in order."""
    specials: frozenset[int] = frozenset()
    """Ids of the tokenizer's special added tokens (chat markers, padding): rendered as their
    content in a text, never the twin of another tokenizer's *text* token."""
    controls: dict[int, bytes] = field(default_factory=dict)
    """The content of each special added token, boundaries included (``<|im_end|>``, ``<eos>``):
    what makes a control token of one tokenizer the twin of another's (``data/vocab_maps.py``)."""

    def __len__(self) -> int:
        return len(self.pieces)

    def lengths(self, size: int | None = None) -> Tensor:
        """``[size]``: each id's byte count (0 for ids past the table: padding rows of a head)."""
        lengths = torch.zeros(max(size or 0, len(self.pieces)), dtype=torch.long)
        lengths[: len(self.pieces)] = torch.tensor([len(piece) for piece in self.pieces])
        return lengths


def token_bytes(tokenizer: PreTrainedTokenizerBase, role: str = "student") -> TokenBytes:
    """The :class:`TokenBytes` of ``tokenizer`` (a fast one; ``role`` names it in errors)."""
    check_fast(tokenizer, role)
    kind = decoder_kind(tokenizer)
    if kind == "wordpiece":
        raise DataError(
            f"the {role}'s tokenizer is WordPiece (BERT-style): its tokens do not spell the text's "
            "bytes (the space between words is in no token, '##' marks a word's continuation, "
            "and an uncased one lower-cases and strips accents), so its positions cannot be "
            "aligned with another tokenizer's by bytes, nor its bits per byte counted. "
            "Cross-tokenizer distillation needs a byte-level BPE or SentencePiece tokenizer on "
            "both sides (as causal LMs have)"
        )
    vocab = tokenizer.get_vocab()
    pieces: list[bytes] = [b""] * (max(vocab.values()) + 1)
    byte_pieces = set()
    for piece, index in vocab.items():
        pieces[index], is_byte = piece_bytes(piece, kind)
        if is_byte:
            byte_pieces.add(index)
    for index, added in tokenizer.added_tokens_decoder.items():
        pieces[index] = added.content.encode()  # an added token renders as its content
    empty = tokenizer("", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    framed = tokenizer("a", add_special_tokens=True)["input_ids"]
    prefix = tuple(framed[: framed.index(plain[0])]) if plain and plain[0] in framed else ()
    end = separator_id(tokenizer)
    boundaries = {*prefix, *empty, *([] if end is None else [end])}
    for index in boundaries:
        pieces[index] = b""
    added = tokenizer.added_tokens_decoder.items()
    controls = {index: token.content.encode() for index, token in added if token.special}
    return TokenBytes(
        pieces,
        frozenset(byte_pieces),
        frozenset(boundaries),
        end,
        prefix,
        frozenset(controls),
        controls,
    )


def byte_lengths(tokenizer: PreTrainedTokenizerBase | None, model) -> Tensor | None:
    """``[model's output rows]``: the bytes each id of ``model``'s vocabulary spells, for bits
    per byte (None without a fast tokenizer to read them from)."""
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        return None
    if decoder_kind(tokenizer) == "wordpiece":
        return None  # its tokens do not spell the text (see token_bytes)
    rows = model.get_output_embeddings()
    return token_bytes(tokenizer).lengths(None if rows is None else rows.weight.shape[0])
