"""Why a cache's key is not a run's: each differing field named with both values, the digests
and splits with what a run changes to get another."""

from __future__ import annotations

from dataclasses import replace

from lightning_kd.cache.format import CacheKey
from lightning_kd.cache.key_mismatch import mismatches

SPLIT = {"blocks": 2, "digest": "0123456789abcdef"}
RUN = CacheKey(
    "weights",
    "config",
    "float32",
    "vocab",
    64,
    True,
    8,
    1.0,
    {"train": SPLIT, "val": SPLIT},
    ("a",),
)


def test_an_equal_key_and_a_cache_holding_more_features_match() -> None:
    assert mismatches(RUN, RUN) == []
    assert mismatches(replace(RUN, features=("a", "b")), RUN) == []


def test_each_differing_field_is_one_line_naming_both_values() -> None:
    cache = replace(RUN, k=4, temperature=2.0, features=())
    assert mismatches(cache, RUN) == [
        "k: the cache has 4, this run 8",
        "temperature: the cache has 2.0, this run 1.0",
        "features: the run maps teacher modules ['a'] the cache does not hold (it holds []); "
        "write it with cache.features=true and this run's distill.features",
    ]


def test_a_digest_is_explained_and_a_split_names_its_causes() -> None:
    other_split = {"blocks": 3, "digest": "fedcba9876543210"}
    cache = replace(RUN, teacher_weights="older", splits={"train": other_split, "val": SPLIT})
    weights, split = mismatches(cache, RUN)
    assert weights.startswith("teacher_weights: the cache's teacher computed with other weights")
    assert "another teacher.init_seed" in weights
    assert split.startswith(
        "data split 'train': the cache holds 3 blocks with digest fedcba987654, this run 2 "
        "blocks with digest 0123456789ab (another data.files"
    )
    # Each domain packed apart: the same files and block count with and without data.domains,
    # and the list did not name it (probe 39).
    assert "data.domains (each domain is packed apart)" in split


def test_the_alignment_rule_is_left_to_the_teacher_tokenizer_line_when_that_differs() -> None:
    cross = replace(RUN, teacher_tokenizer="gemma", alignment=3)
    assert [line.split(":")[0] for line in mismatches(RUN, cross)] == ["teacher_tokenizer"]
    older_rule = replace(cross, alignment=2)
    assert mismatches(older_rule, cross) == [
        "alignment: the cache paired the two tokenisations' positions by rule 2, this version "
        "by rule 3 (data/alignment.py RULE): its aligned positions are not this run's"
    ]
