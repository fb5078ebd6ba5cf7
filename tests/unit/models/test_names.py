"""``models/names.py``: a packaged model's name that is a path here too is named, not guessed."""

from __future__ import annotations

from lightning_kd.models.names import shadowing_error
from tests.unit.cli.test_refused_values import assert_refused


def test_a_folder_named_as_a_packaged_model_is_named(tmp_path, monkeypatch, capsys) -> None:
    """evaluate read the packaged SmolLM2 for a folder ./smollm2 (its numbers another model's),
    while export read the folder: both without a word."""
    monkeypatch.chdir(tmp_path)
    assert shadowing_error("smollm2", "model") is None  # nothing here: the packaged model
    (tmp_path / "smollm2").mkdir()
    message = shadowing_error("smollm2", "model")
    assert message.startswith(
        "model=smollm2 names both the packaged model 'smollm2' and the folder"
    )
    assert "write ./smollm2 for the folder" in message
    assert shadowing_error("./smollm2", "model") is None
    (tmp_path / "t.txt").write_text("Some text to score. " * 20)
    assert_refused(["evaluate", "--files", "t.txt", "--", "smollm2"], [message], capsys)
