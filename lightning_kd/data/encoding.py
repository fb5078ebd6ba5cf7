"""Text as token ids: what a document says, never a control token it happens to quote.

A tokenizer parses its special tokens' strings wherever they occur in what it is given:
SmolLM2's reads ``<|im_end|>`` inside a document as its EOS, Gemma's ``<eos>`` as its own. A
corpus that quotes them — code about tokenizers, scraped chat logs, a forum post pasting a prompt
— would hand the model a document end or a turn marker the text does not have, train it to emit
one there, and cut the text a cross-tokenizer teacher reads. Text is therefore tokenised with
``split_special_tokens=True``: such a string is spelled out in ordinary tokens, as any other.

A rendered conversation mixes both kinds: the chat template's markers are control tokens, a
message quoting one is text. :func:`chat_ids` tells them apart by where they stand.
"""

from __future__ import annotations

import bisect
import json
import weakref
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.errors import DataError


def text_ids(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], special: bool = False
) -> list[list[int]]:
    """Each of ``texts`` as token ids, special-token strings spelled out; ``special``: with the
    tokens the tokenizer adds around a text (a BOS)."""
    if not texts:
        return []
    # verbose=False: cut into blocks next, so transformers' "indexing errors" warning misled.
    encoded = tokenizer(texts, add_special_tokens=special, split_special_tokens=True, verbose=False)
    return encoded["input_ids"]


def special_strings(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The strings the tokenizer reads as one special token (its control tokens)."""
    return {
        token.content
        for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if token.special and token.content
    }


class Quotes:
    """Finds a tokenizer's special-token strings in a text fast: Gemma's tokenizer has 6,249 of
    them, and testing each against each message cost 4 ms a conversation (7 minutes for 100k);
    here a text is searched only where one of their first characters occurs, and there only for
    their few lengths."""

    def __init__(self, strings: set[str], ids: dict[int, str]) -> None:
        self.strings = strings
        self.ids = ids
        """The special tokens' ids (what a template's marker is), each with its string."""
        self.firsts = {string[0] for string in strings}
        self.lengths = sorted({len(string) for string in strings})

    def quoted(self, text: str) -> list[str]:
        """The special-token strings in ``text``, in order of where they start."""
        found = []
        for first in self.firsts:
            at = text.find(first)
            while at >= 0:
                found += [
                    (at, text[at : at + size])
                    for size in self.lengths
                    if at + size <= len(text) and text[at : at + size] in self.strings
                ]
                at = text.find(first, at + 1)
        return [string for _, string in sorted(found)]


BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per tokenizer: ``{kind: (its length when built, what was built)}``."""


def built_for(tokenizer: PreTrainedTokenizerBase, build: Callable) -> Any:
    """``build(tokenizer)``, built once per tokenizer (again once tokens were added to it): a
    chat dataset asks for each conversation."""
    made = BUILT.setdefault(tokenizer, {})
    if made.get(build, (None,))[0] != len(tokenizer):
        made[build] = (len(tokenizer), build(tokenizer))
    return made[build][1]


def quotes_of(tokenizer: PreTrainedTokenizerBase) -> Quotes:
    """The tokenizer's :class:`Quotes` (built once)."""
    return built_for(tokenizer, build_quotes)


def build_quotes(tokenizer: PreTrainedTokenizerBase) -> Quotes:
    ids = dict(zip(tokenizer.all_special_ids, tokenizer.all_special_tokens, strict=True))
    ids |= {
        index: token.content
        for index, token in tokenizer.added_tokens_decoder.items()
        if token.special
    }
    return Quotes(special_strings(tokenizer), ids)


SENTINEL = "\ue000lightning-kd message\ue001"
"""Stands in for a message's content to find where the template puts it (private-use
characters: no text holds them by chance)."""


