"""Conversations read from chat rows: ``messages``, or ``prompt`` and ``completion``, checked.

A conversation is a list of ``{"role": str, "content": str}`` messages. A message's other keys
(``tool_calls``, ``name``, ``tool_call_id``, ...) go to the chat template as they are; an assistant
message calling tools may leave its content ``null``, as OpenAI's format does. Its *prompt* is
everything before its last answer (trailing assistant turns dropped): what a teacher or a student
is asked to complete, and what the train/validation split of ``data=chat`` holds out.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_kd.data.chat_formats import (
    ALPACA,
    SHAREGPT,
    alpaca_messages,
    from_sharegpt,
    refuse_dropped_input,
)
from lightning_kd.data.errors import DataError, described

CALLS = ("tool_calls", "function_call")
"""Keys that make an assistant message an answer without text: a call of the user's tools."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
"""The roles chat templates know (OpenAI's and Llama's tool roles among them)."""
ASKING = ("system", "developer", "user")
"""The roles whose turn poses a prompt (a tool's result may be empty, and still be answered)."""


def note_unknown_developer(template: Any, messages: list[dict]) -> None:
    """Warn where ``messages`` hold a ``developer`` turn (OpenAI's newer name for the system
    prompt) and the chat template names no such role: it renders as a turn of its own, after
    any default system prompt the template puts first (SmolLM2's "You are a helpful AI
    assistant named SmolLM", probe 46)."""
    if template is None or "developer" in str(template):
        return
    if any(message.get("role") == "developer" for message in messages):
        warnings.warn(
            "chat: a 'developer' turn, a role the chat template does not name: it renders as a "
            "turn of its own (after the template's default system prompt, if it has one); "
            "rename the role to 'system' where it is the system prompt",
            stacklevel=3,
        )


@dataclass(frozen=True)
class ChatFields:
    """The keys a row's conversation is read from."""

    messages: str = "messages"
    prompt: str = "prompt"
    completion: str = "completion"

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ChatFields:
        """The keys a run's ``data`` settings name (``data.messages_field``, ...), the
        defaults where it names none: a prompt file's rows are read with them as the training
        rows are (``generate`` read its own, probe 46)."""
        keys = {"messages": "messages_field", "prompt": "prompt_field"}
        keys["completion"] = "completion_field"
        return cls(**{name: data[key] for name, key in keys.items() if data.get(key) is not None})


def is_conversation(record: object) -> bool:
    """A row of chat data (the keys ``data=chat`` reads by default), read as text by mistake."""
    chat = ChatFields()
    return isinstance(record, dict) and (
        chat.messages in record
        or {chat.prompt, chat.completion} <= record.keys()
        or {*ALPACA} <= record.keys()
        or SHAREGPT in record
    )


def row_messages(record: dict, where: str, fields: ChatFields) -> list[dict[str, str]]:
    """The conversation of one row, checked: role/content strings, at least one assistant turn."""
    if fields.messages in record:
        messages = from_sharegpt(record[fields.messages])
    elif fields.prompt in record and fields.completion in record:
        refuse_dropped_input(record, fields.prompt, where)
        messages = [
            *as_messages(record[fields.prompt], "user", where),
            *as_messages(record[fields.completion], "assistant", where),
        ]
    elif (shaped := shaped_messages(record, fields)) is not None:
        messages = shaped
    else:
        fix = (
            "it holds 'text': read text rows with data=text (the default)"
            if "text" in record
            else "set data.messages_field (or data.prompt_field and data.completion_field) to "
            "the keys holding the conversation"
        )
        raise DataError(
            f"{where} has neither {fields.messages!r} nor {fields.prompt!r} and "
            f"{fields.completion!r}; {fix}"
        )
    messages = checked_messages(messages, where)
    refuse_unknown_roles(messages, where)
    if not any(message["role"] == "assistant" for message in messages):
        raise DataError(
            f"{where} has no assistant turn, so nothing in it would be scored; give each row "
            "the answer to learn (a message with role 'assistant', or a completion)"
        )
    if "prompt_line" not in record:  # a teacher's own empty answer (generate's rows) is its own
        refuse_empty_answers(messages, where)
    return messages


def shaped_messages(record: dict, fields: ChatFields) -> list[dict[str, Any]] | None:
    """The conversation of an Alpaca row, or of ShareGPT's ``conversations`` (where
    ``data.messages_field`` names none of its own); None for a row of neither shape. Training
    and ``generate``'s prompt rows read them alike."""
    if (alpaca := alpaca_messages(record)) is not None:
        return alpaca
    if SHAREGPT in record and fields.messages == ChatFields.messages:
        return from_sharegpt(record[SHAREGPT])
    return None


def refuse_unknown_roles(messages: list[dict[str, Any]], where: str) -> None:
    """Refuse a role no chat template knows: templates render any role, so a typo made an
    answer unscored context, or a prompt's turn a header the model was never taught."""
    unknown = sorted({m["role"] for m in messages} - set(ROLES))
    if unknown:
        raise DataError(
            f"{where} has role(s) {unknown}, none of {list(ROLES)}; roles are lower case, as "
            "chat templates read them (user and assistant, not User, human or bot)"
        )


