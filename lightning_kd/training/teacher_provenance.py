"""What a checkpoint records of a run's several teachers, and how a resume's differ from it
(``provenance.py`` holds the rest of the record): each teacher's weight and domains by name,
each other teacher's model by its spec and digests, a teacher added or dropped in one line."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from lightning.pytorch import LightningModule

ENTRY_FIELDS = ("path", "gguf_file", "config", "dtype", "quantize", "init_seed")
"""What identifies a ``teachers`` entry's model besides its digests (``path`` only matters
where they differ: a moved copy is the same teacher)."""


def records_kind(cached: Any, cross: Any) -> str:
    """How a teacher's distribution reaches the loss: ``full`` (run, same tokenizer), ``top
    <k>`` (read from its cache: the divergence over its top k and the rest, another
    objective), or ``cross`` (another tokenizer: its top ``cross_top_k`` either way)."""
    if cross is not None:
        return "cross"
    return "full" if cached is None else f"top {cached.cache.key.k}"


def main_records(module: LightningModule) -> str | None:
    """:func:`records_kind` of the distiller's own teacher (None before it is built)."""
    distiller = getattr(module, "distiller", None)
    if distiller is None:
        return None
    return records_kind(distiller.cached_teacher, distiller.cross)


def entry_records(module: LightningModule, name: str) -> str | None:
    """:func:`records_kind` of the ``teachers`` entry ``name`` (None before it is built)."""
    distiller = getattr(module, "distiller", None)
    extra = None if distiller is None else distiller.extra_teachers
    if extra is None or name not in extra.names:
        return None
    return records_kind(extra.caches.get(name), extra.crosses[extra.names.index(name)])


def crosses(module: LightningModule) -> bool:
    """Whether any teacher of ``module``'s distiller reads another tokenizer than the student."""
    distiller = getattr(module, "distiller", None)
    if distiller is None:
        return False
    extra = distiller.extra_teachers
    return distiller.cross is not None or (
        extra is not None and any(cross is not None for cross in extra.crosses)
    )


def teachers_record(module: LightningModule) -> dict[str, Any]:
    """With several ``teachers``: each one's weight and domains by name, and each other
    teacher's model (its spec's keys, its weights and config digests); empty for one teacher."""
    found: dict[str, Any] = {}
    for entry in module.teachers or ():
        found[f"{entry.name}.weight"] = entry.weight
        found[f"{entry.name}.domains"] = list(entry.domains) if entry.domains else None
        if entry.main:  # its model is the record's ``teacher``
            continue
        spec = dataclasses.asdict(entry.spec)
        if spec["config"] is not None:  # a config-built teacher: its config, as one value
            spec["config"] = json.dumps(spec["config"], sort_keys=True)
        spec["init_seed"] = spec["init_seed"] if entry.spec.config is not None else None
        found |= {f"{entry.name}.{key}": spec[key] for key in ENTRY_FIELDS}
        digests = module.extra_digests.get(entry.name, {})
        found |= {f"{entry.name}.{key}": value for key, value in digests.items()}
        found[f"{entry.name}.records"] = entry_records(module, entry.name)
    return json.loads(json.dumps(found, default=str))


def teacher_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The ``teachers`` records compared: a teacher added or dropped in one line, each
    difference of a teacher in both (its path only where its model differs too)."""

    def names(record: dict[str, Any]) -> list[str]:
        return sorted({key.rsplit(".", 1)[0] for key in record})

    found = []
    for name in sorted(set(names(saved)) | set(names(current))):
        if name not in names(saved):
            found.append(f"teachers.{name}: not in the checkpoint, a teacher of this run")
        elif name not in names(current):
            found.append(f"teachers.{name}: a teacher of the checkpoint, not of this run")
    for name in (name for name in names(saved) if name in names(current)):
        # A key the checkpoint lacks was added since it was saved: not compared.
        keys = sorted(key for key in saved if key.rsplit(".", 1)[0] == name)
        changed = [key for key in keys if saved.get(key) != current.get(key)]
        if changed == [f"{name}.path"]:
            continue  # a moved copy of the same model
        found += [
            f"teachers.{key}: checkpoint {saved.get(key)!r}, this run {current.get(key)!r}"
            for key in changed
        ]
    return found
