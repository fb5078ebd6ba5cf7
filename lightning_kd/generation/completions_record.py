"""One completions file, one generation, one writer: what a ``completions.jsonl`` was made with,
recorded beside it and checked on every resume, and the lock its writer holds.

A rerun into the same output appends to the file (``teacher_completions.py``). Were its decoding
settings, seed or teacher other than the first run's, the file would hold two generations under
one name, and a sequence-KD run would train on both unawares. So the first write records them in
``completions.meta.json`` (written whole) and a resume whose settings differ is refused, each
difference named. The teacher is told by the digests a checkpoint's provenance uses (its config,
sampled weights, dtype; the tokenizer's vocabulary), and the chat template's digest: its path
alone may change, a moved copy being the same teacher, and is named only beside another
difference.

Two generates into one output at once would interleave their rows: the writer holds an exclusive
lock, ``.completions.jsonl.lock``, and a second is refused with the first one's pid.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.data.file_hints import FINISHED, PROMPTS, generation_record
from lightning_kd.models.digests import (
    chat_template_digest,
    config_digest,
    vocab_digest,
    weights_digest,
)
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.locks import writer_lock
from lightning_kd.utils.records import read_record
from lightning_kd.utils.refusal import Refused

DECODING = ("max_new_tokens", "do_sample", "temperature", "top_p", "batch_size")
"""``GenerateSpec`` fields that change what is generated (``batch_size`` too: batch i samples from
``seed + i``, and sets how prompts are padded together). ``prompts`` is checked row by row."""
LOCATION = ("teacher.path", "teacher.gguf_file")
"""Where the teacher was loaded from: a difference counts only beside one in what it is."""
SPLIT_TOKENIZER = "prompts.split_tokenizer"
"""The vocabulary digest of the tokenizer that cut the data split the prompts are of (the
student's own, ``student.source``'s, where it has one): another cuts other prompts. Compared
where the file records it (files begun before it was recorded do not)."""
SPLIT_HINT = (
    " (the training split the prompts are of is cut with the student's own tokenizer, "
    "student.source's where it has one: give the student settings the file was begun with)"
)


class CompletionsMismatch(Refused):
    """A resume whose settings or teacher differ from those the file was begun with."""


def record_path(out: Path) -> Path:
    """``completions.meta.json`` beside ``completions.jsonl`` (``data.file_hints``' name for it:
    a run reads whether the generation finished there)."""
    return generation_record(out)


ROWS_FORMAT = 2
"""How the rows are decoded and written: 2 samples the teacher's whole distribution with none of
its ``generation_config`` processors, and marks an answer cut off (``"finished": false``). A file
begun under another (a record without it: 1) is not continued: its rows were made otherwise."""


OLDER_ROWS = (
    " (rows made by another version of lightning-kd: its sampling kept the teacher's 50 "
    "likeliest tokens and its generation_config's processors, and its cut answers are unmarked)"
)


def settings_record(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    generate: dict[str, Any],
    seed: int,
    teacher_source: dict[str, Any],
) -> dict[str, Any]:
    """What a generation with the ``generate`` settings (a ``GenerateSpec`` as a dict) from
    ``seed`` by ``teacher`` (loaded from ``teacher_source``: its ``path`` and ``gguf_file``)
    produces, flat ``key → value``, as JSON reads it back."""
    record = {
        "rows": ROWS_FORMAT,
        **{f"generate.{name}": generate[name] for name in DECODING},
        "seed": seed,
        **{f"teacher.{name}": value for name, value in teacher_source.items()},
        "teacher.config": config_digest(teacher.config),
        "teacher.weights": weights_digest(teacher),
        "teacher.dtype": str(next(teacher.parameters()).dtype).removeprefix("torch."),
        "tokenizer.vocab": vocab_digest(tokenizer),
        "tokenizer.chat_template": chat_template_digest(tokenizer),
    }
    return json.loads(json.dumps(record))


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: the file's value, this run's value`` for each setting that differs (the teacher's
    path and GGUF file only where something else of the teacher differs too)."""
    recorded = {"rows": 1} | recorded  # a record without it: the first format
    hints = {"rows": OLDER_ROWS, SPLIT_TOKENIZER: SPLIT_HINT}
    found = [
        f"{key}: the file's {recorded.get(key)!r}, this run's {value!r}" + hints.get(key, "")
        for key, value in current.items()
        if key not in LOCATION
        and recorded.get(key) != value
        and (key != SPLIT_TOKENIZER or key in recorded)
    ]
    if any(line.startswith("teacher.") for line in found):
        found += [
            f"{key}: the file's {recorded.get(key)!r}, this run's {current.get(key)!r}"
            for key in LOCATION
            if recorded.get(key) != current.get(key)
        ]
    return found


def check_record(out: Path, current: dict[str, Any]) -> None:
    """Record ``current`` beside ``out`` before its first row; on a resume (``out`` holds rows),
    refuse settings other than those recorded."""
    path = record_path(out)
    if not (out.is_file() and out.stat().st_size > 0):
        write_record(path, current)
        return
    if not path.is_file():
        warnings.warn(
            f"{out} has no {path.name} (begun by an older version): what its rows were made "
            "with is unknown; recording this run's settings and continuing it",
            stacklevel=2,
        )
        write_record(path, current)
        return
    fix = f"restore it, or delete {out} (overwrite=true does) to generate anew"
    found = differences(read_record(path, fix), current)
    if found:
        raise CompletionsMismatch(
            f"{out} was begun with other generate settings or another teacher ({path.name}):\n  "
            + "\n  ".join(found)
            + f"\nResume it with the file's settings, write into another output "
            f"(hydra.run.dir=...), or delete {out} (overwrite=true does) to generate anew"
        )


def mark_progress(out: Path, prompts: int, finished: bool) -> None:
    """Record beside ``out`` how many prompts its generation answers and whether it has
    answered them all: a stopped generation's file was trained on as the whole corpus (8 of
    113 answers), without a word (probe 59; ``data/file_hints.py`` reads it). Not a setting:
    a resume compares none of it."""
    path = record_path(out)
    write_record(path, read_record(path, "restore it") | {PROMPTS: prompts, FINISHED: finished})


def write_record(path: Path, record: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())


def lock_path(out: Path) -> Path:
    """``.completions.jsonl.lock`` beside ``completions.jsonl``: the file its writer locks."""
    return out.with_name(f".{out.name}.lock")


@contextmanager
def completions_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s writer lock for the block, or raise ``WriterLocked`` naming the pid of the
    process writing it."""
    with writer_lock(
        lock_path(out),
        str(out),
        "wait for that generate to end (rerun then to finish what it left), or write into "
        "another output (hydra.run.dir=...)",
    ):
        yield


def read_row(out: Path, number: int, line: bytes) -> dict:
    """Row ``number`` of the completions file ``out``, or a refusal naming it: a row edited or
    damaged inside the file is not one a resume can continue after."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        row = error
    if not isinstance(row, dict):
        raise CompletionsMismatch(
            f"{out}:{number} is not a completion row ({row}); the file was changed since it was "
            "written: write into a new hydra.run.dir, or set overwrite=true to start it again"
        )
    return row
