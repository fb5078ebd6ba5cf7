"""Chat rows in the two shapes most instruction datasets come in beside ``messages`` and
``prompt``/``completion``, read as the conversation they hold:

- Alpaca's ``{"instruction", "input", "output"}`` (and an optional ``system``): the user's turn
  is the instruction, then a blank line and the input where there is one (LLaMA-Factory and
  axolotl join them so); the answer is the output. Read with ``data.prompt_field=instruction``
  instead, the input was left out without a word (probe 46): that is refused.
- ShareGPT's ``{"conversations": [{"from": "human", "value": ...}, ...]}`` (or such turns under
  ``data.messages_field``): ``human``/``user`` → user, ``gpt``/``assistant``/``model`` →
  assistant, ``system``, and ``tool``/``function``/``observation`` → tool; a turn of any other
  ``from`` keeps it as its role, which is refused by name.
"""

from __future__ import annotations

from typing import Any

from lightning_kd.data.errors import DataError

ALPACA = ("instruction", "output")
"""The keys that make a row Alpaca's (``input`` and ``system`` optional)."""
SHAREGPT = "conversations"
"""The key ShareGPT rows hold their turns under."""
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
"""ShareGPT's ``from`` values, as the roles chat templates read."""


def alpaca_messages(record: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The conversation of an Alpaca row (None for a row of another shape)."""
    if not set(ALPACA) <= record.keys():
        return None
    prompt, extra = record["instruction"], record.get("input")
    if isinstance(prompt, str) and isinstance(extra, str) and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    system = record.get("system")
    opening = [{"role": "system", "content": system}] if is_text(system) else []
    answer = {"role": "assistant", "content": record["output"]}
    return [*opening, {"role": "user", "content": prompt}, answer]


def from_sharegpt(turns: Any) -> Any:
    """``turns`` with ShareGPT's ``{"from", "value"}`` turns as ``{"role", "content"}`` messages
    (as they are where they are not ShareGPT's)."""
    if not isinstance(turns, list) or not turns or not all(map(is_sharegpt_turn, turns)):
        return turns
    return [
        {"role": SHAREGPT_ROLES.get(turn["from"], turn["from"]), "content": turn["value"]}
        for turn in turns
    ]


def is_sharegpt_turn(turn: Any) -> bool:
    return isinstance(turn, dict) and {"from", "value"} <= turn.keys() and "role" not in turn


def refuse_dropped_input(record: dict[str, Any], prompt_field: str, where: str) -> None:
    """Refuse an Alpaca row read through ``data.prompt_field``: its ``input`` is left out."""
    extra = record.get("input")
    if prompt_field != "input" and set(ALPACA) <= record.keys() and is_text(extra):
        raise DataError(
            f"{where} is an Alpaca row whose 'input' data.prompt_field={prompt_field} leaves "
            "out of the prompt; leave data.prompt_field and data.completion_field unset: "
            "Alpaca rows are read whole (the instruction, a blank line, the input)"
        )


def is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())
