"""The ``teachers`` list read: each entry a name, a weight, ``teacher`` keys over the teacher
group's (one entry, the one with no model of its own, is that group's model), optionally its data
domains and its cache; every problem of the list named at once (``launch/teacher_list.py`` runs
the same reading on the config, before anything loads)."""

from __future__ import annotations

import difflib
import math
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from lightning_kd.models.loading import TeacherSpec
from lightning_kd.utils.refusal import Refused, refuse

ENTRY_KEYS = ("name", "weight", "cache", "domains")
"""What a ``teachers`` entry holds besides ``teacher`` keys (``models/loading.py``)."""


@dataclass(frozen=True)
class TeacherEntry:
    """One entry of ``teachers``: its name in logs, its weight, and the model (``spec``)."""

    name: str
    weight: float
    spec: TeacherSpec
    main: bool
    """Whether it is the ``teacher`` group's model (the entry that names no model of its own)."""
    domains: tuple[str, ...] | None = None
    """The ``data.domains`` it teaches (None: every row; ``teacher_domains.py``)."""
    cache: str | None = None
    """Its teacher cache (``lightning-kd cache`` with this entry's ``teacher`` keys), or ``auto``
    (written once, like ``distill.teacher_cache=auto``); None: online. The main entry's is
    ``distill.teacher_cache``."""
    index: int | None = None
    """Its place in the ``teachers`` list as given: what messages name it by (``teachers[i]``)."""


def teacher_entries(teachers: Any, main: TeacherSpec) -> list[TeacherEntry] | None:
    """The ``teachers`` list checked — each entry a ``name``, a ``weight`` and ``teacher`` keys
    over the ``teacher`` group's (one entry with no ``path``/``config`` is that model itself),
    the weights summing to 1 — or :class:`~lightning_kd.utils.refusal.Refused` naming every
    problem. None for no list, or a list of one: the teacher group's model alone."""
    entries, errors = read_entries(teachers, main)
    refuse(errors)
    for note in twice(entries):
        warnings.warn(note, stacklevel=2)
    return entries if len(entries) > 1 else None


def given_entries(teachers: Any, main: TeacherSpec, chunked: bool) -> list[TeacherEntry] | None:
    """``teachers`` as :meth:`Distiller.from_specs` takes them: a list as the config holds it
    (plain mappings, read by :func:`teacher_entries`), or entries read already, checked as a list
    is (one main entry, names apart, weights summing to 1). From Python, mappings raised an
    ``AttributeError`` and entries of weights summing to 1.8, or with no main entry, trained
    (probe 40). Several teachers need the ``chunked`` loss: their terms run the student's head."""
    if teachers and not chunked:
        raise Refused("teachers: several teachers need the chunked loss (distill.chunked=true)")
    if not teachers or not all(isinstance(entry, TeacherEntry) for entry in teachers):
        return teacher_entries(teachers, main)
    entries = list(teachers)
    refuse(entries_errors(entries))
    return entries if len(entries) > 1 else None


def twice(entries: list[TeacherEntry]) -> list[str]:
    """A note on each pair of entries of the same model, keys and domains: one teacher's
    objective at twice its memory and compute, accepted without a word (the benchmark's
    ``two_teachers`` scenario measures just that, on purpose)."""
    return [
        f"teachers: {first.name} and {second.name} are the same model with the same teacher keys"
        f"{' and domains' if first.domains is not None else ''}: one teacher's objective at "
        f"twice its memory and compute; one entry of weight {first.weight + second.weight:g} "
        "is the same objective"
        for at, first in enumerate(entries)
        for second in entries[at + 1 :]
        if first.spec == second.spec and first.domains == second.domains
    ]


def read_entries(teachers: Any, main: TeacherSpec) -> tuple[list[TeacherEntry], list[str]]:
    """The entries of ``teachers`` that read, and one message per problem with any of them."""
    if teachers is None or (isinstance(teachers, Sequence) and not len(teachers)):
        return [], []
    if isinstance(teachers, str | Mapping) or not isinstance(teachers, Sequence):
        return [], [f"teachers={teachers!r}: give a list of entries, e.g. {EXAMPLE}"]
    entries, errors = [], []
    for index, entry in enumerate(teachers):
        found, why = read_entry(entry, index, main)
        errors += why
        entries += [found] if found is not None else []
    if not errors:
        errors += entries_errors(entries)
    return entries, errors


EXAMPLE = "teachers=[{name: smollm2, weight: 0.5}, {name: gemma, weight: 0.5, path: gemma3_270m}]"


