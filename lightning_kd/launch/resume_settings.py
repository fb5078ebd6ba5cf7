"""A resume's settings that its config gives as they are recorded — the objective's and the
data's — compared with its checkpoint's record before anything loads.

The whole record is compared as the checkpoint is restored (``training/provenance.py``), once
the models and the data are built: a resume that forgot its first launch's overrides (the
commonest slip) loaded the teacher and wrote a teacher cache for settings it was refused for
minutes later, leaving that cache behind (probe 58). Only values a config states as the record
holds them are compared here, and the data files' contents; what needs a model (digests, a
cache's records) waits for the restore, as do the settings a resume may change (the batches'
split, the schedule's length, the optimizer: ``resume_reset_optimizer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hydra.utils import instantiate

from lightning_kd.data.errors import DataError
from lightning_kd.data.provenance import data_differences, files_record
from lightning_kd.data.reading import DEFAULT_FILES, EMBEDDED, expand_files
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.training.checkpoint_files import load_local
from lightning_kd.training.optim import same_rates_from
from lightning_kd.training.provenance import (
    CROSS_FIELDS,
    KEY,
    OBJECTIVE_FIELDS,
    ON_POLICY_FIELDS,
    resettable_message,
)
from lightning_kd.utils.refusal import Refused

COMPARED = {
    "distill": (*OBJECTIVE_FIELDS, *CROSS_FIELDS, *ON_POLICY_FIELDS),
    "data": (
        *("block_size", "pack", "seed", "split_seed", "val_fraction", "max_train_examples"),
        "text_field",
    ),
}
"""The record's keys a config sets as they are recorded, by part."""
SCALARS = (bool, int, float, str)


def early_differences(saved: Mapping, cfg: Mapping) -> list[str]:
    """``part.key: checkpoint X, this run Y`` for each :data:`COMPARED` key whose value, given
    on both sides (a null, resolved later, is not), differs."""
    found = []
    for part, keys in COMPARED.items():
        record = saved.get(part) or {}
        for key in keys:
            then, now = record.get(key), lookup(cfg, f"{part}.{key}")
            if isinstance(then, SCALARS) and isinstance(now, SCALARS) and then != now:
                found.append(f"{part}.{key}: checkpoint {then!r}, this run {now!r}")
    return found


def files_differences(saved: Mapping, cfg: Mapping) -> list[str]:
    """How ``data.files`` differ from the record's, by content (an edited file, one added, one
    gone), where the run reads files (a dataset's are the restore's to compare). A resume of
    an edited file wrote a teacher cache for it first (probe 59)."""
    then = (saved.get("data") or {}).get("files")
    patterns = lookup(cfg, "data.files")
    if not isinstance(then, Mapping) or lookup(cfg, "data.dataset.path") not in (None, ABSENT):
        return []
    try:
        files = DEFAULT_FILES if patterns in (None, ABSENT) else expand_files(patterns)
    except (DataError, TypeError):  # refused by the data checks, by name
        return []
    now = files_record(files, {path: name for name, path in EMBEDDED.items()})
    return data_differences({"files": dict(then)}, {"files": now})


def schedule_refusal(saved: Mapping, cfg: Mapping, step: int, where: str) -> str | None:
    """The restore's refusal of another ``trainer.max_steps`` (the schedule's length), said
    before anything loads: where the rates from ``step`` on differ and the run does not reset
    its optimizer on purpose (``resume_reset_optimizer=true``). A forgotten ``max_steps`` was
    refused once the models had loaded (verify 60)."""
    then, now = (saved.get("schedule") or {}).get("max_steps"), lookup(cfg, "trainer.max_steps")
    lengths = all(type(n) is int and n > 0 for n in (then, now))
    if not lengths or then == now or now < step or lookup(cfg, "resume_reset_optimizer") is True:
        return None
    scheduler = lookup(cfg, "scheduler")
    factory = instantiate(scheduler) if isinstance(scheduler, Mapping) and scheduler else None
    if same_rates_from(factory, step, then, now):
        return None
    return resettable_message([f"schedule.max_steps: checkpoint {then}, this run {now}"], where)


def check_resume_settings(ckpt_path: Path, cfg: Mapping) -> None:
    """Refuse resuming ``ckpt_path`` with another objective or data than its record's, named
    as the restore names them (``resume_mismatch=warn`` leaves them to the restore's warning),
    or with another schedule length it would apply silently mid-run."""
    if not ckpt_path.is_file():
        return  # a DeepSpeed directory, read by Lightning
    checkpoint = load_local(ckpt_path, "cpu", mmap=True)
    saved, said = checkpoint.get(KEY), []
    if not saved:
        return
    found = early_differences(saved, cfg) + files_differences(saved, cfg)
    if found and lookup(cfg, "resume_mismatch") != "warn":
        said.append(
            f"{ckpt_path} was trained with a different objective or data:\n  "
            + "\n  ".join(found)
            + "\nResume with the same settings (the overrides its run was launched with), "
            "start a new run, or pass resume_mismatch=warn to continue anyway"
        )
    step = checkpoint.get("global_step", 0)
    if refusal := schedule_refusal(saved, cfg, step, str(ckpt_path)):
        said.append(refusal)
    if said:
        raise Refused("\n".join(said))
