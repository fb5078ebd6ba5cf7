"""A tokenizer as a GGUF vocabulary: llama.cpp's ``gpt2`` (byte-level BPE) kind, or a refusal.

llama.cpp rebuilds a tokenizer from the vocabulary, the merges, each token's type and the name of
a pre-tokenizer it knows (``tokenizer.ggml.pre``); transformers' GGUF loader rebuilds one from the
same keys. A tokenizer either of them would rebuild differently — another model than byte-level
BPE, a normalizer, a pre-tokenizer llama.cpp has no name for here — is refused, naming what
differs, before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NoReturn

from gguf import GGUFValueType, GGUFWriter, Keys, TokenType
from transformers.convert_slow_tokenizer import bytes_to_unicode

from lightning_kd.utils.refusal import Refused

FIX = (
    "keep the Hugging Face export (the save_pretrained directory, a run's student/), or convert "
    "it with llama.cpp's convert_hf_to_gguf.py, which knows more tokenizers"
)

BYTE_LEVEL = ("ByteLevel", False, True)
"""GPT-2's byte-level pre-tokenizer: its split regex, no prefix space."""
PRE_TOKENIZERS = {
    (BYTE_LEVEL,): "gpt-2",
    (("Digits", True), BYTE_LEVEL): "smollm",  # digits one by one, then GPT-2's split
}
"""Pre-tokenizers (by :func:`pre_tokenizer_shape`) and llama.cpp's name for each."""
MERGELESS = "gpt-2"
"""The name written for a vocabulary without merges: whatever the split, each byte is a token."""

SPECIAL = ("bos", "eos", "unk", "pad")
"""The special tokens written by id (``tokenizer.ggml.<name>_token_id``)."""


@dataclass
class Vocabulary:
    """What llama.cpp's ``gpt2`` tokenizer is built from."""

    pre: str
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special: dict[str, int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def gguf_vocabulary(tokenizer, vocab_size: int, config=None) -> Vocabulary:
    """``tokenizer`` as a vocabulary of ``vocab_size`` ids (the model's embedding rows), or a
    :class:`~lightning_kd.utils.refusal.Refused` naming what a GGUF cannot express. A special
    id the tokenizer lacks is the model ``config``'s (a tokenizer saved without its
    ``tokenizer_config.json``); without an EOS from either, llama.cpp would not know where an
    answer ends: refused."""
    state = backend_state(tokenizer)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in state["merges"]]
    tokens, types = token_table(tokenizer, vocab_size)
    special = {}
    for name in SPECIAL:
        token_id = getattr(tokenizer, f"{name}_token_id", None)
        if token_id is None:  # a config may list several (Llama 3's EOS): the first
            token_id = getattr(config, f"{name}_token_id", None)
            token_id = token_id[0] if isinstance(token_id, list) and token_id else token_id
        if isinstance(token_id, int) and 0 <= token_id < vocab_size:
            special[name] = token_id
    if "eos" not in special:
        raise Refused(
            "neither the tokenizer nor the model's config has an EOS token id, so llama.cpp "
            "would not know where an answer ends: save the tokenizer with its special tokens "
            "(tokenizer.save_pretrained(path) writes tokenizer_config.json) or set "
            "eos_token_id in config.json"
        )
    encoded = tokenizer("a")["input_ids"]  # what the tokenizer adds around a text
    template = tokenizer.chat_template
    return Vocabulary(
        pre=MERGELESS if not merges else state["pre"],
        tokens=tokens,
        types=types,
        merges=merges,
        special=special,
        add_bos="bos" in special and encoded[0] == special["bos"],
        add_eos="eos" in special and encoded[-1] == special["eos"],
        chat_template=template if isinstance(template, str) else None,
    )


