"""``lightning-kd evaluate`` refuses an option that has no effect in the mode chosen (exit 2,
before any model loads), naming the option and the mode it goes with: ``--temperature 0`` or
``--block-size 5`` with ``--prompts`` (greedy answers) ran to the end as if left out, while
``--samples`` without ``--prompts`` was refused (probe 38)."""

from __future__ import annotations

import pytest

from lightning_kd.cli import main
from lightning_kd.cli.evaluate import MODES, SAMPLING, USED_WITH, parser, unused_option_errors

MODE_ARGS = {
    "--files": ["--files", "a.txt"],
    "--prompts": ["--prompts", "p.jsonl", "--teacher", "smollm2"],
    "--lm-eval": ["--lm-eval", "kd_heldout"],
}
VALUES = {"--lm-eval-include": "tasks", "--device": "cpu", "--text-field": "text"}
"""A value each option takes (the others, a number): a default given counts as given too."""


def option_args(option: str) -> list[str]:
    """``option`` with a value it takes."""
    return [option, VALUES.get(option, "1")]


def unused(mode: str, *extra: str) -> list[str]:
    """The refusals of ``evaluate`` in ``mode`` with ``extra`` options (a model after --)."""
    return unused_option_errors(parser().parse_args([*MODE_ARGS[mode], *extra, "--", "model"]))


IGNORED = [
    (option, mode) for option, modes in USED_WITH.items() for mode in MODES if mode not in modes
]


@pytest.mark.parametrize(("option", "mode"), IGNORED, ids=[" with ".join(i) for i in IGNORED])
def test_an_option_of_another_mode_is_refused_before_anything_loads(option, mode, capsys):
    argv = ["evaluate", *MODE_ARGS[mode], *option_args(option), "--", "no/such/model"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    goes = " or ".join(USED_WITH[option])
    assert f"{option} has no effect with {mode}: it goes with {goes}; leave it out" in err
    assert "Traceback" not in err and "does not exist" not in err  # refused before the model


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("option", SAMPLING)
def test_the_sampling_options_without_samples_are_refused(option, mode, capsys) -> None:
    """Greedy answers draw nothing at random: --seed and --temperature acted only on
    --samples' draws, in every mode."""
    argv = ["evaluate", *MODE_ARGS[mode], option, "0", "--", "no/such/model"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{option} has no effect without --samples" in err
    assert "add --samples K (with --prompts) or leave it out" in err


def test_each_option_of_its_own_mode_passes_and_all_are_named_at_once(capsys) -> None:
    """--batch-size and --out act in every mode; each other option passes in its own."""
    for mode in MODES:
        own = [option for option, modes in USED_WITH.items() if mode in modes]
        assert unused(mode, *[arg for option in own for arg in option_args(option)]) == []
    sampled = ["--samples", "2", "--temperature", "0.5", "--seed", "3"]
    assert unused("--prompts", *sampled) == []
    for mode in MODES:
        assert unused(mode, "--batch-size", "2", "--out", "o.json") == []
    argv = ["evaluate", *MODE_ARGS["--prompts"], "--block-size", "5", "--text-field", "foo"]
    assert main([*argv, "--temperature", "0", "--", "no/such/model"]) == 2
    err = capsys.readouterr().err
    assert "3 values are refused" in err
    for option in ("--block-size", "--text-field", "--temperature"):
        assert f"\n  {option} has no effect" in err
