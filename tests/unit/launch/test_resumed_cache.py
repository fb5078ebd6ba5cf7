"""``teacher_cache: auto`` on a resume keeps the teacher as the checkpoint trained it
(``launch/resumed_cache.py``)."""

from __future__ import annotations

import torch

from lightning_kd.launch.resumed_cache import MAIN, as_trained, checkpoint_records
from lightning_kd.launch.teacher_cache import CacheChoice

CACHES = CacheChoice(None, "auto: 2.40 passes over 180 training blocks", caches=True)
ONLINE = CacheChoice(None, "auto: 0.89 passes over 180 training blocks; a cache pays from 1.5")


def test_an_extended_run_that_trained_online_stays_online() -> None:
    """Extended (max_steps up), auto chose a cache, and the resume was refused as "trained with
    a different teacher ... teacher.records: checkpoint 'full', this run 'top 256'" (probe 47)."""
    kept = as_trained(CACHES, "full", can_cache=True)
    assert not kept.caches
    assert kept.reason.startswith("auto: online, as the checkpoint it resumes trained: a cache")
    assert kept.reason.endswith("(2.40 passes over 180 training blocks)")


def test_a_run_that_trained_from_a_cache_stays_cached_where_it_can() -> None:
    kept = as_trained(ONLINE, "top 256", can_cache=True)
    assert kept.caches and kept.reason.startswith("auto: from a cache, as the checkpoint it")
    assert as_trained(ONLINE, "top 256", can_cache=False) is ONLINE  # e.g. kd_weight=0 now
    assert as_trained(CACHES, "top 256", can_cache=True) is CACHES
    assert as_trained(CACHES, "cross", can_cache=True) is CACHES  # another tokenizer: no choice
    assert as_trained(CACHES, None, can_cache=True) is CACHES  # no checkpoint, or an old one


def test_the_records_are_read_from_the_checkpoint(tmp_path) -> None:
    provenance = {
        "teacher": {"records": "full"},
        "teachers": {"gemma.records": "cross", "b.records": "top 64", "b.weight": 0.5},
    }
    path = tmp_path / "last.ckpt"
    torch.save({"global_step": 3, "provenance": provenance}, path)
    assert checkpoint_records(path) == {MAIN: "full", "gemma": "cross", "b": "top 64"}
    assert checkpoint_records(None) == {} and checkpoint_records(tmp_path) == {}
