"""Sequence-level KD from a file: the teacher's answers in place of the dataset's.

``data.teacher_answers=FILE`` (``data=chat``) replaces the last answer of every *training*
conversation with the teacher's answer to the same prompt, read from ``FILE`` — the
``completions.jsonl`` that ``lightning-kd generate generate.prompts=train_split`` writes
from the same data settings. Validation keeps the dataset's answers, so runs with and without it
are measured on the same held-out conversations. Prompts are matched by their messages; a training
prompt the file does not answer is refused by name. A prompt the training data asks several times
may be answered once (every occurrence gets that answer) or once per occurrence, in order: sampled
generation answers each occurrence on its own, and those answers differ.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from lightning_kd.data.conversations import checked_messages, prompt_key, prompt_of
from lightning_kd.data.errors import DataError, MissingData
from lightning_kd.data.reading import read_records

WRITE_THEM = (
    "write them with `lightning-kd generate <the run's data settings> "
    "generate.prompts=train_split hydra.run.dir=DIR` and set data.teacher_answers="
    "DIR/completions.jsonl"
)

Answers = dict[str, list[tuple[dict, str]]]
"""``{prompt key: [(answer message, where), ...]}``."""


def read_teacher_answers(path: Path) -> Answers:
    """``{prompt key: [(answer message, where), ...]}`` of every row of ``path``, in file order."""
    if not path.is_file():
        raise MissingData(f"data.teacher_answers={str(path)!r} is not a file; {WRITE_THEM}")
    answers: Answers = {}
    for number, record in read_records(path):
        where = f"{path}:{number}"
        if "messages" not in record and isinstance(record.get("text"), str):
            raise DataError(
                f"{where} is a text continuation (lightning-kd generate on data=text writes "
                "them); data.teacher_answers takes the chat answers generate writes on "
                f"data=chat. Train on text rows with data=text 'data.files=[{path}]'"
            )
        messages = checked_messages(record.get("messages"), where)
        if not messages or messages[-1]["role"] != "assistant" or not prompt_of(messages):
            raise DataError(
                f"{where}: a teacher answer row is the prompt's messages followed by one "
                "assistant message (as lightning-kd generate writes them)"
            )
        answers.setdefault(prompt_key(messages), []).append((messages[-1], where))
    return answers


def check_counts(answers: Answers, asked: Counter[str]) -> None:
    """Refuse a prompt answered differently, a number of times that is not how often it is asked."""
    for key, rows in answers.items():
        texts = {answer["content"] for answer, _ in rows}
        if key not in asked or len(texts) == 1 or len(rows) == asked[key]:
            continue
        where = ", ".join(w for _, w in rows[:3]) + (", ..." if len(rows) > 3 else "")
        raise DataError(
            f"{where} answer one prompt {len(rows)} times, differently, and the training data "
            f"asks it {asked[key]} time(s): give one answer per prompt, or one per occurrence "
            "in the training data's order (as `lightning-kd generate generate.prompts="
            "train_split` writes them from the same data settings)"
        )


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
    check_counts(answers, Counter(keys))
    seen: Counter[str] = Counter()
    answered = []
    for conversation, key in zip(conversations, keys, strict=True):
        rows = answers[key]
        answer = rows[seen[key] % len(rows)][0]  # one answer per prompt serves every occurrence
        seen[key] += 1
        answered.append([*prompt_of(conversation), answer])  # "finished": false kept
    return answered
