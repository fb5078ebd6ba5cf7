"""Reading ``data.files``: format by suffix, every error at its file and line, duplicates out.

- Entries are paths, glob patterns, or the embedded corpora's names (``python_reference``,
  ``smollm2_generated``); ``data.files: null`` reads both embedded corpora.
- The format comes from the name's suffix alone: ``.txt`` (one document per file), ``.jsonl``
  (one JSON object per line), each optionally ``.gz``. ``notes.txt.jsonl`` is JSON lines.
- A UTF-8 byte-order mark at a file's start is dropped (Notepad saves one).
- A byte that is not UTF-8, a broken gzip stream, a line that is not JSON, a record without the
  text field or whose text is not a string: each is a ``ValueError`` naming ``file:line``.
- The same file named twice (same resolved path, or identical content under another name, as
  overlapping globs produce) is read once, with a warning; exact duplicate documents are kept
  once, with a warning saying how many went, so no text sits in both training and validation.
"""

from __future__ import annotations

import glob
import gzip
import json
import warnings
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from lightning_kd.data.errors import DataError, MissingData, json_problem
from lightning_kd.data.file_hints import field_hint, file_fault, has_text
from lightning_kd.data.rendered_chat import note_rendered_chat
from lightning_kd.models.cache_places import remembered_file_digest

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".txt.gz": "txt", ".jsonl.gz": "jsonl"}
"""Suffix → format; a name must end with one of these."""


BOM = "\ufeff"
"""The UTF-8 byte-order mark, dropped from the start of a file."""

DEFAULT_CORPUS = Path(__file__).parent / "corpus" / "python_reference.jsonl.gz"
"""The Python 3.11 Language Reference (see ``lightning_kd/data/corpus/README.md``)."""
TEACHER_CORPUS = Path(__file__).parent / "corpus" / "smollm2_generated.jsonl.gz"
"""General English written by the default teacher itself (``data/corpus/README.md``)."""
DEFAULT_FILES = (DEFAULT_CORPUS, TEACHER_CORPUS)
"""What ``data.files: null`` reads: technical prose and the teacher's own broad English."""
EMBEDDED = {"python_reference": DEFAULT_CORPUS, "smollm2_generated": TEACHER_CORPUS}
"""Names that ``data.files`` entries may use for the embedded corpora."""

SUFFIXES = tuple(FORMATS)


def expand_files(patterns: list[str | Path] | str | Path, key: str = "data.files") -> list[Path]:
    """The files named by ``patterns`` — paths, globs, or the names of the embedded corpora
    (``python_reference``, ``smollm2_generated``); one string is one of them
    (``data.files=notes.txt``, which was read letter by letter) — checked to exist and be
    readable here; the errors name ``key``, the setting that gave them (``--files``)."""
    files: list[Path] = []
    for given in [patterns] if isinstance(patterns, str | Path) else patterns:
        pattern = str(given)  # a Path from Python: a TypeError in the glob check (probe 58)
        if pattern in EMBEDDED:
            files.append(EMBEDDED[pattern])
            continue
        # ``**``: any depth, as bash's globstar and datasets' data_files read it
        expanded = str(Path(pattern).expanduser())
        matches = sorted(glob.glob(expanded, recursive=True)) if _is_glob(pattern) else []
        if _is_glob(pattern) and not matches:
            raise MissingData(f"{key} pattern {pattern!r} matches no file")
        for name in matches or [pattern]:
            path = Path(name).expanduser()
            if not path.is_file():
                raise MissingData(not_a_file(key, name, path))
            if fault := file_fault(key, name, SUFFIXES, file_format(path) is not None):
                raise DataError(fault)
            files.append(path)
    return unique_files(files)


def not_a_file(key: str, name: str, path: Path) -> str:
    """Why ``key``'s entry ``name`` cannot be read: it does not exist, or it is a directory —
    whose files a glob names (one entry per file is what a user tried to save typing)."""
    if not path.exists():
        return f"{key} entry {name!r} does not exist"
    if path.is_dir():
        pattern = str(Path(name) / f"*{_commonest_suffix(path)}")
        return f"{key} entry {name!r} is a directory; name its files with a glob, e.g. {pattern!r}"
    return f"{key} entry {name!r} is not a file"


