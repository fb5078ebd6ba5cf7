"""The data settings, checked before anything loads.

:func:`data_setting_errors` (part of every config check, ``checks.py``): data settings that cannot
go together — ``data.dataset`` with ``data.files``, streaming without a dataset, ``data.val_files``
with a dataset or chat data, on-policy KD without chat prompts — and what a stream cannot serve
(the block-wise repair, a teacher cache, a run without ``trainer.max_steps``).
:func:`data_file_errors`: the files ``data.files`` and ``data.val_files`` name, found and of a
readable kind. :func:`dataset_errors` (the commands that read data): ``data.dataset`` opened,
streamed, to check the splits it reads exist, hold rows and hold the columns the data module reads;
nothing is prepared or tokenized, so a bad split or column costs a second, not a model load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import OmegaConf

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.dataset_columns import source_errors
from lightning_kd.data.dataset_source import DatasetSource, setting_errors
from lightning_kd.data.errors import DataError
from lightning_kd.data.held_out import val_files_errors
from lightning_kd.data.reading import expand_files
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.utils.refusal import is_number


def data_source(data: Mapping) -> DatasetSource:
    """``data.dataset`` of a ``data`` config node."""
    dataset = data.get("dataset")
    if OmegaConf.is_config(dataset):
        dataset = OmegaConf.to_container(dataset, resolve=True)
    return DatasetSource.of(dataset)


def data_setting_errors(cfg: Mapping) -> list[str]:
    """Data settings that cannot go together, and what a streamed corpus cannot serve."""
    data = lookup(cfg, "data")
    if not isinstance(data, Mapping):
        return []
    try:
        source = data_source(data)
    except ValueError as err:  # an unknown data.dataset key
        return [str(err)]
    streaming = data.get("streaming") is True
    limit = data.get("max_train_examples")
    errors = setting_errors(source, data.get("files"), streaming, limit, data.get("num_workers"))
    if data.get("val_files") is not None:
        errors += val_files_errors(data["val_files"], source, streaming, is_chat_data(data))
    errors += on_policy_errors(cfg, data) + (chat_cache_errors(cfg) if is_chat_data(data) else [])
    return errors + (stream_errors(cfg) if streaming else [])


def given_caches(cfg: Mapping) -> list[tuple[str, object]]:
    """``(key, directory)`` of each teacher cache ``cfg`` names (``distill.teacher_cache``, a
    ``teachers`` entry's ``cache``), ``auto`` and null left out: they decide for themselves."""
    found = [("distill.teacher_cache", lookup(cfg, "distill.teacher_cache"))]
    entries = lookup(cfg, "teachers")
    if isinstance(entries, Sequence) and not isinstance(entries, str):
        found += [
            (f"teachers.{index}.cache", entry.get("cache"))
            for index, entry in enumerate(entries)
            if isinstance(entry, Mapping)
        ]
    return [(key, cache) for key, cache in found if cache not in (None, "auto", ABSENT)]


def chat_cache_errors(cfg: Mapping) -> list[str]:
    """A teacher cache holds plain text blocks: chat data given one was refused only once the
    teacher had loaded, as a traceback (a ``teachers`` entry's: probe 44)."""
    return [
        f"{key}={cache!r} with chat data: a teacher cache holds plain text blocks; set "
        f"{key}=null (auto keeps the teacher online for chat data)"
        for key, cache in given_caches(cfg)
    ]


def is_chat_data(data: Mapping) -> bool:
    """Whether a ``data`` config node builds chat data (``ChatDataModule`` or a subclass)."""
    target = data.get("_target_")
    return isinstance(target, str) and issubclass(get_class(target), ChatDataModule)


def on_policy_errors(cfg: Mapping, data: Mapping) -> list[str]:
    """On-policy KD completes each row's prompt, the tokens before its first scored one: text
    rows are scored from their first token, and a packed chat block may start inside an answer.
    Either failed at the first sampled micro-batch, and again on every resume."""
    rate = lookup(cfg, "distill.on_policy")
    if not is_number(rate) or rate <= 0:
        return []
    if not is_chat_data(data):
        target = data.get("_target_")
        return [
            f"distill.on_policy={rate} with text data (data._target_={target}): on-policy KD "
            "completes each row's prompt, and text rows have none; use chat data (data=chat, "
            "data.pack=false), or set distill.on_policy=0"
        ]
    if data.get("pack") is True:
        return [
            f"distill.on_policy={rate} with data.pack=true: a packed block can start inside an "
            "answer, with no prompt to complete; set data.pack=false"
        ]
    return []


def stream_errors(cfg: Mapping) -> list[str]:
    """What ``data.streaming=true`` cannot go with, each with the setting to change."""
    errors = []
    passes = lookup(cfg, "distill.blockwise_passes")
    if isinstance(passes, int) and not isinstance(passes, bool) and passes > 0:
        errors.append(
            f"distill.blockwise_passes={passes} with data.streaming=true: the block-wise repair "
            "passes over a fixed set of training blocks, which a stream never holds; set "
            "distill.blockwise_passes=0"
        )
    errors += [
        f"{key}={cache!r} with data.streaming=true: a cache holds the teacher's records of "
        f"fixed blocks; set {key}=null (auto keeps the teacher online for a stream)"
        for key, cache in given_caches(cfg)
    ]
    steps = lookup(cfg, "trainer.max_steps")
    if steps in (-1, None):
        errors.append(
            f"trainer.max_steps={steps} with data.streaming=true: a stream is read pass after "
            "pass without end, and max_steps ends the run; set trainer.max_steps (e.g. 1000)"
        )
    return errors


def dataset_errors(cfg: Mapping) -> list[str]:
    """``data.dataset`` opened (streamed, nothing prepared): its splits, rows and columns."""
    data = lookup(cfg, "data")
    if not isinstance(data, Mapping) or data_setting_errors(cfg):
        return []  # nothing to open, or settings already refused
    source = data_source(data)
    if not source.given:
        return []
    module: Any = get_class(data["_target_"])
    return source_errors(source, module.dataset_columns(data))


def data_file_errors(cfg: Mapping) -> list[str]:
    """The files ``data.files`` and ``data.val_files`` name: each there, a file, of a kind the
    data module reads. The data module refused a missing one as it was built, which in a ``-m``
    sweep was once the jobs before it had trained (probe 37)."""
    data = lookup(cfg, "data")
    if not isinstance(data, Mapping) or data_setting_errors(cfg) or data_source(data).given:
        return []  # nothing to find, settings already refused, or a dataset's files
    errors = []
    for key in ("files", "val_files"):
        patterns = data.get(key)
        if patterns is None:
            continue
        # each entry on its own: all refused at once (the first alone was, then the next)
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            try:
                expand_files([pattern], f"data.{key}")
            except DataError as error:
                errors.append(relative_note(str(error), pattern))
    return errors


def relative_note(error: str, pattern: object) -> str:
    """``error`` of a relative entry that names nothing here, with the directory it was read
    from: from another directory, the same words named no place (probe 58)."""
    relative = isinstance(pattern, str) and not Path(pattern).expanduser().is_absolute()
    missing = "does not exist" in error or "matches no file" in error
    return f"{error} (read from {Path.cwd()})" if relative and missing else error