def checked_prompt(messages: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The prompt of a prompt row's checked ``messages`` (trailing answers dropped), refused
    where there is none to answer: no turn but answers, a role no template knows, or a last
    turn without text (an empty user turn was answered and judged as a prompt)."""
    refuse_unknown_roles(messages, where)
    prompt = prompt_of(messages)
    if not prompt:
        why = "holds nothing but assistant turns" if messages else "has no messages"
        raise DataError(f"{where} {why}: there is no prompt to answer")
    last = prompt[-1]
    if last["role"] in ASKING and not last["content"].strip():
        raise DataError(
            f"{where}: the prompt's last turn (message {len(prompt) - 1}, {last['role']}) is "
            "empty, so there is nothing to answer; write the prompt, or leave the row out"
        )
    return prompt


def refuse_empty_answers(messages: list[dict[str, Any]], where: str) -> None:
    """Refuse an assistant turn with no text and no call: a failed generation or export, which
    would teach the student to end its turn at once (its only scored token the end of turn)."""
    for turn, message in enumerate(messages):
        calls = any(message.get(key) for key in CALLS)
        if message["role"] == "assistant" and not message["content"].strip() and not calls:
            raise DataError(
                f"{where}: the assistant's turn {turn} is empty, so the student would learn to "
                "end its turn at once; write its answer, or leave the row out"
            )


def checked_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """``messages`` as ``{role, content, ...}`` dicts, refused unless each is one: the other keys
    kept for the template, a tool call's ``null`` content as ``""``; an answer the teacher had
    not ended when ``generate.max_new_tokens`` cut it keeps its ``"finished": false``
    (``generation/completion_rows.py``), a finished one drops the key."""
    if not isinstance(messages, list):
        raise DataError(f"{where}: the conversation is {described(messages)}; {SHAPE}")
    messages = [joined_parts(m) for m in messages]
    for turn, message in enumerate(messages):
        if fault := message_fault(message):
            raise DataError(f"{where}: message {turn} {fault}; {SHAPE}")
    checked = []
    for m in messages:
        finished = m.get("finished")
        if finished not in (None, True, False):
            raise DataError(
                f'{where}: a message\'s "finished" is true or false (false: an answer cut off '
                f"before its end, whose end of turn is not scored), not {finished!r}"
            )
        cut = {"finished": False} if finished is False and m["role"] == "assistant" else {}
        others = {key: value for key, value in m.items() if key not in ("finished", "content")}
        checked.append({**others, "content": m.get("content") or "", **cut})
    return checked


def as_messages(value: Any, role: str, where: str) -> list[Any]:
    """A prompt or completion: a string is one ``role`` message, a list is messages already."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return value
    raise DataError(f"{where}: a prompt or completion is a string or a list of messages")


SHAPE = (
    "a conversation is a list of {'role': str, 'content': str} messages (content may be null in "
    "an assistant message with tool_calls)"
)


def message_fault(message: Any) -> str | None:
    """What keeps ``message`` from being one (a dict with a role and text content, none where
    it calls tools instead), or None: each row's fault was one message for all (probe 36)."""
    if not isinstance(message, dict):
        return f"is {described(message)}, not a mapping"
    if "role" not in message:
        return f"has no 'role' (its keys: {sorted(message)})"
    if not isinstance(message["role"], str):
        return f"has the role {described(message['role'])}, not a string"
    content = message.get("content")
    if isinstance(content, str) or (content is None and any(message.get(k) for k in CALLS)):
        return None
    if isinstance(content, list):  # parts left after joined_parts: not all text
        return "has content parts other than text ({'type': 'text', ...}): a text model reads text"
    return f"has the content {described(content)}, not a string"


def joined_parts(message: Any) -> Any:
    """A message whose content is text parts (``[{"type": "text", "text": "hi"}]``, the form
    Hugging Face's and OpenAI's chat data use) with those texts joined as its content."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list) or not content or not all(map(is_text_part, content)):
        return message
    return {**message, "content": "".join(part["text"] for part in content)}


def is_text_part(part: Any) -> bool:
    """A content part of text: ``{"type": "text", "text": str}``."""
    text = part.get("text") if isinstance(part, dict) else None
    return isinstance(text, str) and part.get("type") == "text"


def prompt_of(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation before its last answer: trailing assistant turns dropped."""
    end = len(messages)
    while end and messages[end - 1]["role"] == "assistant":
        end -= 1
    return messages[:end]


def prompt_key(messages: list[dict[str, str]]) -> str:
    """A conversation's prompt as one string, to match conversations that share it."""
    return json.dumps(prompt_of(messages), ensure_ascii=False)


def opening_key(messages: list[dict[str, str]]) -> str:
    """What a split groups conversations by: their turns before the first answer, system
    messages left out. Two conversations that share the prompt of any scored answer share it,
    as a conversation and its continuation do, or one opening under two system prompts: split
    by their whole prompts, the held-out one's answer was trained on as the other's first
    (probe 46). Conversations that part only after their first answer are grouped too."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    opening = [message for message in messages[:first] if message["role"] != "system"]
    return json.dumps(opening, ensure_ascii=False, sort_keys=True)
