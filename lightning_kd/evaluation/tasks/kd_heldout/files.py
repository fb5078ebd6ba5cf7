"""The shipped tasks' rows, read from beside their YAML whatever the working directory.

lm-eval hands a task's ``dataset_kwargs`` to ``datasets.load_dataset`` as written, and
``datasets`` reads a relative ``data_files`` path from the working directory: a task YAML that
names its files relatively works only when run from its own folder, and an absolute path would
name the machine that built the wheel. ``custom_dataset: !function files.beside`` has lm-eval
call :func:`beside` instead, with the same ``dataset_kwargs``: each file is found here, in a
wheel as in a checkout, for ``lm_eval`` itself as for ``lightning-kd evaluate --lm-eval``.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def beside(data_files: dict[str, str], **_metadata) -> datasets.DatasetDict:
    """Each split of ``data_files`` (``{split: name.jsonl}``, named relative to this folder) as
    a dataset of its JSON lines. lm-eval passes its task metadata too: not needed here."""
    return datasets.DatasetDict(
        {split: datasets.Dataset.from_list(rows(HERE / name)) for split, name in data_files.items()}
    )


def rows(path: Path) -> list[dict]:
    """The JSON objects of ``path``, one a line."""
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
