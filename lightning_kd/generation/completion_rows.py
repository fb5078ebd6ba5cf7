"""The rows of ``completions.jsonl``: what ``lightning-kd generate`` writes for each prompt, and
what a rerun reads back before continuing.

A chat prompt's row is its messages followed by the teacher's answer, ``{"messages": [...prompt,
{"role": "assistant", "content": answer}], "prompt_line": n}``; a text prompt's, ``{"text": prefix
+ continuation, "prompt_line": "file:line"}``. An answer cut off at ``generate.max_new_tokens``
(the teacher had not ended it) says so: its assistant message (or its text row) holds
``"finished": false``. ``data=chat`` then scores the answer's tokens but not the end of turn the
chat template closes it with: the student is not taught to stop where the teacher's budget ran out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_kd.data.errors import DataError
from lightning_kd.generation.completions_record import read_row

Prompt = str | list[dict]
"""A prompt: a document's start (text, continued) or chat messages (answered)."""

CUT = {"finished": False}
"""What an answer cut off at ``generate.max_new_tokens`` carries (a finished one, nothing)."""


def answer_row(line: int | str, prompt: Prompt, answer: str, finished: bool) -> dict[str, Any]:
    """The row written for ``prompt`` (read at ``line``): text, or the conversation answered."""
    cut = {} if finished else CUT
    if isinstance(prompt, str):
        return {"text": prompt + answer, "prompt_line": line, **cut}
    reply = {"role": "assistant", "content": answer, **cut}
    return {"messages": [*prompt, reply], "prompt_line": line}


def is_answer(row: dict[str, Any], line: int | str, prompt: Prompt) -> bool:
    """Whether ``row`` is the answer to ``prompt`` (read at ``line``)."""
    if row.get("prompt_line") != line:
        return False
    if isinstance(prompt, str):
        return isinstance(row.get("text"), str) and row["text"].startswith(prompt)
    return isinstance(row.get("messages"), list) and row["messages"][:-1] == prompt


def is_cut(row: dict[str, Any]) -> bool:
    """Whether ``row``'s answer was cut off at ``generate.max_new_tokens``."""
    messages = row.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else row
    return isinstance(last, dict) and last.get("finished") is False


def completed_rows(out: Path, prompts: list[tuple[int | str, Prompt]]) -> list[dict[str, Any]]:
    """Rows of ``out`` already complete (a torn last line cut off), checked against ``prompts``."""
    data = out.read_bytes() if out.is_file() else b""
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(out, "r+b") as handle:  # a row half-written when the last run stopped
            handle.truncate(len(whole))
    rows = [read_row(out, number, line) for number, line in enumerate(whole.splitlines(), 1)]
    for index, (row, (line, prompt)) in enumerate(zip(rows, prompts, strict=False)):
        if not is_answer(row, line, prompt):
            raise DataError(
                f"{out} row {index + 1} answers another prompt than {line and f'line {line}'} of "
                "generate.prompts: write into a new hydra.run.dir, or set overwrite=true"
            )
    if len(rows) > len(prompts):
        raise DataError(
            f"{out} holds {len(rows)} rows, more than the {len(prompts)} prompts of "
            "generate.prompts (and generate.max_prompts): raise generate.max_prompts, write "
            "into a new hydra.run.dir, or set overwrite=true"
        )
    return rows


def cut_report(out: Path, max_new_tokens: int) -> str:
    """A line on the answers of ``out`` cut off at ``generate.max_new_tokens`` (empty: none)."""
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line]
    cut = sum(map(is_cut, rows))
    if not cut:
        return ""
    if "messages" in rows[0]:
        kind, read = "answers", "data=chat scores its text but not the end of turn after it"
    else:
        kind = "continuations"
        read = "data=text scores its text but not the document separator packed after it"
    return (
        f"{cut} of {len(rows)} {kind} reached generate.max_new_tokens={max_new_tokens} before "
        f'the teacher ended them: each is marked "finished": false, and {read}; raise '
        "generate.max_new_tokens (and write into a new hydra.run.dir) to have them finished"
    )
