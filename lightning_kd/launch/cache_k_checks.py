"""``cache.k`` against the vocabulary of each teacher a run caches, before any model loads.

The cache keeps a teacher's ``cache.k`` likeliest tokens a position; more than its vocabulary was
a ``ValueError`` traceback once the teacher had loaded (and a cache directory left behind). The
vocabulary is read from the teacher's config alone; a teacher that cannot be read, or a size
below 1, is named by the path and model checks instead, and a teacher whose vocabulary is smaller
than the tokenizer is named as that (following advice on ``cache.k`` could not have helped).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from lightning_kd.launch.online_reasons import unresolved, why_online
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.launch.teacher_list import config_entries
from lightning_kd.models.loading import TeacherSpec, load_tokenizer
from lightning_kd.models.positions import spec_config

UNREADABLE = (ValueError, OSError, ModuleNotFoundError, InstantiationException)
"""A teacher whose config cannot be read here: the path and model checks say why."""


def cache_k_errors(cfg: Mapping, command: str) -> list[str]:
    """``cache.k`` beyond the vocabulary of a teacher whose cache ``command`` writes: the
    teacher group's (``cache``; ``train`` with ``distill.teacher_cache`` a directory, or ``auto``
    where nothing in the config keeps the teacher online) and each cached ``teachers`` entry's."""
    k = lookup(cfg, "cache.k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        return []  # named by the config rules
    cached: list[Cached] = []
    if command == "cache" or caches_the_teacher(cfg):
        main = functools.partial(instantiate, cfg["teacher"], _convert_="all")
        cached.append(Cached("the teacher", "teacher.config.", main))
    entries, _ = config_entries(cfg)
    for index, entry in enumerate(entries):
        if not entry.main and entry.cache is not None:
            whose, key = f"teachers[{index}] ({entry.name})", f"teachers.{index}.config."
            cached.append(Cached(whose, key, lambda spec=entry.spec: spec))
    online = command == "train" and unresolved(lookup(cfg, "distill.teacher_cache"))
    hint = " (or distill.teacher_cache=null: the teacher online)" if online else ""
    return [error for teacher in cached if (error := k_error(k, teacher, hint))]


@dataclass(frozen=True)
class Cached:
    """A teacher whose cache is written: who it is in a message, where its config is set, and
    its spec (built when read: the teacher group's may not build, which other checks name)."""

    whose: str
    config_key: str
    spec: Callable[[], TeacherSpec]


def caches_the_teacher(cfg: Mapping) -> bool:
    """Whether ``train`` may write the teacher group's cache (``auto``: unless the config alone
    keeps it online; the teacher's reads per block decide the rest)."""
    choice = lookup(cfg, "distill.teacher_cache")
    if choice in (None, ABSENT):
        return False
    return not unresolved(choice) or why_online(cfg) is None


def k_error(k: int, teacher: Cached, hint: str) -> str | None:
    """Why ``k`` cannot be ``teacher``'s cache's (None: it can, or the teacher is named
    elsewhere), with ``hint`` after the fix."""
    whose = teacher.whose
    try:
        built = teacher.spec()
        vocab = getattr(spec_config(built), "vocab_size", None)
    except UNREADABLE:
        return None
    if not isinstance(vocab, int) or vocab < 1 or k <= vocab:
        return None
    try:
        tokens = len(load_tokenizer(built))  # its own: a cross-tokenizer student's is another
    except UNREADABLE:
        tokens = 0
    if tokens > vocab:  # what the run refuses once loaded: the pair, not cache.k, is wrong
        return (
            f"{whose}'s vocabulary has {vocab} rows (config vocab_size) but its tokenizer has "
            f"{tokens} tokens: the two do not belong together (set {teacher.config_key}vocab_size="
            f"{tokens} or more, or the model of that tokenizer)"
        )
    return (
        f"cache.k={k} is more than {whose}'s {vocab}-token vocabulary (config vocab_size): the "
        f"cache keeps its k likeliest tokens; set cache.k={vocab} or less (the whole "
        f"distribution){hint}"
    )