def chat_ids(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    messages: list[dict],
    where: str,
    generation_prompt: bool = False,
    cuts: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """``text`` (``messages`` rendered, with the generation prompt if ``generation_prompt``) as
    token ids and each token's first character: the template's markers as control tokens, a
    marker's string quoted inside a message spelled out, and no token across ``cuts`` (where an
    answer starts: SmolLM2's tokenizer read the prompt's last newline and an answer's first as
    one token, so the answer lost that newline from its labels and trained on a context the
    model never reads at inference, where the prompt is tokenised alone).

    A conversation that quotes none and has no token across a cut is tokenised as the model
    reads it (one call). Others are tokenised between the template's own markers, which is what
    the tokenizer does anyway (it cuts at special tokens first and tokenises the pieces between
    them alone), and at the cuts."""
    # verbose=False: block_size, not the tokenizer's model_max_length, bounds what is read.
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    quotes = quotes_of(tokenizer)
    quoting = [quotes.quoted(content) for content in contents(messages)]
    across = cuts_inside_tokens(offsets, cuts)
    if not any(quoting) and not across:
        return ids, [start for start, _ in offsets]
    regions = [
        region
        for turn, quoted in enumerate(quoting)
        if quoted
        and (region := message_region(tokenizer, text, messages, turn, generation_prompt, where))
    ]
    markers = []
    for token, (start, stop) in zip(ids, offsets, strict=True):
        if token not in quotes.ids:
            continue
        # Where the token's string stands: its offsets may take in the whitespace it strips
        # (an lstrip marker right after a message ending in a space starts inside it).
        found = text.find(quotes.ids[token], start, stop)
        at = found if found >= 0 else start
        if not any(lo <= at < hi for lo, hi in regions):
            markers.append((token, start, stop))
    return between_markers(tokenizer, text, markers, across)


def cuts_inside_tokens(offsets: Sequence[tuple[int, int]], cuts: Sequence[int]) -> list[int]:
    """The ``cuts`` some token's ``(start, stop)`` characters run across (``start < cut <
    stop``): a search among the tokens sorted by start, each cut in log time (a scan of every
    token per cut made a conversation of hundreds of turns take minutes)."""
    starts, reach, furthest = [], [], 0
    for start, stop in offsets:
        furthest = max(furthest, stop)
        starts.append(start)
        reach.append(furthest)  # the furthest stop of this token and those before it
    if any(b < a for a, b in pairwise(starts)):  # never seen: the scan, to stay right
        return [cut for cut in cuts if any(lo < cut < hi for lo, hi in offsets)]
    before = [bisect.bisect_left(starts, cut) for cut in cuts]  # tokens starting before each
    return [cut for cut, n in zip(cuts, before, strict=True) if n and reach[n - 1] > cut]


def contents(messages: list[dict]) -> list[str]:
    """What each message says (its text content; other kinds of content as nothing)."""
    return [m["content"] if isinstance(m.get("content"), str) else "" for m in messages]


def message_region(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    messages: list[dict],
    turn: int,
    generation_prompt: bool,
    where: str,
) -> tuple[int, int] | None:
    """The characters of ``text`` that message ``turn``'s content renders as: found by rendering
    the conversation again with :data:`SENTINEL` for it (a search for the content itself can
    land on the template's own text: a message saying ``<|im_end|>`` on the end of an earlier
    turn); None where the template leaves the message out. A template that trims the message is
    matched trimmed; one that rewrites it otherwise, or renders it twice, is refused: the quote
    could not be told from its markers."""
    content = messages[turn]["content"]
    marked = [*messages[:turn], {**messages[turn], "content": SENTINEL}, *messages[turn + 1 :]]
    rendered = tokenizer.apply_chat_template(
        marked, tokenize=False, add_generation_prompt=generation_prompt
    )
    if rendered == text:  # not rendered (a template that drops the system turn)
        return None
    if rendered.count(SENTINEL) == 1:
        before, after = rendered.split(SENTINEL)
        for candidate in (content, content.strip()):
            if text == before + candidate + after:
                return len(before), len(before) + len(candidate)
    raise DataError(
        f"{where}: message {turn} quotes the special token(s) "
        f"{sorted(set(quotes_of(tokenizer).quoted(content)))}, and the chat template rewrites "
        "that message, so the quote cannot be told from the template's own markers; remove or "
        "escape it in the row (for example '<|' -> '< |'), or set data.chat_template to a "
        "template that renders the message as it is"
    )


def between_markers(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    markers: list[tuple[int, int, int]],
    cuts: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """``text`` tokenised piece by piece between ``markers`` (``(id, start, stop)``, kept as
    they are) and at ``cuts``, special-token strings in the pieces spelled out; ids and first
    characters."""
    ids: list[int] = []
    starts: list[int] = []
    cursor = 0
    for token, start, stop in [*markers, (None, len(text), len(text))]:
        edges = [cursor, *(cut for cut in cuts if cursor < cut < start), start]
        for lo, hi in pairwise(edges):
            if hi > lo:
                piece = sections_of(tokenizer).encode(text[lo:hi], first=lo == 0)
                ids += piece.ids
                starts += [lo + first for first, _ in piece.offsets]
        if token is not None:
            ids.append(token)
            starts.append(start)
        cursor = stop
    return ids, starts


def marked_ids(
    tokenizer: PreTrainedTokenizerBase, data: bytes, markers: list[tuple[int, int]]
) -> list[int]:
    """The UTF-8 text ``data`` as ids, special-token strings spelled out except at ``markers``
    (``[start, stop)`` bytes of control tokens the tokenizer reads as its own)."""
    text = data.decode("utf-8", errors="replace")

    def chars(offset: int) -> int:  # markers sit between whole characters
        return len(data[:offset].decode("utf-8", errors="replace"))

    found = [
        (tokenizer.convert_tokens_to_ids(data[start:stop].decode()), chars(start), chars(stop))
        for start, stop in markers
    ]
    return between_markers(tokenizer, text, found)[0]


class Sections:
    """A tokenizer's backend for the pieces of a text cut at its control tokens, special-token
    strings encoded as text. The tokenizer itself cuts a text at its control tokens and
    tokenises the pieces alone, but only the first as the start of a text: a Metaspace
    pre-tokenizer with ``prepend_scheme`` ``first`` (Mistral's; Llama 2's saved with
    ``legacy=False``) puts its ``▁`` before that piece alone, so the later ones are encoded by
    a copy without it (each alone, they would all have had one)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        self.first = plain_backend(state)
        later = json.loads(json.dumps(state))
        self.later = plain_backend(later) if no_first_prefix(later.get("pre_tokenizer")) else None

    def encode(self, text: str, first: bool):
        """``text``'s encoding (``ids``, ``offsets``) as a text's first piece or a later one."""
        backend = self.first if first or self.later is None else self.later
        return backend.encode(text, add_special_tokens=False)


def plain_backend(state: dict) -> Tokenizer:
    """The backend of ``state`` encoding special-token strings as text, untruncated, unpadded
    (as a ``tokenizer(...)`` call sets it)."""
    backend = Tokenizer.from_str(json.dumps(state))
    backend.encode_special_tokens = True
    backend.no_truncation()
    backend.no_padding()
    return backend


def no_first_prefix(node: dict | None) -> bool:
    """Turn each Metaspace ``prepend_scheme: first`` in the pre-tokenizer ``node`` into
    ``never``; whether there was one."""
    if not node:
        return False
    if node.get("type") == "Sequence":  # a list, not a generator: every child is turned
        return any([no_first_prefix(child) for child in node.get("pretokenizers", [])])
    if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
        node["prepend_scheme"] = "never"
        return True
    return False


def sections_of(tokenizer: PreTrainedTokenizerBase) -> Sections:
    """The tokenizer's :class:`Sections` (built once)."""
    return built_for(tokenizer, Sections)