def _commonest_suffix(directory: Path) -> str:
    """The readable suffix most files directly in ``directory`` have (``.txt`` when none, or
    when the directory cannot be listed)."""
    try:
        names = [child.name for child in directory.iterdir()]
    except OSError:
        names = []
    found = Counter(next((s for s in SUFFIXES if n.endswith(s)), None) for n in names)
    found.pop(None, None)
    return found.most_common(1)[0][0] if found else ".txt"


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def file_format(path: Path) -> str | None:
    """``txt`` or ``jsonl`` from ``path``'s suffix (``.gz`` allowed after it), else None."""
    for suffix, kind in FORMATS.items():
        if path.name.endswith(suffix):
            return kind
    return None


def _decode(data: bytes, path: Path, line: int) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line += data[: err.start].count(b"\n")
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(
            f"{path}:{line}: byte 0x{data[err.start]:02x} at column {column} is not UTF-8; "
            "re-encode the file as UTF-8 (e.g. iconv -t utf-8)"
        ) from None
    # A byte-order mark (Notepad saves one) is not text: JSON refuses it, and a .txt would train
    # on it. Only a file's first line can start with one.
    return text.removeprefix(BOM) if line == 1 else text


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Each line of ``path`` (gunzipped where its name ends in .gz) with its number; a file that
    is not the gzip its name says (cut short, or not compressed) refused at the line reached.
    Chat rows, prompts and the scan for cut rows read it unwrapped: a traceback (probe 52)."""
    number = 0
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                yield number, raw
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataError(
            f"{path}:{number + 1}: not a readable gzip file ({type(err).__name__}: {err}); "
            "check the file, or drop .gz from a name whose content is not compressed"
        ) from None


def read_documents(
    path: Path, text_field: str = "text", key: str = "data.text_field"
) -> Iterator[str]:
    """The documents in one file: the whole of a .txt, each line's ``text_field`` of a .jsonl
    (``key``: the setting that names the field, in errors)."""
    return (text for _, text in numbered_documents(path, text_field, key))


def numbered_documents(
    path: Path, text_field: str = "text", key: str = "data.text_field"
) -> Iterator[tuple[int, str]]:
    """:func:`read_documents` with each document's line (1 for a .txt, the whole file)."""
    kind = file_format(path)
    if kind is None:
        raise DataError(f"{path}: name a .txt or .jsonl file (optionally .gz)")
    if kind == "txt":
        yield 1, _decode(b"".join(raw for _, raw in numbered_lines(path)), path, 1)
        return
    for number, raw in numbered_lines(path):
        line = _decode(raw, path, number)
        if line.strip():
            yield number, _record_text(line, path, number, text_field, key)


def read_records(path: Path) -> Iterator[tuple[int, dict]]:
    """Each non-blank line of a .jsonl file (optionally .gz) as ``(line number, object)``."""
    if file_format(path) != "jsonl":
        raise DataError(f"{path}: chat data is read from .jsonl files (one conversation a line)")
    for number, raw in numbered_lines(path):
        line = _decode(raw, path, number)
        if not line.strip():
            continue
        try:
            record = json.loads(line.rstrip("\r\n"))  # a string cut short is not a newline's fault
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number} is not valid JSON ({json_problem(err)})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number} holds {type(record).__name__}, not an object")
        yield number, record


def _record_text(line: str, path: Path, number: int, text_field: str, key: str) -> str:
    try:
        record = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{number} is not valid JSON ({json_problem(err)})") from None
    if not isinstance(record, dict) or text_field not in record:
        raise DataError(f"{path}:{number} has no {text_field!r} field; " + field_hint(record, key))
    text = record[text_field]
    if not isinstance(text, str):
        raise DataError(
            f"{path}:{number}: field {text_field!r} holds {type(text).__name__} "
            f"{json.dumps(text)[:40]}, not a string; give every record text, or set "
            f"{key} to the key holding it"
        )
    return text


