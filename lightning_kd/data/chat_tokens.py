"""Conversations to tokens and labels: rendered with the chat template, the answers alone labelled.

Each conversation is rendered with the tokenizer's chat template (or ``data.chat_template``) and
every token outside an assistant turn is labelled −100. An assistant turn's tokens are found by
rendering the conversation up to that turn with the generation prompt, then through it: the
characters between the two renderings are the answer (with whatever the template closes a turn
with, e.g. ``<|im_end|>``), whatever the template. An answer marked ``"finished": false`` (cut off
at ``generate.max_new_tokens``) is scored up to the end of its text alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jinja2 import TemplateSyntaxError
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.conversations import CALLS, ChatFields, note_unknown_developer, row_messages
from lightning_kd.data.encoding import SENTINEL, chat_ids, quotes_of
from lightning_kd.data.errors import DataError, MissingData
from lightning_kd.losses.logits import IGNORE_INDEX


@dataclass(frozen=True)
class ChatExample:
    """A conversation's tokens and labels (the token inside an assistant turn, else −100)."""

    tokens: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, start: int, stop: int) -> ChatExample:
        return ChatExample(self.tokens[start:stop], self.labels[start:stop])

    @classmethod
    def join(cls, examples: list[ChatExample]) -> ChatExample:
        """``examples`` end to end, as one."""
        tokens, labels = (
            torch.cat([getattr(e, name) for e in examples]) for name in ("tokens", "labels")
        )
        return cls(tokens, labels)

    @property
    def scored(self) -> int:
        """Positions that predict a label (the first token predicts nothing)."""
        return int((self.labels[1:] != IGNORE_INDEX).sum())


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: list[list[dict]]) -> list[Tensor]:
    """Each prompt rendered with the chat template and the generation prompt, as token ids
    (what a model is asked to continue)."""
    ids = []
    for number, messages in enumerate(prompts):
        where = f"prompt {number}"
        text = render(tokenizer, messages, where, add_generation_prompt=True)  # errors named
        check_calls_rendered(tokenizer, messages, text, where, add_generation_prompt=True)
        tokens, _ = chat_ids(tokenizer, text, messages, where, generation_prompt=True)
        ids.append(torch.tensor(tokens))
    return ids


