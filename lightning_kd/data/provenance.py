"""What a run's data is, recorded in its checkpoints so that a resume can check it trains on the
same examples in the same order.

A resume restores where training was (optimizer step, batches into the epoch) and skips that
many batches; with another file, the same file edited, another block size, batch size, split seed
or validation fraction, the skipped batches are not the ones trained on and the validation split
is another — the run would go on with exit 0 on something else. The record holds the settings
that shape the batches (each named when it differs), each file's content digest (so an edited
file is named), and a digest of the training and validation examples themselves (which catches
what the two miss: a tokenizer that splits differently, another reading of the same bytes).

A ``data.dataset`` is recorded by its settings (path, name, split, validation split), the content
digest of each local data file (remembered across runs while a file is unchanged, so a large
corpus is hashed once), and a ``save_to_disk`` folder's fingerprint. A streamed corpus is never
whole in memory: its examples digest is the validation examples'.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_kd.data.dataset_files import local_files
from lightning_kd.data.dataset_source import DatasetSource
from lightning_kd.data.reading import EMBEDDED
from lightning_kd.models.cache_places import remembered_file_digest
from lightning_kd.models.digests import chat_template_digest


def examples_digest(examples: Iterable[Any]) -> str:
    """sha256 over ``examples`` in order: each one's tokens (and labels, for chat examples),
    length-prefixed so that no two sequences of examples share a digest by concatenation."""
    digest = hashlib.sha256()
    for example in examples:
        for tensor in example_tensors(example):
            values = tensor.to(torch.int64).contiguous().numpy()
            digest.update(len(values).to_bytes(8, "little"))
            digest.update(values.tobytes())
    return digest.hexdigest()[:20]


def example_tensors(example: Any) -> list[Tensor]:
    """The tensors that make up one example: its tokens, and its labels where it has its own."""
    if isinstance(example, Tensor):
        return [example]
    return [t for t in (example.tokens, getattr(example, "labels", None)) if t is not None]


def files_record(files: Iterable[Path], names: Mapping[Path, str]) -> dict[str, str]:
    """``name → content digest`` for each file (``names`` gives the embedded corpora their
    short names, so a checkout and an installed wheel record the same thing)."""
    return {names.get(path, str(path)): remembered_file_digest(path)[:20] for path in files}


def source_record(source: DatasetSource) -> dict[str, Any]:
    """What a checkpoint records of ``source`` (``data/provenance.py``): its settings, each local
    data file's content digest, and a saved folder's fingerprint."""
    record = {"path": source.path, "name": source.name, "split": source.split}
    record["val_split"] = source.val_split
    files = {
        str(path): remembered_file_digest(path)[:20]
        for path in local_files(source.path, source.data_files)
    }
    record["data_files"] = files or source.data_files
    if source.saved_folder():
        state = Path(str(source.path)).expanduser() / "state.json"
        record["fingerprint"] = (
            json.loads(state.read_text()).get("_fingerprint") if state.is_file() else None
        ) or folder_fingerprints(Path(str(source.path)).expanduser())
    return record


def folder_fingerprints(folder: Path) -> dict[str, str | None]:
    """Each split's fingerprint of a saved split dict (``dataset_dict.json``'s folders)."""
    found = {}
    for state in sorted(folder.glob("*/state.json")):
        found[state.parent.name] = json.loads(state.read_text()).get("_fingerprint")
    return found


TRAINER_KEYS = {
    "accumulate_grad_batches": "trainer.accumulate_grad_batches",
    "processes": "processes (trainer.devices x trainer.num_nodes)",
    "limit_train_batches": "trainer.limit_train_batches",
    "limit_val_batches": "trainer.limit_val_batches",
}
"""Settings the data record holds that a user sets elsewhere: named by their keys (it said
``data.accumulate_grad_batches``, a key there is not; probe 47)."""


FILE_KEYS = ("files", "val_files", "teacher_answers", "chat_template")
"""The data record's files (``name → digest``): a difference names each file edited, new or
gone. The teacher's answers and a template file were "the same files and settings" giving
other examples, blamed on the tokenizer (probe 55)."""


def data_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``data.<key>: checkpoint …, this run …`` for each setting that differs; the files and the
    dataset by name (an edited file, one added, one gone); the examples only when nothing else
    explains them."""
    if "split_seed" not in saved:  # saved before data.split_seed: data.seed drew its split
        saved = {**saved, "split_seed": saved.get("seed")}
    found = [
        f"{TRAINER_KEYS.get(key, f'data.{key}')}: checkpoint {saved.get(key)!r}, this run {value!r}"
        for key, value in now.items()
        if key not in (*FILE_KEYS, "examples", "dataset") and saved.get(key) != value
    ]
    for key in FILE_KEYS:  # each file named: edited, new or gone
        then_files, now_files = saved.get(key) or {}, now.get(key) or {}
        if key in now and sorted(then_files.values()) != sorted(now_files.values()):
            found.append(f"data.{key}: {files_change(then_files, now_files)}")
    found += dataset_differences(saved.get("dataset"), now.get("dataset"))
    if not found and saved.get("examples") != now.get("examples"):
        found.append(
            "data: the same files and settings give other examples (another tokenizer or "
            "reading of the files)"
        )
    return found