def unique_files(paths: list[Path]) -> list[Path]:
    """``paths`` without repeats of one file (same resolved path or identical bytes), warning
    about each repeat (overlapping globs, a copy under another name)."""
    seen: dict[object, Path] = {}
    kept = []
    for path in paths:
        resolved = path.resolve()
        key = (path.stat().st_size, remembered_file_digest(path))
        first = seen.get(resolved) or seen.get(key)
        if first is not None:
            how = "the same file as" if first.resolve() == resolved else "identical in content to"
            warnings.warn(f"data.files: {path} is {how} {first}: read once", stacklevel=2)
            continue
        seen[resolved] = seen[key] = path
        kept.append(path)
    return kept


def warn_repeats(count: int, total: int, examples: list | None = None, what="document") -> None:
    """Say that ``count`` of ``total`` documents (``what``) were repeats, gone (``examples``)."""
    if count == 0:
        return
    where = f"; e.g. {', '.join(examples[:3])}" if examples else ""
    warnings.warn(
        f"data: removed {count} duplicate {what}(s) of {total} (identical text), so no text "
        f"is both trained on and validated on as a whole {what}{where}",
        stacklevel=3,
    )


def place_name(path: Path) -> str:
    """How a row's place names ``path``: an embedded corpus by its name (``smollm2_generated``),
    the same wherever the package is installed; any other file by its path."""
    return next((name for name, own in EMBEDDED.items() if own == path), str(path))


def distinct_documents(files: list[Path], text_field: str = "text") -> list[tuple[str, str]]:
    """``(file:line, text)`` of each distinct, non-blank document of ``files`` in reading order
    (a repeat dropped, with a warning), refused when there is none. An embedded corpus is named
    by its name (``smollm2_generated:190``): the same wherever the package is installed."""
    names = {path: name for name, path in EMBEDDED.items()}
    read = [
        (f"{place_name(path)}:{number}", text, path)
        for path in files
        for number, text in numbered_documents(path, text_field)
    ]
    read = [(place, text, path) for place, text, path in read if has_text(text)]  # blanks out
    for _, text, _ in read:
        note_rendered_chat(text)
    with_text = {path for _, _, path in read}
    blank = [str(path) for path in files if path not in with_text]
    if not read:
        raise DataError(f"no text in {blank}: empty, or only whitespace or NULs (zero-filled?)")
    where: dict[str, str] = {}
    repeats = []
    for place, text, path in read:
        first = where.setdefault(text, place)
        if first != place and path not in names:
            repeats.append(f"{place} repeats {first}")
    # The shipped corpus's one repeat (two Python reference topics of one text) is said in its
    # README, not to every default run. Blank documents are no repeats: they are left out first.
    warn_repeats(len(repeats), len(read), repeats)
    documents = [(where[text], text) for text in where]
    if blank:  # a file named to be read gave nothing: a wrong file, or a failed download
        warnings.warn(f"data: {blank} hold no text (empty, whitespace or NULs only)", stacklevel=2)
    return documents


def rows_naming(files: list[Path], key: str) -> Iterator[dict]:
    """The ``.jsonl`` rows of ``files`` whose line names ``key``: only those lines are parsed, so
    a corpus without it costs one search a line (one that is not JSON is refused where the
    documents are read)."""
    needle = f'"{key}"'.encode()
    for path in files:
        if file_format(path) != "jsonl":
            continue
        for number, raw in numbered_lines(path):
            if needle not in raw:
                continue
            try:
                record = json.loads(_decode(raw, path, number))
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and key in record:
                yield record


def cut_texts(files: list[Path], text_field: str = "text") -> set[str]:
    """The texts (under ``text_field``) of the rows of ``files`` marked ``"finished": false``
    (``generate``'s continuations cut at its token budget: ``cut_ends.py``)."""
    rows = rows_naming(files, "finished")
    cut = (row.get(text_field) for row in rows if row["finished"] is False)
    return {text for text in cut if isinstance(text, str)}


def prompt_lines(files: list[Path]) -> set[str]:
    """The documents (``file:line``) the rows of ``files`` continue: ``generate``'s
    ``prompt_line`` of a text continuation."""
    lines = (row["prompt_line"] for row in rows_naming(files, "prompt_line"))
    return {line for line in lines if isinstance(line, str)}