def turn_end_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The control token the chat template closes an answer with (ChatML's ``<|im_end|>``,
    Gemma's ``<end_of_turn>``), or None: what a generated answer ends at, whatever the model's
    generation config says (a teacher whose EOS is not its template's end of turn ran on into a
    turn of its own, whose markers decoding then dropped, gluing its text to the answer)."""
    answer = SENTINEL
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # a template that cannot render this conversation: none found
        return None
    after = text.split(answer, 1)[1] if answer in text else ""
    controls = quotes_of(tokenizer).ids
    read = tokenizer(after, add_special_tokens=False)["input_ids"]  # the template's own markers
    return next((i for i in read if i in controls), None)


def turn_end_text(tokenizer: PreTrainedTokenizerBase) -> tuple[str, int] | None:
    """Where an answer ends in text, for a chat template that closes it with no special token
    (``plain``, or markers the tokenizer reads as text): the text that shows it has ended and
    how many of its characters are the answer's own. ``plain`` closes an answer with a newline
    alone, so its end shows only at the next turn: ``("\\nUser:", 1)``; a text marker
    (``<|im_end|>`` read as text) is its own end: ``("<|im_end|>", 10)``. None where the
    template renders no answer, or closes it with whitespace and opens no next turn."""
    first, second = SENTINEL, SENTINEL[::-1]
    answered = [{"role": "user", "content": "q"}, {"role": "assistant", "content": first}]
    try:
        closed = tokenizer.apply_chat_template(answered, tokenize=False)
        more = [*answered, {"role": "user", "content": second}]
        followed = tokenizer.apply_chat_template(more, tokenize=False)
    except Exception:  # a template that cannot render these conversations: none found
        return None
    if first not in closed or second not in followed:
        return None
    closing = closed.split(first, 1)[1]
    if closing.strip():  # a marker of the answer's own turn
        return closing.rstrip(), len(closing.rstrip())
    next_turn = followed.split(first, 1)[1].split(second, 1)[0].rstrip()
    if not next_turn.startswith(closing) or next_turn == closing:
        return None
    return next_turn, len(closing)


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], where: str, **kw) -> str:
    """The chat template applied to ``messages`` (text), its errors pointed at the row."""
    note_unknown_developer(kw.get("chat_template") or tokenizer.chat_template, messages)
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kw)
    except TemplateSyntaxError as err:  # no row renders: the template's fault, not the row's
        raise DataError(
            f"the chat template does not parse: {err.message} (its line {err.lineno}); fix "
            "data.chat_template (or give one, where the tokenizer's own is at fault)"
        ) from None
    except Exception as err:  # jinja2's TemplateError, or the template's own raise_exception
        roles = [message["role"] for message in messages]
        raise DataError(
            f"{where}: the chat template cannot render roles {roles} ({err}); fix the row, or "
            "set data.chat_template to a template that takes them"
        ) from None


def check_calls_rendered(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], text: str, where: str, **kw
) -> None:
    """Refuse a tool call the chat template leaves out (one without tool support renders the
    content alone): the model would read, or learn, a calling turn as an empty one."""
    for turn, message in enumerate(messages):
        for key in (key for key in CALLS if message.get(key)):
            left_out = {k: v for k, v in message.items() if k != key}
            if (
                render(tokenizer, [*messages[:turn], left_out, *messages[turn + 1 :]], where, **kw)
                == text
            ):
                raise DataError(
                    f"{where}: message {turn} ({message['role']}) has {key!r}, which the chat "
                    f"template does not render, so the turn would read as "
                    f"{message['content']!r} alone; set data.chat_template to a template that "
                    f"renders {key}, or leave such rows out"
                )


def assistant_spans(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], where: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it."""
    text, spans = render(tokenizer, messages, where), []
    check_calls_rendered(tokenizer, messages, text, where)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if turn == 0:  # nothing before it to render as its prompt
            raise DataError(
                f"{where}: the conversation opens with the assistant's turn, so that answer has "
                "no prompt; begin each row with the user's (or the system's) turn"
            )
        before = render(tokenizer, messages[:turn], where, add_generation_prompt=True)
        through = render(tokenizer, messages[: turn + 1], where)
        if not (through.startswith(before) and text.startswith(through)):
            raise DataError(
                f"{where}: the chat template does not render this conversation's turns as "
                f"prefixes of one another (turn {turn}), so the answer's tokens cannot be told "
                "from the prompt's; set data.chat_template to a template that does"
            )
        cut = message.get("finished") is False
        end = answer_end(through, before, message, where) if cut else len(through)
        spans.append((len(before), end))
    return text, spans


def answer_end(through: str, before: str, message: dict, where: str) -> int:
    """Where the text of an answer cut off before its end (``"finished": false``) ends in
    ``through``: what the template closes its turn with after it is not the teacher's, and
    scoring it would teach the student to stop where the teacher's budget ran out."""
    for content in (message["content"], message["content"].strip()):  # templates may trim
        if (at := through.find(content, len(before))) >= 0:
            return at + len(content)
    raise DataError(
        f"{where}: the chat template changes the text of an answer marked "
        '"finished": false, so where it ends cannot be found; set data.chat_template to '
        "a template that renders it as it is"
    )


def encode_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], where: str
) -> ChatExample:
    """Tokens of the rendered conversation; labels are the tokens that start inside an answer
    (for an answer cut off, ``"finished": false``, inside its text)."""
    text, spans = assistant_spans(tokenizer, messages, where)
    ids, firsts = chat_ids(tokenizer, text, messages, where, cuts=[first for first, _ in spans])
    tokens = torch.tensor(ids, dtype=torch.long)
    starts = torch.tensor(firsts, dtype=torch.long)
    answer = torch.zeros_like(tokens, dtype=torch.bool)
    if bool((starts[1:] >= starts[:-1]).all()):  # in order: each span's tokens in log time
        bounds = torch.tensor(spans, dtype=torch.long).reshape(-1, 2)
        for lo, hi in torch.searchsorted(starts, bounds).tolist():
            answer[lo:hi] = True
    else:
        for first, last in spans:
            answer |= (starts >= first) & (starts < last)
    return ChatExample(tokens, tokens.masked_fill(~answer, IGNORE_INDEX))


