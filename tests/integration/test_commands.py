"""The one command, ``lightning-kd <command>`` (and ``python -m lightning_kd``): usage, refusals
of bad commands and options, and the user's own config directory composing with the shipped
groups."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightning_kd.cli import COMMANDS, main
from lightning_kd.launch.config import compose_config

ROOT = Path(__file__).resolve().parents[2]

MINE = """\
# @package _global_
defaults:
  - override /teacher: tiny_llama

distill:
  temperature: 3.0
trainer:
  max_steps: 7
"""


def test_no_command_prints_usage_and_fails(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: lightning-kd <command>")
    assert all(name in err for name in COMMANDS)


def test_help_prints_usage_and_succeeds(capsys) -> None:
    assert main(["--help"]) == 0
    assert "usage: lightning-kd <command>" in capsys.readouterr().out


def test_an_unknown_command_is_named_with_the_nearest_one(capsys) -> None:
    assert main(["trian", "debug=smoke"]) == 2
    assert "unknown command 'trian'; did you mean 'train'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "valid"),
    [("evaluate", ["model", "--files", "a.txt"]), ("bench", ["--out", "b"]), ("soak", [])],
)
def test_a_bad_option_prints_usage_and_exits_2(command: str, valid: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, *valid, "--no-such-option"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: lightning-kd {command}" in err and "--no-such-option" in err


def test_importance_takes_a_config_dir_and_overrides_only(tmp_path: Path, capsys) -> None:
    """--config-dir was refused as a flag: a teacher or experiment of your own could be
    trained with student.layers=importance but not ranked."""
    with pytest.raises(SystemExit) as exit_:
        main(["importance", "--layers", "3"])
    assert exit_.value.code == 2
    assert (
        "takes --config-dir, --cfg job and config overrides only, not ['--layers']"
        in capsys.readouterr().err
    )
    experiment = tmp_path / "my_conf" / "experiment" / "mine.yaml"
    experiment.parent.mkdir(parents=True)
    experiment.write_text("# @package _global_\nstudent:\n  num_layers: 2\n")
    argv = ["importance", "--config-dir", str(tmp_path / "my_conf"), "debug=smoke"]
    assert main([*argv, "experiment=mine", "data.max_train_examples=16"]) == 0
    out = capsys.readouterr().out
    assert "kept by" in out and "(2 layers" in out  # the experiment of my_conf/ was composed


def test_importance_checks_its_overrides_and_prints_its_config(capsys) -> None:
    """A mistyped key, option or a sweep was Hydra's traceback (exit 1), and ``--cfg job``, which
    the other config commands take, was refused as a flag."""
    for override, said in [
        ("distill.kdweight=1", "did you mean distill.kd_weight?"),
        ("teacher=tiny_lama", "did you mean teacher=tiny_llama?"),
        ("seed=0,1", "this command composes one config; give one value"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(["importance", "debug=smoke", override])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and said in err and "Traceback" not in err
    assert main(["importance", "debug=smoke", "student.num_layers=3", "--cfg", "job"]) == 0
    printed = capsys.readouterr().out
    assert "num_layers: 3" in printed and "kept by" not in printed  # composed, nothing ranked
    ddp = ["strategy=ddp", "trainer.devices=2", "data.max_train_examples=16"]
    assert main(["importance", "debug=smoke", *ddp]) == 0  # one process, said: it was silent
    assert "importance: one process ranks the layers (trainer.devices=2: for train and cache" in (
        capsys.readouterr().out
    )


def test_importance_says_an_int8_teacher_ranks_at_full_precision(capsys) -> None:
    """It printed the same table with teacher.quantize=int8 as without, saying nothing: the
    student is built (and ranked) before the teacher is quantized, in training as here."""
    pytest.importorskip("torchao")
    argv = ["importance", "debug=smoke", "data.max_train_examples=16", "teacher.quantize=int8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "teacher.quantize=int8 applies in training, once the student is built" in out
    assert "kept by" in out


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lightning_kd", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_hydra_commands_refuse_a_bad_option_and_an_unknown_key(tmp_path: Path) -> None:
    flag = run("train", "--no-such-option", cwd=tmp_path)
    assert flag.returncode == 2 and "unrecognized arguments: --no-such-option" in flag.stderr
    key = run("cache", "debug=smoke", "distill.no_such_key=1", cwd=tmp_path)
    assert key.returncode == 2 and "the config has no key distill.no_such_key" in key.stderr


def user_config_dir(tmp_path: Path) -> Path:
    conf = tmp_path / "my_conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "mine.yaml").write_text(MINE)
    return conf


def test_a_user_config_dir_composes_with_the_shipped_groups(tmp_path: Path) -> None:
    conf = user_config_dir(tmp_path)
    cfg = compose_config(["experiment=mine"], config_dirs=[conf])
    assert cfg.distill.temperature == 3.0 and cfg.trainer.max_steps == 7
    assert (
        cfg.teacher.config.num_hidden_layers
        == compose_config(["teacher=tiny_llama"]).teacher.config.num_hidden_layers
    )  # the shipped group it overrides to
    assert cfg.distill.divergence == compose_config([]).distill.divergence  # shipped default
    shown = run("train", "--config-dir", str(conf), "experiment=mine", "--cfg", "job", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "temperature: 3.0" in shown.stdout and "max_steps: 7" in shown.stdout
