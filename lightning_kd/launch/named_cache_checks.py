"""A teacher cache a run names (``distill.teacher_cache=DIR``, a ``teachers`` entry's
``cache: DIR``) that holds no complete cache: refused before any model loads, with the command
that writes it. Found by the cache reader, it was refused once the data was tokenized and the
teachers had loaded (56 s for ``experiment=two_teachers``, probe 38). Whether a complete cache
is *this run's* (its teacher's weights, tokenizers, data) is the reader's to say, once the
teacher is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lightning_kd.cache.reader import CacheError, read_index
from lightning_kd.distill.teacher_entries import TeacherEntry
from lightning_kd.distill.teacher_sources import entry_cache_command, reader_finding
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.launch.teacher_list import config_entries

NAMED_NONE = (None, ABSENT, "auto")


def named_cache_errors(cfg: Mapping) -> list[str]:
    """Each cache directory ``cfg`` trains from that holds no complete teacher cache."""
    errors, main = [], lookup(cfg, "distill.teacher_cache")
    if error := cache_dir_error(main):
        errors.append(f"distill.teacher_cache={main}: {error}")
    entries, problems = config_entries(cfg)  # an entry that does not read: named elsewhere
    for index, entry in enumerate([] if problems else entries):
        if not entry.main and (error := cache_dir_error(entry.cache)):
            errors.append(entry_error(cfg, index, entry, error))
    return errors


def cache_dir_error(directory: object) -> CacheError | None:
    """Why ``directory`` holds no complete cache (the reader's refusal), None where it does or
    where nothing is named (null, auto; another type is the rules' to name)."""
    if directory in NAMED_NONE or not isinstance(directory, str | Path):
        return None
    try:
        read_index(Path(directory).expanduser())
    except CacheError as error:
        return error
    return None


def entry_error(cfg: Mapping, index: int, entry: TeacherEntry, error: CacheError) -> str:
    """``error`` of entry ``index``'s cache, with the command that writes *its* cache (the
    reader's advice writes the teacher group's)."""
    source = lookup(cfg, "student.source")
    if source in (None, ABSENT):  # the run's tokens are the teacher group's model's
        source = lookup(cfg, "teacher.path")
    source = None if source in (None, ABSENT) else str(source)
    key = f"teachers.{index}.cache"
    return (
        f"{key}={entry.cache} (entry {entry.name!r}): {reader_finding(error)}; write it with "
        f"`{entry_cache_command(entry, source)}` and the run's data overrides, or set "
        f"{key}=auto (written where a cache pays) or null (online)"
    )