def read_entry(entry: Any, index: int, main: TeacherSpec) -> tuple[TeacherEntry | None, list]:
    """``teachers[index]`` as an entry, or None and why not (every reason at once)."""
    if not isinstance(entry, Mapping):
        return None, [f"teachers[{index}]={entry!r}: give a mapping, e.g. {{name: a, weight: 0.5}}"]
    allowed = [*ENTRY_KEYS, *(field.name for field in fields(TeacherSpec))]
    errors = []
    for key in sorted(set(map(str, entry)) - set(allowed)):
        near = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {near[0]}?" if near else f"allowed: {', '.join(allowed)}"
        errors.append(f"teachers[{index}].{key}: an entry takes no key {key!r}; {hint}")
    errors += [
        f"teachers[{index}] has no {key}: each entry needs a name and a weight, e.g. "
        "{name: gemma, weight: 0.5, path: gemma3_270m}"
        for key in ("name", "weight")
        if entry.get(key) is None
    ]
    overrides = teacher_keys(entry)
    own = overrides.get("path") is not None or overrides.get("config") is not None
    if "path" in entry and entry["path"] is None and entry.get("config") is None:
        errors.append(
            f"teachers[{index}].path=null: give the model's path (or config), or leave both "
            "keys out for the teacher group's model"
        )
    if not own and entry.get("cache") is not None:
        errors.append(
            f"teachers[{index}].cache: this entry is the teacher group's model, whose cache is "
            "distill.teacher_cache; set distill.teacher_cache instead of its entry's cache"
        )
    if errors:
        return None, errors
    weight, domains = (
        entry_weight(entry["weight"], index),
        entry_domains(entry.get("domains"), index),
    )
    errors = [str(found) for found in (weight, domains) if isinstance(found, ValueError)]
    if errors:
        return None, errors
    try:
        spec = replace(main, **overrides)
    except ModuleNotFoundError as missing:  # an int8 entry without torchao: said with the rest
        return None, [f"teachers[{index}]: {missing}"]
    except ValueError as invalid:  # TeacherSpec's own checks name teacher.<key>: the entry's
        return None, [entry_key(str(invalid), index)]
    name, cache = str(entry["name"]), entry.get("cache")
    return TeacherEntry(name, weight, spec, not own, domains, cache, index), []


def entry_key(text: str, index: int | None) -> str:
    """``text`` with the ``teacher`` group's keys (``teacher.path``) named as entry ``index``'s
    (``teachers[1].path``): TeacherSpec's checks and the model loaders name the group's."""
    return text if index is None else re.sub(r"\bteacher\.(\w+)", rf"teachers[{index}].\1", text)


@contextmanager
def entry_errors(entry: TeacherEntry) -> Iterator[None]:
    """Loading ``entry``'s model: a missing or unreadable path named by the entry's key, not by
    the ``teacher`` group's (which is another model's: probe 51)."""
    try:
        yield
    except (FileNotFoundError, ValueError) as error:
        renamed = entry_key(str(error), entry.index)
        if renamed == str(error) or isinstance(error, Refused):
            raise
        raise type(error)(renamed) from error


def entry_weight(weight: Any, index: int) -> float | ValueError:
    """An entry's ``weight``: a finite number (a NaN would pass every comparison below), or the
    error naming it."""
    try:
        value = float(weight)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(weight, bool) or not math.isfinite(value):
        return ValueError(
            f"teachers[{index}].weight={weight!r}: give a number >= 0, the weights summing to 1, "
            "e.g. weight: 0.5"
        )
    return value


def entry_domains(domains: Any, index: int) -> tuple[str, ...] | ValueError | None:
    """An entry's ``domains``: None, or a non-empty list of domain names; or the error naming
    it."""
    if domains is None:
        return None
    if isinstance(domains, str) or not domains or not all(isinstance(d, str) for d in domains):
        return ValueError(
            f"teachers[{index}].domains={domains!r}: list the data.domains it teaches, e.g. "
            "domains: [code]"
        )
    return tuple(domains)


def teacher_keys(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The ``teacher`` keys ``entry`` sets over the teacher group's: for a model of its own (a
    ``path`` or ``config``), the other of those two and ``gguf_file`` are not inherited."""
    overrides = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
    if "path" in overrides or "config" in overrides:
        overrides = {"path": None, "config": None, "gguf_file": None} | overrides
    return overrides


NAME = re.compile(r"[A-Za-z0-9_.\-]+")
"""What a teacher's name may hold (``qwen2.5`` included)."""


def entries_errors(entries: list[TeacherEntry]) -> list[str]:
    """One main entry, distinct names, non-negative weights that sum to 1, causal LMs only, and
    no domains where one teacher teaches every row."""
    errors = []
    names = [entry.name for entry in entries]
    if len(mains := [at for at, entry in enumerate(entries) if entry.main]) != 1:
        errors.append(main_error(entries, mains))
    if len(set(names)) != len(names):
        errors.append(f"teachers: names {names} repeat; give each entry its own name")
    if odd := [name for name in names if not NAME.fullmatch(str(name))]:
        errors.append(
            f"teachers: names {odd} hold other characters than letters, digits, '_', '-' and "
            "'.'; a name is part of metric names (val/kl/<name>), table rows and CSV columns"
        )
    weights = [entry.weight for entry in entries]
    if min(weights) < 0 or abs(sum(weights) - 1.0) > 1e-6:
        errors.append(
            f"teachers: weights {weights} must be >= 0 and sum to 1 (they share kd_weight)"
        )
    if any(entry.spec.task != "causal_lm" for entry in entries):
        errors.append("teachers: several teachers distil causal LMs' logits only")
    if len(entries) == 1 and entries[0].domains is not None:
        errors.append(
            "teachers: one entry with domains; a single teacher teaches every row, so drop its "
            "domains (or add the teachers of the other domains)"
        )
    return errors


def main_error(entries: list[TeacherEntry], mains: list[int]) -> str:
    """Why ``entries`` do not hold the teacher group's model exactly once (``mains``: the
    positions of those naming no model of their own), naming them (the line named none)."""
    named = [f"teachers[{at}] ({entries[at].name})" for at in mains]
    found = (
        f"{' and '.join(named)} name no model of their own"
        if mains
        else "every entry names a model of its own (path or config)"
    )
    return (
        f"teachers lists every teacher, the teacher group's model among them exactly once (the "
        f"entry with no path or config of its own, e.g. {{name: smollm2, weight: 0.5}}): {found}"
    )
