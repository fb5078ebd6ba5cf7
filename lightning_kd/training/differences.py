"""Comparing a checkpoint's provenance record with a resuming run's: each difference named by
the key a user changes (``part.key: checkpoint X, this run Y``)."""

from __future__ import annotations

from typing import Any

from lightning_kd.data.provenance import data_differences
from lightning_kd.training.step_record import CLIPPING, COMPUTE
from lightning_kd.training.teacher_provenance import teacher_differences

RESETTABLE = ("optimizer", "schedule", "student.freeze_embeddings", "student.freeze_layers")
"""Parts (or keys) of the record that ``resume_reset_optimizer=true`` applies instead of
refusing: another set of trained parameters is another optimizer, whose saved state does not load
(torch's ``ValueError`` about a parameter group's size, after the restore began)."""
LATER_DATA = (
    *("processes", "limit_train_batches", "limit_val_batches", "val_batch_size"),
    *("teacher_answers", "chat_template"),
)
"""Keys of the data record a checkpoint saved by an older version may lack: not compared then."""
OPTIONAL = (*RESETTABLE, "data", "teachers", CLIPPING)
"""Parts a checkpoint saved by an older version may lack: not compared then."""


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``part.key: saved → now`` for each recorded value that differs (the teacher's path only
    matters when its weights or config differ too: a moved copy is the same teacher; the data
    as :func:`~lightning_kd.data.provenance.data_differences` names it). A part the checkpoint
    does not record (saved by an older version) is not compared; the computation neither
    (:func:`~lightning_kd.training.step_record.compute_changes` judges it)."""
    found = []
    for part, values in current.items():
        if part == COMPUTE or (part not in saved and part in OPTIONAL):
            continue
        if part == "data":  # a checkpoint older than these trainer settings does not say them
            known = {k: v for k, v in values.items() if k in saved[part] or k not in LATER_DATA}
            found += data_differences(saved[part], known)
            continue
        if part == "teachers":
            found += teacher_differences(saved[part], values)
            continue
        for key, now in values.items():
            # A key recorded since the checkpoint was saved is not compared (nor refused).
            if part in ("distill", "teacher", "student", "schedule") and key not in saved.get(
                part, {}
            ):
                continue
            then = saved.get(part, {}).get(key)
            if then != now and not is_path(part, key) and not unresolved(part, key, then):
                found.append(f"{part}.{key}: checkpoint {then!r}, this run {now!r}")
        gone = sorted(set(saved.get(part, {})) - set(values))
        found += [f"{part}.{key}: checkpoint {saved[part][key]!r}, this run unset" for key in gone]
    return found + moved_paths(saved, current, found)


def resettable_line(line: str) -> bool:
    """Whether a difference (``part.key: ...``) is one ``resume_reset_optimizer=true`` applies."""
    key = line.split(":", 1)[0]
    return key.split(".")[0] in RESETTABLE or key in RESETTABLE


def is_path(part: str, key: str) -> bool:
    """Whether ``part.key`` is the teacher's path: compared only where its model differs too."""
    return (part, key) == ("teacher", "path")


def unresolved(part: str, key: str, then: Any) -> bool:
    """Whether the checkpoint's ``teacher.dtype`` is ``auto`` (saved before the record resolved
    it from the precision): not compared, its precision unknown."""
    return (part, key, then) == ("teacher", "dtype", "auto")


def moved_paths(saved: dict[str, Any], current: dict[str, Any], found: list[str]) -> list[str]:
    """The teacher's path where its model differs (its weights' or config's digest), beside that
    difference: where it was and where it is now, or that the same place holds another model
    (it printed ``checkpoint 'smollm2', this run 'smollm2'`` beside a difference of another
    key, ``teacher.records``, as if the path differed; probe 58)."""
    if not any(line.startswith(("teacher.weights:", "teacher.config:")) for line in found):
        return []
    paths = (saved.get("teacher", {}).get("path"), current["teacher"]["path"])
    if paths == (None, None):  # teachers built from teacher.config: no place to show
        return []
    if paths[0] == paths[1]:
        return [f"teacher.path: {paths[0]!r} in both: the model there is another now"]
    return [f"teacher.path: checkpoint {paths[0]!r}, this run {paths[1]!r}"]
