"""A ``teacher.dtype`` set explicitly against the dtype a named teacher cache was written in.

A run that trains from a cache loads its teacher as the cache's writer did (``distill/
assembly.py``: the weights digest must agree), whatever ``teacher.dtype`` says: with
``teacher.dtype=float32`` and a cache written in bfloat16, every KD term came from bfloat16
logits, a copied student started from bfloat16-rounded layers, and the summary said "teacher
float32". A dtype set explicitly is a request: one the cache cannot honour is refused before any
model loads, with both fixes. ``auto`` takes the cache's; ``distill.teacher_cache=auto`` finds or
writes the cache of the run's own dtype.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning_kd.cache.reader import written_dtype
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.launch.teacher_list import config_entries

UNSET = (None, ABSENT, "auto")


def cache_dtype_errors(cfg: Mapping) -> list[str]:
    """Each explicit teacher dtype (the group's, a ``teachers`` entry's own) unlike that of the
    directory it trains from (``distill.teacher_cache``, the entry's ``cache``)."""
    pairs = [("teacher.dtype", lookup(cfg, "teacher.dtype"), lookup(cfg, "distill.teacher_cache"))]
    entries, errors = config_entries(cfg)  # an entry that does not read: named elsewhere
    for index, entry in enumerate([] if errors else entries):
        if not entry.main:  # the main entry's cache is distill.teacher_cache, above
            pairs.append((f"teachers.{index}.dtype", entry.spec.dtype, entry.cache))
    return [error for key, dtype, cache in pairs if (error := dtype_error(key, dtype, cache))]


def dtype_error(key: str, dtype: object, cache: object) -> str | None:
    """Why ``key``'s ``dtype`` cannot train from ``cache`` (None: unset, no directory, or alike)."""
    if dtype in UNSET or (stored := written_dtype(cache)) is None or stored == dtype:
        return None
    return (
        f"{key}={dtype}, but the teacher cache {cache} was written with the teacher in {stored}, "
        f"and a run trains from the teacher its cache was written by: set {key}={stored} (or "
        f"auto), or write that cache again in {dtype} (lightning-kd cache with "
        f"teacher.dtype={dtype})"
    )