def backend_state(tokenizer) -> dict:
    """The merges and llama.cpp's pre-tokenizer name of ``tokenizer``'s byte-level BPE; the
    name None for a vocabulary without merges whose split llama.cpp has no name for (any split
    of it gives the same bytes), a refusal for one with merges."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        refuse_tokenizer(
            f"{type(tokenizer).__name__} is a Python tokenizer with no tokenizers backend"
        )
    state = json.loads(backend.to_str())
    model, decoder = state["model"], state.get("decoder") or {}
    if model["type"] != "BPE" or decoder.get("type") != "ByteLevel":
        refuse_tokenizer(
            f"its model is {model['type']} with a {decoder.get('type')} decoder, not byte-level BPE"
        )
    if (
        model.get("byte_fallback")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
    ):
        refuse_tokenizer(
            "its BPE has byte fallback or subword affixes, which a gpt2 vocabulary has not"
        )
    if state.get("normalizer") is not None:
        refuse_tokenizer(
            f"it normalizes text first ({state['normalizer']['type']}), which llama.cpp's "
            "gpt2 tokenizer does not"
        )
    shape = pre_tokenizer_shape(state.get("pre_tokenizer"))
    pre = PRE_TOKENIZERS.get(shape)
    if pre is None and model["merges"]:
        known = ", ".join(PRE_TOKENIZERS.values())
        refuse_tokenizer(f"its pre-tokenizer {shape} has no llama.cpp name here (known: {known})")
    return {"merges": model["merges"], "pre": pre}


def pre_tokenizer_shape(pre: dict | None) -> tuple:
    """What of a tokenizers pre-tokenizer changes how text is split, as a tuple of steps."""
    if pre is None:
        return ()
    if pre["type"] == "Sequence":
        return tuple(step for inner in pre["pretokenizers"] for step in pre_tokenizer_shape(inner))
    if pre["type"] == "ByteLevel":
        return (("ByteLevel", pre.get("add_prefix_space"), pre.get("use_regex", True)),)
    if pre["type"] == "Digits":
        return (("Digits", pre.get("individual_digits")),)
    return ((pre["type"],),)


def token_table(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Each of the model's ``vocab_size`` ids as a token and its type, as llama.cpp's converter
    writes them: added tokens CONTROL (special) or USER_DEFINED, ids no token has ``[PADn]``."""
    by_id = {token_id: token for token, token_id in tokenizer.get_vocab().items()}
    if len(by_id) > vocab_size or max(by_id) >= vocab_size:
        refuse_tokenizer(
            f"it has ids up to {max(by_id)} for a model of {vocab_size} embedding rows"
        )
    added = tokenizer.added_tokens_decoder
    alphabet = set(bytes_to_unicode().values())
    tokens, types = [], []
    for token_id in range(vocab_size):
        token = by_id.get(token_id)
        if token is None:
            tokens.append(f"[PAD{token_id}]")
            types.append(TokenType.UNUSED)
        elif token_id in added:
            tokens.append(token)
            types.append(TokenType.CONTROL if added[token_id].special else TokenType.USER_DEFINED)
        elif not set(token) <= alphabet:
            refuse_tokenizer(
                f"its token {token!r} (id {token_id}) is not spelled in the byte-level alphabet"
            )
        else:
            tokens.append(token)
            types.append(TokenType.NORMAL)
    return tokens, [int(kind) for kind in types]


class GGUFFile(GGUFWriter):
    """gguf-py's writer, which also writes an empty array (a vocabulary without merges).

    The GGUF format and llama.cpp read an array of no items; gguf-py's writer refuses one. Its
    private ``_pack``/``_pack_val`` are used here and only here; the smoke model's round trip
    (``tests/unit/export/test_gguf.py``) fails if they change.
    """

    def _pack_val(self, val, vtype, add_vtype, sub_type=None) -> bytes:
        if vtype != GGUFValueType.ARRAY or len(val) > 0 or sub_type is None:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        kind = self._pack("I", vtype) if add_vtype else b""
        return kind + self._pack("I", sub_type) + self._pack("Q", 0)


def add_vocabulary(writer: GGUFWriter, vocabulary: Vocabulary) -> None:
    """The ``tokenizer.*`` keys of ``vocabulary``."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocabulary.pre)
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_types(vocabulary.types)
    # llama.cpp refuses a gpt2 vocabulary without the merges key, even one that has none.
    strings = (GGUFValueType.ARRAY, GGUFValueType.STRING)
    writer.add_key_value(Keys.Tokenizer.MERGES, vocabulary.merges, *strings)
    for name, token_id in vocabulary.special.items():
        getattr(writer, f"add_{name}_token_id")(token_id)
    writer.add_add_bos_token(vocabulary.add_bos)
    writer.add_add_eos_token(vocabulary.add_eos)
    if vocabulary.chat_template:
        writer.add_chat_template(vocabulary.chat_template)


def refuse_tokenizer(why: str) -> NoReturn:
    """Refuse a tokenizer a GGUF vocabulary cannot express: ``why``, and the way on."""
    raise Refused(f"the student's tokenizer cannot be written as GGUF: {why}; {FIX}")
