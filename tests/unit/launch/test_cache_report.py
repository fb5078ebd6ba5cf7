"""``lightning-kd cache``'s report of the cache it wrote (``launch/cache.py``)."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest

from lightning_kd.cache.format import INDEX_NAME
from lightning_kd.launch.cache import report


def written(tmp_path, mass: float):
    stats = {"bytes": 2**20, "scored_positions": 100, "bytes_per_scored_position": 10.0}
    stats |= {"bytes_per_entry": 2.5, "mean_top_k_mass": mass}
    (tmp_path / INDEX_NAME).write_text(json.dumps({"stats": stats}))
    return tmp_path


def test_a_cache_that_holds_little_of_the_teachers_mass_is_said(tmp_path, capsys) -> None:
    """A flat teacher's top 256 held 6 % of its mass: the run trained from it saw the rest as
    one outcome, its KL a lower bound, with no word at the cache (probe 45)."""
    with pytest.warns(UserWarning, match=r"the top 256 hold 0.06 of the teacher's mass .*cache.k"):
        report(written(tmp_path, 0.0638), SimpleNamespace(k=256), 0)
    assert "the top 256 hold 0.0638 of the mass on average" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report(written(tmp_path, 0.93), SimpleNamespace(k=256), 0)
