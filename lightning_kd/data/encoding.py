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

import weakref

from transformers import PreTrainedTokenizerBase

from lightning_kd.data.errors import DataError


def text_ids(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], special: bool = False
) -> list[list[int]]:
    """Each of ``texts`` as token ids, special-token strings spelled out; ``special``: with the
    tokens the tokenizer adds around a text (a BOS)."""
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=special, split_special_tokens=True)["input_ids"]


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

    def __init__(self, strings: set[str], ids: set[int]) -> None:
        self.strings = strings
        self.ids = ids
        """The special tokens' ids (what a template's marker is)."""
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


QUOTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def quotes_of(tokenizer: PreTrainedTokenizerBase) -> Quotes:
    """The tokenizer's :class:`Quotes`, built once per tokenizer."""
    if tokenizer not in QUOTES:
        ids = set(tokenizer.all_special_ids) | {
            index for index, token in tokenizer.added_tokens_decoder.items() if token.special
        }
        QUOTES[tokenizer] = Quotes(special_strings(tokenizer), ids)
    return QUOTES[tokenizer]


SENTINEL = "\ue000lightning-kd message\ue001"
"""Stands in for a message's content to find where the template puts it (private-use
characters: no text holds them by chance)."""


def chat_ids(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    messages: list[dict],
    where: str,
    generation_prompt: bool = False,
) -> tuple[list[int], list[int]]:
    """``text`` (``messages`` rendered, with the generation prompt if ``generation_prompt``) as
    token ids and each token's first character: the template's markers as control tokens, a
    marker's string quoted inside a message spelled out.

    A conversation that quotes none is tokenised as the model reads it at inference (one call).
    One that does is tokenised between the template's own markers, which is what the tokenizer
    does anyway (it cuts at special tokens first and tokenises the pieces between them alone)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    quotes = quotes_of(tokenizer)
    quoting = [quotes.quoted(content) for content in contents(messages)]
    if not any(quoting):
        return ids, [start for start, _ in offsets]
    regions = [
        message_region(tokenizer, text, messages, turn, generation_prompt, where)
        for turn, quoted in enumerate(quoting)
        if quoted
    ]
    markers = [
        (token, start, stop)
        for token, (start, stop) in zip(ids, offsets, strict=True)
        if token in quotes.ids and not any(lo <= start < hi for lo, hi in regions)
    ]
    return between_markers(tokenizer, text, markers)


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
) -> tuple[int, int]:
    """The characters of ``text`` that message ``turn``'s content renders as: found by rendering
    the conversation again with :data:`SENTINEL` for it (a search for the content itself can
    land on the template's own text: a message saying ``<|im_end|>`` on the end of an earlier
    turn). A template that trims the message is matched trimmed; one that rewrites it otherwise,
    or renders it twice, is refused: the quote could not be told from its markers."""
    content = messages[turn]["content"]
    marked = [*messages[:turn], {**messages[turn], "content": SENTINEL}, *messages[turn + 1 :]]
    rendered = tokenizer.apply_chat_template(
        marked, tokenize=False, add_generation_prompt=generation_prompt
    )
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
    tokenizer: PreTrainedTokenizerBase, text: str, markers: list[tuple[int, int, int]]
) -> tuple[list[int], list[int]]:
    """``text`` tokenised piece by piece between ``markers`` (``(id, start, stop)``, kept as
    they are), special-token strings in the pieces spelled out; ids and first characters."""
    ids: list[int] = []
    starts: list[int] = []
    cursor = 0
    for token, start, stop in [*markers, (None, len(text), len(text))]:
        if start > cursor:
            piece = tokenizer(
                text[cursor:start],
                add_special_tokens=False,
                split_special_tokens=True,
                return_offsets_mapping=True,
            )
            ids += piece["input_ids"]
            starts += [cursor + first for first, _ in piece["offset_mapping"]]
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
    ids: list[int] = []
    cursor = 0
    for start, stop in [*markers, (len(data), len(data))]:
        if start > cursor:
            ids += text_ids(tokenizer, [data[cursor:start].decode("utf-8", errors="replace")])[0]
        if stop > start:
            ids += tokenizer(data[start:stop].decode(), add_special_tokens=False)["input_ids"]
        cursor = stop
    return ids
