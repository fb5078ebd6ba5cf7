"""The command lines a stopped run prints: resumable from anywhere, read by Hydra as written."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from lightning_kd.training.rerun import hydra_text, resume_command


def test_the_resume_command_keeps_the_overrides_and_names_the_directory() -> None:
    command = resume_command(
        ["python", "run.py"],
        ["debug=smoke", "ckpt_path=old.ckpt", "overwrite=true", "data.files=[a b.txt]"],
        Path("/runs/x"),
    )
    assert command == (
        "python run.py debug=smoke 'data.files=[a b.txt]' hydra.run.dir=/runs/x ckpt_path=last"
    )


def test_the_resume_command_names_local_paths_absolute(tmp_path: Path, monkeypatch) -> None:
    """It made the run directory absolute but left data.files relative: run from another
    directory (a new shell, a requeued job), it was refused for a missing file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "data" / name).write_text("text")
    overrides = [
        "data.files=[data/a.txt,data/*.txt]",
        "data.val_files=data/b.txt",
        "teacher.path=smollm2",  # a packaged teacher's name, no local path
        "distill.teacher_cache=auto",
        "data.text_field=data",  # not a path setting, though a folder of that name exists
    ]
    command = resume_command(["lightning-kd", "train"], overrides, tmp_path / "run")
    here = tmp_path / "data"
    assert command == (
        f"lightning-kd train 'data.files=[{here}/a.txt,{here}/*.txt]' data.val_files={here}/b.txt "
        f"teacher.path=smollm2 distill.teacher_cache=auto data.text_field=data "
        f"hydra.run.dir={tmp_path / 'run'} ckpt_path=last"
    )


@pytest.mark.parametrize(
    "path",
    ["/runs/x", "/runs/my run", "/runs/my run ü", "/runs/a,b", "/runs/it's", '/runs/a"b', "/r/~x"],
)
def test_the_run_directory_is_written_as_hydra_reads_it(path: str) -> None:
    """A directory with a non-ASCII letter: the printed command, run as printed, met Hydra's
    ``LexerNoViableAltException`` (probe 23); a comma would have made a sweep of it."""
    command = resume_command(["lightning-kd", "train"], ["debug=smoke"], Path(path))
    words = shlex.split(command)
    assert words[-1] == "ckpt_path=last"
    parsed = OverridesParser.create().parse_override(words[-2])
    assert parsed.key_or_group == "hydra.run.dir" and parsed.value() == path
    assert hydra_text("/runs/x") == "/runs/x"  # plain where Hydra reads it so


def test_a_relative_path_in_hydras_quotes_is_made_absolute_too(tmp_path: Path, monkeypatch) -> None:
    """Paths given in Hydra's quotes (needed for spaces or a non-ASCII letter) stayed relative:
    the printed command was refused from another directory (probe 23)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my data").mkdir()
    (tmp_path / "my data" / "notes ü.jsonl").write_text("{}")
    overrides = ['data.files=["my data/notes ü.jsonl"]', "distill.teacher_cache='my data'"]
    command = resume_command(["lightning-kd", "train"], overrides, tmp_path / "run")
    files, cache = shlex.split(command)[2:4]
    parser = OverridesParser.create()
    assert parser.parse_override(files).value() == [str(tmp_path / "my data" / "notes ü.jsonl")]
    assert parser.parse_override(cache).value() == str(tmp_path / "my data")
