"""Map-style datasets tokenized once, with a progress bar, and reused by every later run.

``Dataset.map`` writes each row's tokens into ``cache_root()/tokenized/<key>.arrow``, and a run
whose key names an existing file reads it instead of tokenizing. The key is a digest of all the
tokens depend on: the dataset (``datasets``' fingerprint of it, and the content digests of its
local files, so an edited file is a new key even where its fingerprint would not change), the
columns read, the tokenizer's whole definition (``tokenizer_digest``), the chat template and
fields for chat rows, and this format's version. The block size, packing, the split and the
limits are not in it: they are applied afresh each run to the cached per-row tokens (milliseconds),
so changing them can never reuse a stale layout. Writers of one key take a file lock (several
ranks set up at once); each writes in a folder of its own, moved into place whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from torch import Tensor

from lightning_kd.data.dataset_hints import unreadable
from lightning_kd.data.dataset_source import DatasetSource
from lightning_kd.data.encoding import text_ids
from lightning_kd.data.errors import DataError, described
from lightning_kd.data.provenance import source_record
from lightning_kd.data.reading import warn_repeats
from lightning_kd.data.rendered_chat import note_rendered_chat
from lightning_kd.data.token_bytes import separator_id
from lightning_kd.models.cache_places import cache_root, remembered_file_digest
from lightning_kd.models.digests import tokenizer_digest
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.disk import disk_errors
from lightning_kd.utils.refusal import Refused

FORMAT = 4
"""Bumped when what a cached row holds changes (older files are then never read): 4, a table's
null struct keys left out of chat rows (probe 46)."""
DIRECTORY = "tokenized"
PARTIAL = ".partial"
"""The suffix of the folder a key's file is written in before it is moved into place."""
STALE_SECONDS = 24 * 3600
"""Age past which a temporary file of ``datasets`` beside the cache is a dead write's."""
READ_ROWS = 1024
"""Rows read back from a cached file at a time."""


def cache_key(dataset, parts: dict[str, Any]) -> str:
    """The cache key of ``dataset`` tokenized as ``parts`` describes (JSON-able values)."""
    # datasets' fingerprint is its identity of the data (files and their times, a saved
    # folder's state); the private attribute is the only way to read it.
    key = parts | {"dataset": dataset._fingerprint, "format": FORMAT}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def cache_path(key: str) -> Path:
    return cache_root() / DIRECTORY / f"{key}.arrow"


def tokenized(
    dataset,
    function: Callable[..., dict],
    fn_kwargs: dict[str, Any],
    key: str,
    desc: str,
    source: DatasetSource,
):
    """``dataset`` (of ``source``) mapped by ``function(batch, indices, **fn_kwargs)`` into the
    cached file of ``key`` (read back when it exists); its own columns dropped. The map writes
    in a folder of its own, ``<key>.partial``, moved into place whole: a write that fails (a
    full disk) or is killed leaves nothing there that a later run does not remove. Bytes that
    are not UTF-8 are refused at their line (``datasets``' JSON reader keeps them unchecked)."""
    from datasets import Dataset

    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        drop_if_damaged(path)
        if not path.exists():
            try:
                with disk_errors(path, "run the same command again"):
                    mapped_into(dataset, function, fn_kwargs, path, desc)
                    atomic_write_bytes(receipt_of(path), remembered_file_digest(path).encode())
            except UnicodeDecodeError as err:
                raise unreadable(source, fn_kwargs["where"], err) from None
        sweep_partials(path.parent)
        return Dataset.from_file(str(path))


def receipt_of(path: Path) -> Path:
    """The file beside a cached ``path`` holding the sha256 it was written with."""
    return path.with_suffix(".sha256")


def drop_if_damaged(path: Path) -> None:
    """Remove the cached ``path`` where its bytes are not those it was written with (cut short,
    overwritten), saying so: it is written again. A damaged entry failed every later run on that
    data with pyarrow's traceback naming no file, or was read as token ids of -1 and blamed on
    the tokenizer (probe 48). An entry written before receipts were is read as it is."""
    receipt = receipt_of(path)
    if (
        not (path.exists() and receipt.exists())
        or remembered_file_digest(path) == receipt.read_text()
    ):
        return
    warnings.warn(
        f"{path}: a tokenized cache entry whose bytes changed since it was written (cut short, "
        "or overwritten): tokenizing its data again",
        stacklevel=3,
    )
    path.unlink()
    receipt.unlink()


