"""Conversations read from chat rows: ``messages``, or ``prompt`` and ``completion``, checked.

A conversation is a list of ``{"role": str, "content": str}`` messages. Its *prompt* is everything
before its last answer (trailing assistant turns dropped): what a teacher or a student is asked to
complete, and what the train/validation split of ``data=chat`` holds out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lightning_kd.data.errors import DataError

ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
"""The roles chat templates know (OpenAI's and Llama's tool roles among them)."""


@dataclass(frozen=True)
class ChatFields:
    """The keys a row's conversation is read from."""

    messages: str = "messages"
    prompt: str = "prompt"
    completion: str = "completion"


def row_messages(record: dict, where: str, fields: ChatFields) -> list[dict[str, str]]:
    """The conversation of one row, checked: role/content strings, at least one assistant turn."""
    if fields.messages in record:
        messages = record[fields.messages]
    elif fields.prompt in record and fields.completion in record:
        messages = [
            *as_messages(record[fields.prompt], "user", where),
            *as_messages(record[fields.completion], "assistant", where),
        ]
    else:
        raise DataError(
            f"{where} has neither {fields.messages!r} nor {fields.prompt!r} and "
            f"{fields.completion!r}; set data.messages_field (or data.prompt_field and "
            "data.completion_field) to the keys holding the conversation"
        )
    messages = checked_messages(messages, where)
    unknown = sorted({m["role"] for m in messages} - set(ROLES))
    if unknown:  # a typo's answer became unscored context: templates render any role
        raise DataError(
            f"{where} has role(s) {unknown}, none of {list(ROLES)}; roles are lower case, as "
            "chat templates read them (user and assistant, not User, human or bot)"
        )
    if not any(message["role"] == "assistant" for message in messages):
        raise DataError(
            f"{where} has no assistant turn, so nothing in it would be scored; give each row "
            "the answer to learn (a message with role 'assistant', or a completion)"
        )
    return messages


def checked_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """``messages`` as plain ``{role, content}`` dicts, refused unless each is one; an answer
    the teacher had not ended when ``generate.max_new_tokens`` cut it keeps its
    ``"finished": false`` (``generation/completion_rows.py``)."""
    if not isinstance(messages, list) or not all(is_message(m) for m in messages):
        raise DataError(
            f"{where}: a conversation is a list of {{'role': str, 'content': str}} messages"
        )
    checked = []
    for m in messages:
        finished = m.get("finished")
        if finished not in (None, True, False):
            raise DataError(
                f'{where}: a message\'s "finished" is true or false (false: an answer cut off '
                f"before its end, whose end of turn is not scored), not {finished!r}"
            )
        cut = {"finished": False} if finished is False and m["role"] == "assistant" else {}
        checked.append({"role": m["role"], "content": m["content"], **cut})
    return checked


def as_messages(value: Any, role: str, where: str) -> list[Any]:
    """A prompt or completion: a string is one ``role`` message, a list is messages already."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return value
    raise DataError(f"{where}: a prompt or completion is a string or a list of messages")


def is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def prompt_of(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The conversation before its last answer: trailing assistant turns dropped."""
    end = len(messages)
    while end and messages[end - 1]["role"] == "assistant":
        end -= 1
    return messages[:end]


def prompt_key(messages: list[dict[str, str]]) -> str:
    """A conversation's prompt as one string, to match conversations that share it."""
    return json.dumps(prompt_of(messages), ensure_ascii=False)