def dataset_differences(then: dict | None, now: dict | None) -> list[str]:
    """How the ``data.dataset`` record differs: its settings by key, its files by name, a saved
    folder's fingerprint."""
    if then is None or now is None:
        return [] if then == now else [f"data.dataset: checkpoint {then!r}, this run {now!r}"]
    found = [
        f"data.dataset.{key}: checkpoint {then.get(key)!r}, this run {value!r}"
        for key, value in now.items()
        if key not in ("data_files", "fingerprint") and then.get(key) != value
    ]
    files = then.get("data_files"), now.get("data_files")
    if all(isinstance(f, dict) for f in files):
        if sorted(files[0].values()) != sorted(files[1].values()):
            found.append(f"data.dataset.data_files: {files_change(*files)}")
    elif files[0] != files[1]:
        found.append(f"data.dataset.data_files: checkpoint {files[0]!r}, this run {files[1]!r}")
    if then.get("fingerprint") != now.get("fingerprint"):
        found.append(
            f"data.dataset: the saved folder's fingerprint is {now.get('fingerprint')!r}, the "
            f"checkpoint's {then.get('fingerprint')!r} (saved again, with other rows)"
        )
    return found


def files_change(then: dict[str, str], now: dict[str, str]) -> str:
    """How the data files changed, by name: edited, added, gone (a moved copy is the same)."""
    moved = set(then.values()) & set(now.values())
    edited = [n for n in now if n in then and then[n] != now[n]]
    added = [n for n in now if n not in then and now[n] not in moved]
    gone = [n for n in then if n not in now and then[n] not in moved]
    changes = {"edited": edited, "new": added, "gone": gone}
    return "; ".join(f"{label} {names}" for label, names in changes.items() if names)


def text_record(data: Any) -> dict[str, Any]:
    """What a checkpoint records of a set-up ``TextDataModule`` (or ``ChatDataModule``): the
    settings that shape the batches, the files' (or the dataset's) digests, the examples' digest
    (streamed: the validation examples')."""
    names = {path: name for name, path in EMBEDDED.items()}
    found = {
        "block_size": data.block_size,
        "batch_size": data.batch_size,
        "pack": data.pack,
        "seed": data.seed,
        "split_seed": data.split_seed,
        "val_fraction": data.val_fraction,
        "max_train_examples": data.max_train_examples,
        "text_field": data.text_field,
        "files": files_record(data.files, names),
        "examples": examples_digest([*data.train_examples, *data.val_examples]),
    }
    # Only where used: a checkpoint of data.files, saved before these existed, stays equal.
    if data.dataset.given:
        found["dataset"] = source_record(data.dataset)
    if data.val_files is not None:
        found["val_files"] = files_record(data.val_files, names)
    if getattr(data, "domains", None) is not None:  # which rows each teacher teaches
        found["domains"] = {
            "names": list(data.domains.names),
            "train": data.train_domains,
            "val": data.val_domains,
        }
    if data.streaming:
        found |= {"streaming": True, "val_size": data.val_size}
        found["shuffle_buffer"] = data.shuffle_buffer
    return found


def chat_record(data: Any) -> dict[str, Any]:
    """What a checkpoint records of a ``ChatDataModule`` besides :func:`text_record`: the
    teacher's answers file (none: empty) and the chat template, as :data:`FILE_KEYS` records,
    by content digest (a template by its file, its shipped name, or as given inline)."""
    answers = data.teacher_answers
    template = chat_template_digest(data.tokenizer)  # a chat module's tokenizer has one
    return {
        "teacher_answers": files_record([answers], {}) if answers is not None else {},
        "chat_template": {template_name(data.template_setting): template},
    }


def template_name(setting: str | None) -> str:
    """How a record names the chat template ``data.chat_template`` gave."""
    if setting is None:
        return "the tokenizer's"
    if "{{" in setting or "{%" in setting:
        return "the template given inline"
    return setting
