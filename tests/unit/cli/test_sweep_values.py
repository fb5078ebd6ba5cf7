"""Several values for a key in a run of one: refused with the ways on, not Hydra's exit 1."""

from __future__ import annotations

import pytest

from lightning_kd.cli import main
from lightning_kd.cli.sweep_values import sweep_value_errors


def test_several_values_without_multirun_are_refused_with_the_list_and_the_sweep(capsys):
    """``student.layers=0,3`` was Hydra's "Ambiguous value", exit 1 (probe 36)."""
    assert sweep_value_errors(["student.layers=0,3"], ["student.layers=0,3"]) == [
        "student.layers=0,3 gives several values to a run of one: a list is "
        "student.layers=[0,3], a string with commas student.layers='0,3', and a sweep of one "
        "run per value takes -m before the overrides"
    ]
    with pytest.raises(SystemExit) as exited:  # the command: exit 2, before Hydra composes
        main(["train", "debug=smoke", "student.layers=0,3"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "student.layers=0,3 gives several values to a run of one" in err
    # A list, a quoted string, a sweep with -m, and a word Hydra cannot parse are not these.
    for word in ("student.layers=[0,3]", "student.layers='0,3'", "seed=1"):
        assert sweep_value_errors([word], [word]) == []
    assert sweep_value_errors(["-m", "seed=0,1"], ["seed=0,1"]) == []
    assert sweep_value_errors(["x=[unclosed"], ["x=[unclosed"]) == []
