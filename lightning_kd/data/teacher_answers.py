"""Sequence-level KD from a file: the teacher's answers in place of the dataset's.

``data.teacher_answers=FILE`` (``data=chat``) replaces the last answer of every *training*
conversation with the teacher's answer to the same prompt, read from ``FILE`` — the
``completions.jsonl`` that ``lightning-kd generate generate.prompts=train_split`` writes
from the same data settings. Validation keeps the dataset's answers, so runs with and without it
are measured on the same held-out conversations. Prompts are matched by their messages; a training
prompt the file does not answer, or answers twice, is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

from lightning_kd.data.conversations import checked_messages, prompt_key, prompt_of
from lightning_kd.data.errors import DataError, MissingData
from lightning_kd.data.reading import read_records

WRITE_THEM = (
    "write them with `lightning-kd generate <the run's data settings> "
    "generate.prompts=train_split hydra.run.dir=DIR` and set data.teacher_answers="
    "DIR/completions.jsonl"
)


def read_teacher_answers(path: Path) -> dict[str, tuple[str, str]]:
    """``{prompt key: (answer, where)}`` of every row of ``path``."""
    if not path.is_file():
        raise MissingData(f"data.teacher_answers={str(path)!r} is not a file; {WRITE_THEM}")
    answers: dict[str, tuple[str, str]] = {}
    for number, record in read_records(path):
        where = f"{path}:{number}"
        messages = checked_messages(record.get("messages"), where)
        if not messages or messages[-1]["role"] != "assistant" or not prompt_of(messages):
            raise DataError(
                f"{where}: a teacher answer row is the prompt's messages followed by one "
                "assistant message (as lightning-kd generate writes them)"
            )
        key = prompt_key(messages)
        if key in answers and answers[key][0] != messages[-1]["content"]:
            raise DataError(
                f"{where} answers the prompt of {answers[key][1]} again, differently: one "
                "answer per prompt (drop one, or generate into a new file)"
            )
        answers[key] = (messages[-1]["content"], where)
    return answers


def teacher_answered(conversations: list[list[dict]], path: Path) -> list[list[dict]]:
    """Each conversation as its prompt followed by the teacher's answer from ``path``."""
    answers = read_teacher_answers(path)
    keys = [prompt_key(c) for c in conversations]
    missing = [c for c, key in zip(conversations, keys, strict=True) if key not in answers]
    if missing:
        first = json.dumps(prompt_of(missing[0]), ensure_ascii=False)[:200]
        raise DataError(
            f"data.teacher_answers={str(path)!r} answers {len(conversations) - len(missing)} of "
            f"the {len(conversations)} training prompts ({len(missing)} missing, the first "
            f"{first}); {WRITE_THEM}"
        )
    return [
        [*prompt_of(c), {"role": "assistant", "content": answers[key][0]}]
        for c, key in zip(conversations, keys, strict=True)
    ]
