"""What to do with a file or a row that ``data.files`` (or ``evaluate --files``) does not read.

Both read ``.txt`` and ``.jsonl`` text (gzipped or not). A parquet, CSV or Arrow file is
``data.dataset``'s to read, and a row of chat is ``data=chat``'s; ``evaluate --files``, which
takes no config, was told the same ("read chat rows with data=chat"), advice it cannot take
(probe 46). A generation's output that it has not finished is not read as a whole corpus.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from lightning_kd.data.conversations import is_conversation

EVALUATE = "--text-field"
"""The setting ``evaluate --files`` names its text field by: the key its errors come with."""
BUILDERS = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".arrow": "arrow"}
"""The ``datasets`` builder of a table file (its suffix)."""


def file_fault(key: str, name: str, suffixes: tuple[str, ...], readable: bool) -> str | None:
    """Why the file ``name`` (an entry of ``key``) is not read: a name that is not UTF-8 (its
    bytes kept as surrogates, which failed as a ``UnicodeEncodeError`` naming no file: probe
    48), a format not ``readable`` (:func:`format_hint`), or an unfinished generation's output
    (:func:`unfinished_generation`); None where it is read."""
    try:
        name.encode()
    except UnicodeEncodeError:
        shown = name.encode(errors="surrogateescape").decode(errors="backslashreplace")
        return f"{key} entry {shown}: its name is not UTF-8; rename the file"
    return unfinished_generation(key, name) if readable else format_hint(key, name, suffixes)


def generation_record(output: Path) -> Path:
    """The record ``generate`` keeps beside its ``output`` (``completions.meta.json`` beside
    ``completions.jsonl``): its settings, and :data:`PROMPTS` and :data:`FINISHED`."""
    return output.with_name(f"{output.stem}.meta.json")


PROMPTS, FINISHED = "prompts", "finished"
"""The record's progress keys: how many prompts the generation answers, and whether it has
answered them all (``generation/completions_record.mark_progress`` writes them)."""


def unfinished_generation(key: str, name: str) -> str | None:
    """Why the file ``name`` is not read as it is: the output of a ``generate`` that stopped
    before answering every prompt, as the record beside it says. It was trained on as the whole
    corpus (8 of 113 answers) without a word, after a preempted generate (probe 59)."""
    meta = generation_record(Path(name).expanduser())
    try:
        record = json.loads(meta.read_text(encoding="utf-8")) if meta.is_file() else {}
    except (OSError, ValueError):  # whether it finished is unknown (verify 60)
        return (
            f"{key} entry {name}: {meta.name} beside it cannot be read, so whether its generation "
            f"answered every prompt is unknown; restore it, or delete {meta} to read the "
            "answers the file holds"
        )
    if not isinstance(record, dict) or record.get(FINISHED) is not False:
        return None
    return (
        f"{key} entry {name}: a generation stopped before answering its {record.get(PROMPTS)} "
        f"prompts ({meta.name} beside it says so). Run its generate command again to finish it "
        f"(it goes on where it stopped), or delete {meta} to read the answers it holds"
    )


def format_hint(key: str, name: str, suffixes: tuple[str, ...]) -> str:
    """Why ``name`` (an entry of ``key``) is not read, and what reads a table file."""
    said = f"{key} entry {name!r}: use one of {', '.join(suffixes)}"
    builder = BUILDERS.get(Path(name).suffix)
    if builder is None:
        return said
    if key == "--files":
        tabs = ", sep='\\t'" if name.endswith(".tsv") else ""
        return (
            f"{said}; a {builder} file's text column can be written as JSON lines first: python "
            f"-c \"import datasets; datasets.Dataset.from_{builder}('{name}'{tabs}).to_json("
            f"'{Path(name).stem}.jsonl')\""
        )
    return (
        f"{said}; a {builder} file is read with data.dataset.path={builder} "
        f"data.dataset.data_files={name}"
    )


def conversation_hint(key: str) -> str:
    """What reads a row of chat, given as text to ``key``'s reader."""
    if key == EVALUATE:
        return (
            "it holds a conversation: evaluate --files scores text; a model's answers to chat "
            "prompts are judged with evaluate --prompts FILE --teacher MODEL"
        )
    return "it holds a conversation: read chat rows with data=chat (answers scored)"


def field_hint(record: object, key: str) -> str:
    """What to do with a ``.jsonl`` row that has no text field named by ``key``."""
    return (
        conversation_hint(key)
        if is_conversation(record)
        else f"set {key} to the key holding the text"
    )


def has_text(document: str) -> bool:
    """Whether ``document`` holds text: not only whitespace, and not only control characters.
    A file zero-filled by a crash or a failed copy is valid UTF-8, 65,536 NULs, and was trained
    on as a corpus of them without a word (probe 59)."""
    return bool(document.strip()) and not all(unicodedata.category(c) == "Cc" for c in document)
