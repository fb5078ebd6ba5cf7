"""Why a cache's key is not a run's: one line per field that differs, naming both values and,
for a digest or a split, what the run changed to get another (a digest alone means nothing to a
reader)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_kd.cache.format import SPLITS, CacheKey

SPLIT_CAUSES = (
    "another data.files, data.split_seed (data.seed, for a cache written before data.split_seed "
    "existed), data.val_fraction, data.max_train_examples, data.block_size, data.pack or "
    "data.domains (each domain is packed apart)"
)


def mismatches(cache: CacheKey, run: CacheKey) -> list[str]:
    """One line per field where the cache's key differs from the run's, naming both values."""
    found = []
    for field, value in dataclasses.asdict(cache).items():
        if field == "splits":
            continue
        if field == "alignment" and cache.teacher_tokenizer != run.teacher_tokenizer:
            continue  # one of them pairs no tokenisations: the teacher_tokenizer line says it
        if field in EXPLAINED_FIELDS and value != getattr(run, field):
            found.append(EXPLAINED_FIELDS[field](value, getattr(run, field)))
            continue
        if field == "features":  # a cache may hold more than a run uses, never less
            lacking = sorted(set(run.features) - set(value))
            if lacking:
                found.append(
                    f"features: the run maps teacher modules {lacking} the cache does not hold "
                    f"(it holds {list(value)}); write it with cache.features=true and this "
                    "run's distill.features"
                )
            continue
        now = getattr(run, field)
        if value != now:
            found.append(f"{field}: the cache has {value!r}, this run {now!r}")
    for split in SPLITS:
        have, want = cache.splits.get(split), run.splits.get(split)
        if have != want:
            found.append(
                f"data split {split!r}: the cache holds {_blocks(have)}, this run {_blocks(want)} "
                f"({SPLIT_CAUSES})"
            )
    return found


def _tokenizer(cache: str, run: str) -> str:
    return (
        f"tokenizer: the cache was written for a student reading another tokenizer (vocabulary "
        f"digest {cache[:12]}, this run's {run[:12]}): its positions are that tokenizer's"
    )


def _teacher_tokenizer(cache: str, run: str) -> str:
    def reads(digest: str) -> str:
        return f"its own tokenizer ({digest[:12]})" if digest else "the student's tokens"

    return (
        f"teacher_tokenizer: the cache's teacher read {reads(cache)}, this run's reads {reads(run)}"
    )


def _teacher_weights(cache: str, run: str) -> str:
    return (
        f"teacher_weights: the cache's teacher computed with other weights (digest {cache}, "
        f"this run's {run}): another teacher.path or teacher.gguf_file, another training of it, "
        "another teacher.init_seed (a teacher.config teacher's random weights) or another "
        "teacher.quantize (int8 weights compute other values than full-precision ones)"
    )


def _alignment(cache: int, run: int) -> str:
    return (
        f"alignment: the cache paired the two tokenisations' positions by rule {cache}, this "
        f"version by rule {run} (data/alignment.py RULE): its aligned positions are not this "
        "run's"
    )


EXPLAINED_FIELDS = {
    "teacher_weights": _teacher_weights,
    "tokenizer": _tokenizer,
    "teacher_tokenizer": _teacher_tokenizer,
    "alignment": _alignment,
}
"""Key fields with a mismatch line of their own (a digest alone means nothing to a reader)."""


def _blocks(split: dict[str, Any] | None) -> str:
    if split is None:
        return "nothing"
    return f"{split['blocks']} blocks with digest {split['digest'][:12]}"