def mapped_into(dataset, function, fn_kwargs: dict[str, Any], path: Path, desc: str) -> None:
    """Write ``dataset`` mapped by ``function`` into ``path``, through its partial folder."""
    work = path.with_suffix(PARTIAL)
    shutil.rmtree(work, ignore_errors=True)  # a dead run's: this key's lock is held
    work.mkdir()
    try:
        dataset.map(
            function,
            batched=True,
            with_indices=True,
            fn_kwargs=fn_kwargs,
            remove_columns=dataset.column_names,
            cache_file_name=str(work / "rows.arrow"),
            load_from_cache_file=False,
            desc=desc,
        )
        os.replace(work / "rows.arrow", path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sweep_partials(directory: Path) -> None:
    """Remove the partial folders of writes that died (their key's lock is free), and the
    temporary files ``datasets`` left beside the cache before partial folders were used."""
    for work in directory.glob(f"*{PARTIAL}"):
        lock = FileLock(f"{work.with_suffix('.arrow')}.lock", timeout=0)
        try:
            with lock:
                shutil.rmtree(work, ignore_errors=True)
        except Timeout:
            continue  # being written now
    for stale in directory.glob("tmp*"):
        if time.time() - stale.stat().st_mtime > STALE_SECONDS:
            stale.unlink(missing_ok=True)


def rows(dataset) -> Iterator[dict[str, Any]]:
    """Each row of a (cached) dataset, read :data:`READ_ROWS` at a time."""
    for batch in dataset.iter(batch_size=READ_ROWS):
        names = list(batch)
        for values in zip(*(batch[name] for name in names), strict=True):
            yield dict(zip(names, values, strict=True))


def text_key(text: str) -> str:
    """A document's identity: the digest of its text (repeats are kept once)."""
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def checked_text(text: Any, field: str, where: str) -> str:
    """``text`` when it is a string, and a null as a blank (left out, as an empty cell is: a
    null is parquet's and Arrow's missing cell, refused where "" was left out; probe 37); else
    refused, naming the row and the fix."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise DataError(
            f"{where}: column {field!r} holds {described(text)}, not a string; give "
            "every row text, or set data.text_field to the column holding it"
        )
    note_rendered_chat(text)
    return text


def streamed_tokens(
    tokenizer, row: dict, field: str, pack: bool, where: str
) -> tuple[str, Tensor | None]:
    """A streamed row's text (its ``field``) and tokens: followed by the separator when packed,
    a padded example of two tokens or more when not; None for a blank row (left out, as a blank
    document is). A packed row marked ``"finished": false`` is refused: read whole, the
    separator after it is no target (``cut_ends.py``); a stream has no way to leave it out, and
    scored, it taught a document's end at the teacher's token budget (probe 46)."""
    text = checked_text(row.get(field), field, where)
    if not text.strip():
        return text, None
    tokens = text_ids(tokenizer, [text])[0]
    if not pack:
        return text, torch.tensor(tokens) if len(tokens) >= 2 else None
    if row.get("finished") is False:
        raise DataError(
            f'{where} is marked "finished": false (a continuation generate cut at its token '
            "budget), whose document separator a packed stream would score as the end of the "
            "text; read the dataset whole (data.streaming=false), which leaves it unscored, or "
            "set data.pack=false"
        )
    return text, torch.tensor([*tokens, separator_id(tokenizer)])


def document_tokens(
    batch: dict[str, list], indices: list[int], tokenizer, field: str, where: str
) -> dict[str, list]:
    """A batch of rows' documents as tokens, each with its text's digest ("" for a blank one,
    which is left out like a blank document of ``data.files``)."""
    texts = [
        checked_text(text, field, f"{where} row {i}")
        for text, i in zip(batch[field], indices, strict=True)
    ]
    kept = [text if text.strip() else "" for text in texts]
    return {
        "input_ids": text_ids(tokenizer, kept),
        "text_key": [text_key(text) if text else "" for text in kept],
    }


def split_documents(
    dataset, tokenizer, field: str, where: str, source: DatasetSource
) -> list[tuple[str, list[int]]]:
    """Each distinct non-blank document of ``dataset``'s ``field`` column, in row order, as its
    key and tokens: tokenized once into the cache, read back from it after (see the module doc).
    Repeats are kept once, with a warning that counts them, as for ``data.files``."""
    parts = {"kind": "text", "field": field, "tokenizer": tokenizer_digest(tokenizer)}
    parts["source"] = source_record(source)
    options = {"tokenizer": tokenizer, "field": field, "where": where}
    key, desc = cache_key(dataset, parts), f"tokenizing {where}"
    mapped = tokenized(dataset, document_tokens, options, key, desc, source)
    documents: dict[str, list[int]] = {}
    repeats = 0
    for row in rows(mapped):
        if row["text_key"] in documents:
            repeats += 1
        elif row["text_key"]:
            documents[row["text_key"]] = row["input_ids"]
    warn_repeats(repeats, len(documents) + repeats)
    if not documents:
        raise Refused(
            f"{where} holds no text (every row's {field!r} is blank); point data.dataset at text"
        )
    return list(documents.items())
