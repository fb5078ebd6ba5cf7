"""``teacher_cache: auto`` on a resume: the teacher reaches the loss as it did in the checkpoint.

``auto`` caches where the teacher would read each block often enough, which depends on the run's
length. A run extended (a larger ``trainer.max_steps``) reads each block more often, so ``auto``
chose a cache where the checkpoint had trained online, and the resume was refused as "trained
with a different teacher, tokenizer, objective ...: teacher.records: checkpoint 'full', this run
'top 256'", a change the user never made (probe 47). A cache's divergence is over the teacher's
top k and the rest in one, another objective than the full one: a run keeps the one it began
with, and says so.
"""

from __future__ import annotations

from pathlib import Path

from lightning_kd.launch.teacher_cache import CacheChoice
from lightning_kd.training.checkpoint_files import load_local

MAIN = ""
"""The main teacher's name in :func:`checkpoint_records`."""


def checkpoint_records(ckpt_path: Path | None) -> dict[str, str]:
    """How each teacher of the checkpoint at ``ckpt_path`` reached its loss (``full``, ``top
    <k>`` or ``cross``: ``teacher_provenance.records_kind``), by ``teachers`` name (the main
    teacher's under :data:`MAIN`); empty for no checkpoint, a DeepSpeed directory, or one
    saved before it was recorded."""
    if ckpt_path is None or not Path(ckpt_path).is_file():
        return {}
    record = load_local(Path(ckpt_path), "cpu", mmap=True).get("provenance") or {}
    found = {MAIN: (record.get("teacher") or {}).get("records")}
    for key, value in (record.get("teachers") or {}).items():
        if key.endswith(".records"):
            found[key.removesuffix(".records")] = value
    return {name: kind for name, kind in found.items() if isinstance(kind, str)}


def as_trained(choice: CacheChoice, trained: str | None, can_cache: bool) -> CacheChoice:
    """``choice`` (``auto``'s for this run) kept to what the checkpoint ``trained`` with:
    online where it ran the teacher online, from a cache where it read one (``can_cache``:
    the objective still reads a teacher's logits). Otherwise ``choice`` as it is."""
    if trained != "full" and not (trained or "").startswith("top "):  # cross: no choice
        return choice
    cached = trained != "full"
    if cached == choice.caches or (cached and not can_cache):
        return choice
    reason = choice.reason.removeprefix("auto: ")
    if cached:
        reason = f"auto: from a cache, as the checkpoint it resumes trained ({reason})"
        return CacheChoice(None, reason, caches=True)
    return CacheChoice(
        None,
        f"auto: online, as the checkpoint it resumes trained: a cache would change its "
        f"objective mid-run ({reason})",
    )
