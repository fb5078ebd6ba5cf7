"""``cli/hydra_command.py``: how the Hydra commands end when stopped."""

from __future__ import annotations

import pytest

from lightning_kd.cli.hydra_command import exit_refused
from lightning_kd.utils.refusal import Refused


def test_a_refusal_after_the_run_wrote_starts_on_a_line_of_its_own(capsys) -> None:
    """It was glued to the end of the validation's progress bar (same line, no newline)."""
    with pytest.raises(SystemExit):
        exit_refused(Refused("bad"), "\nRUN now holds this attempt's logs")
    assert capsys.readouterr().err.startswith("\nlightning-kd: bad\nRUN now holds")
    with pytest.raises(SystemExit):
        exit_refused(Refused("bad"))
    assert capsys.readouterr().err == "lightning-kd: bad\n"


def test_a_further_process_prefixes_its_refusal(capsys, monkeypatch) -> None:
    """Every process of a DDP run prints the refusal it meets; the second says which it is."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(SystemExit) as exit_:
        exit_refused(Refused("bad"))
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "[rank: 1] lightning-kd: bad\n"


def test_a_run_directory_hydra_cannot_read_unquoted_is_refused_with_its_quoted_form(
    tmp_path, capsys
) -> None:
    """Hydra's lexer error, exit 1, with no fix (probe 33); the quoted form runs."""
    from lightning_kd.cli import main

    given = f"hydra.run.dir={tmp_path}/spa ce ü,x=1"
    with pytest.raises(SystemExit) as refused:
        main(["train", "debug=smoke", given])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    quoted = f"'hydra.run.dir=\"{tmp_path}/spa ce ü,x=1\"'"
    assert f"{given}: Hydra's override grammar cannot read its " in err
    assert f"; quote the value: {quoted}" in err
    assert "LexerNoViableAltException" not in err


def test_a_run_directory_refused_quoted_too_is_refused_for_that_at_once(capsys) -> None:
    """``hydra.run.dir=~/x`` was told to quote it, and quoted, was refused for its '~'."""
    from lightning_kd.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["train", "debug=smoke", "hydra.run.dir=~/x"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "hydra.run.dir=~/x: Hydra does not expand '~'" in err and "quote the value" not in err


@pytest.mark.parametrize(
    ("given", "what", "quoted"),
    [
        ("data.files=~/notes.txt", "its '~' (character 12)", "'data.files=\"~/notes.txt\"'"),
        ("data.files=[~/a,b]", "its '~' (character 13)", "'data.files=[\"~/a\",b]'"),
        ("data.files=/d/café.txt", "its 'é' (character 18)", "'data.files=\"/d/café.txt\"'"),
        ("student.name=a)b", "it (mismatched input ')'", "'student.name=\"a)b\"'"),
    ],
)
def test_an_override_hydra_cannot_read_is_refused_with_its_quoted_form(
    given, what, quoted, capsys
) -> None:
    """``data.files=~/notes.txt`` (bash leaves a dotted key's ``~`` alone) and a non-ASCII path
    were Hydra's lexer error, exit 1, naming no fix (probe 46)."""
    from lightning_kd.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["train", "debug=smoke", given])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"{given}: Hydra's override grammar cannot read {what}" in err
    assert f"; quote the value: {quoted}" in err and "LexerNoViable" not in err


def test_the_quoted_form_of_a_home_path_is_read_from_home(tmp_path, monkeypatch) -> None:
    """What the refusal above advises reads the file: Hydra passes "~/notes.txt" on, and
    data.files expands it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lightning_kd.cli.override_grammar import quoted
    from lightning_kd.data.reading import expand_files

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.txt").write_text("text")
    word = quoted("data.files=~/notes.txt").strip("'")
    (override,) = OverridesParser.create().parse_overrides([word])
    assert expand_files(override.value()) == [tmp_path / "notes.txt"]