def pack_chats(examples: list[ChatExample], block_size: int) -> list[ChatExample]:
    """Conversations joined end to end and cut into blocks of ``block_size`` (tail dropped)."""
    if not examples:
        return []
    joined = ChatExample.join(examples)
    count = len(joined) // block_size
    return [joined.cut(i * block_size, (i + 1) * block_size) for i in range(count)]


PLAIN_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
"""``plain``: a chat template for a base model that has none (Gemma-3-270M): the BOS, then
``User: ...`` and ``Assistant: ...`` lines (a system message first, as a paragraph); the
generation prompt is ``Assistant:``. A base model then runs on into the next ``User:`` turn:
completions are cut before it (:func:`turn_end_text`, ``generation/decoding.TextStop``)."""
TEMPLATES = {"plain": PLAIN_TEMPLATE}
"""Chat templates shipped by name (``data.chat_template=plain``, and ``generate.``'s)."""


def template_text(value: str, key: str = "data.chat_template") -> str:
    """A chat template setting (``key``): a shipped template's name (``plain``), a Jinja template
    itself, or the file holding one."""
    if value in TEMPLATES:
        return TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise MissingData(
            f"{key}={value!r} is neither a Jinja template nor a file, nor one of the shipped "
            f"templates ({', '.join(TEMPLATES)})"
        )
    return path.read_text()


def dataset_row_messages(row: dict, where: str, fields: ChatFields) -> list[dict[str, str]]:
    """The conversation of a dataset row, refused by its number when it has none. A column the
    row leaves empty (``None``: a table of ``messages`` rows and ``prompt``/``completion`` rows
    holds both columns) counts as absent, and so does a key any dict in it leaves empty: a
    table gives each struct every key any row's has (a tool call's ``arguments``, every other
    tool's parameters), null where absent, and a template rendered them (probe 46)."""
    present = {key: without_nulls(value) for key, value in row.items() if value is not None}
    try:
        return row_messages(present, where, fields)
    except ValueError as err:
        raise DataError(str(err)) from None


def without_nulls(value: Any) -> Any:
    """``value`` with every dict's ``None`` values left out, at any depth."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


MESSAGES = "messages_json"
"""The rendered cache's column of each row's checked messages (JSON text). Not ``messages``:
``datasets`` gave a mapped column the type of the input's column of that name, so a JSON
file's messages (``List(Json)``) came back decoded where text was written."""


def conversation_tokens(
    batch: dict[str, list], indices: list[int], tokenizer, fields: ChatFields, where: str
) -> dict[str, list]:
    """A batch of dataset rows' conversations as tokens, labels and the checked messages (JSON),
    for ``Dataset.map``; a bad row is refused by its number."""
    found: dict[str, list] = {"tokens": [], "labels": [], MESSAGES: []}
    names = list(batch)
    for index, values in zip(indices, zip(*batch.values(), strict=True), strict=True):
        here = f"{where} row {index}"
        messages = dataset_row_messages(dict(zip(names, values, strict=True)), here, fields)
        example = encode_chat(tokenizer, messages, here)
        found["tokens"].append(example.tokens.tolist())
        found["labels"].append(example.labels.tolist())
        found[MESSAGES].append(json.dumps(messages, ensure_ascii=False))
    return found
