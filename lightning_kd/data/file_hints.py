"""What to do with a file or a row that ``data.files`` (or ``evaluate --files``) does not read.

Both read ``.txt`` and ``.jsonl`` text (gzipped or not). A parquet, CSV or Arrow file is
``data.dataset``'s to read, and a row of chat is ``data=chat``'s; ``evaluate --files``, which
takes no config, was told the same ("read chat rows with data=chat"), advice it cannot take
(probe 46).
"""

from __future__ import annotations

from pathlib import Path

from lightning_kd.data.conversations import is_conversation

EVALUATE = "--text-field"
"""The setting ``evaluate --files`` names its text field by: the key its errors come with."""
BUILDERS = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".arrow": "arrow"}
"""The ``datasets`` builder of a table file (its suffix)."""


def file_fault(key: str, name: str, suffixes: tuple[str, ...], readable: bool) -> str | None:
    """Why the file ``name`` (an entry of ``key``) is not read: a name that is not UTF-8 (its
    bytes kept as surrogates, which failed as a ``UnicodeEncodeError`` naming no file: probe
    48), or a format not ``readable`` (:func:`format_hint`); None where it is read."""
    try:
        name.encode()
    except UnicodeEncodeError:
        shown = name.encode(errors="surrogateescape").decode(errors="backslashreplace")
        return f"{key} entry {shown}: its name is not UTF-8; rename the file"
    return None if readable else format_hint(key, name, suffixes)


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
