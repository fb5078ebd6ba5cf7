"""The samples callback's settings and its summary table (its run: tests/test_chat.py)."""

from __future__ import annotations

import csv

import pytest

from lightning_kd.training.samples import FIELDS, SAMPLES_NAME, CompletionSamples, samples_markdown


@pytest.mark.parametrize("setting", ["every", "prompts", "max_new_tokens", "text_prompt"])
def test_a_count_below_one_is_refused_by_name(setting) -> None:
    with pytest.raises(ValueError, match=r"callbacks.samples: every, prompts, max_new_tokens"):
        CompletionSamples(**{setting: 0})


def test_the_summary_shows_the_last_steps_rows_escaped(tmp_path) -> None:
    assert samples_markdown(tmp_path) == ""  # no callback, no table
    with open(tmp_path / SAMPLES_NAME, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        writer.writerow([2, "old", "a", "b"])
        writer.writerow([4, "Q|x\nnext", "mine", "theirs"])
    table = samples_markdown(tmp_path)
    assert "Completions at step 4" in table and "old" not in table
    assert "| Q\\|x ⏎ next | mine | theirs |" in table
