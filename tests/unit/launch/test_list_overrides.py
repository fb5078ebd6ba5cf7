"""Overrides of a list's entries that Hydra cannot merge: refused (exit 2) with what is wrong and
the fix, not "Error merging override ... list index out of range" (exit 1) nor "the config has no
key teachers.1; did you mean teachers.1?" (probe 40)."""

from __future__ import annotations

import pytest

from lightning_kd.launch.keys import override_key_errors
from lightning_kd.launch.list_overrides import names_entry

TWO = ["experiment=two_teachers", "debug=smoke"]


@pytest.mark.parametrize(
    "word", ["teachers.2.weight=0.1", "+teachers.2={name: third, weight: 0.1, path: smollm2}"]
)
def test_an_entry_past_the_end_of_a_list_is_refused_with_how_to_add_one(word) -> None:
    (error,) = override_key_errors([*TWO, word])
    assert error.startswith(f"{word}: teachers has no entry 2 (its entries are teachers.0 to ")
    assert "teachers.1)" in error and "give the whole list, teachers=[{...}, ...]" in error


def test_a_mapping_with_a_key_its_entry_lacks_is_refused_naming_that_key() -> None:
    word = "teachers.1={name: x, weight: 0.5, stride: 2}"
    (error,) = override_key_errors([*TWO, word])
    assert error.startswith(f"{word}: a mapping given for teachers.1 is merged into that entry")
    assert "which has no key 'stride'; add it with +teachers.1.stride=VALUE" in error


def test_an_entry_a_list_has_is_set_as_before() -> None:
    assert override_key_errors([*TWO, "teachers.1.weight=0.25", "teachers.0.weight=0.75"]) == []


@pytest.mark.parametrize(
    ("word", "named"),
    [
        ("teachers.1=x", True),
        ("+teachers.1.stride=2", True),
        ("~teachers.1", True),
        ("teachers.10=x", False),
        ("teachers.10.weight=0.1", False),
        ("teachers_x.1=x", False),
    ],
)
def test_an_override_names_an_entry_by_its_whole_index(word, named) -> None:
    """``teachers.10=...`` is not the override of entry 1 a refusal names."""
    assert names_entry(word, "teachers", 1) is named
