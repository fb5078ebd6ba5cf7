"""Directories written whole or not at all."""

from __future__ import annotations

import pytest

from lightning_kd.utils.atomic import atomic_directory


def test_a_directory_appears_whole_or_not_at_all(tmp_path) -> None:
    target = tmp_path / "converted"
    with (
        pytest.raises(RuntimeError, match="killed mid-write"),
        atomic_directory(target) as staging,
    ):
        (staging / "config.json").write_text("{}")
        assert not target.exists()
        raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []  # no target, no temporary left
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("{}")
    assert [p.name for p in tmp_path.iterdir()] == ["converted"]
    assert (target / "config.json").read_text() == "{}"
