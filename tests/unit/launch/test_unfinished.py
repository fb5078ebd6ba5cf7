"""A training run stopped before it saved ``student/``: ``export`` and ``evaluate`` given its
directory, its missing ``student/`` or its checkpoint say so and print the command that finishes
it (they said only "does not exist" or "is a file, not a model directory ... gguf_file"); the
directory of a ``generate`` or ``cache`` run is named as what it is, no run to train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_kd.cli import main
from lightning_kd.launch.unfinished import unfinished_run_error


def stopped_run(tmp_path: Path, checkpoint: bool = True) -> Path:
    run = tmp_path / "runs" / "kd"
    (run / ".hydra").mkdir(parents=True)
    overrides = "- experiment=instruct\n- trainer.max_steps=40\n"
    (run / ".hydra" / "overrides.yaml").write_text(overrides)
    (run / "logs").mkdir()
    (run / "logs" / "metrics.csv").write_text("step,loss\n1,2.0\n")
    if checkpoint:
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_bytes(b"lightning checkpoint")
    return run


FINISH = (
    "finish it with `lightning-kd train experiment=instruct trainer.max_steps=40 "
    "hydra.run.dir={run} ckpt_path=last`, then give {run}/student"
)


@pytest.mark.parametrize("given", ["run", "student", "checkpoint"])
def test_export_and_evaluate_of_an_unfinished_run_print_the_command_that_finishes_it(
    tmp_path, capsys, given
) -> None:
    run = stopped_run(tmp_path)
    path = {"run": run, "student": run / "student", "checkpoint": run / "checkpoints/last.ckpt"}
    argument = str(path[given])
    assert main(["export", argument, "--gguf", "f16"]) == 2
    exported = capsys.readouterr().err
    assert main(["evaluate", "--files", str(run / "logs/metrics.csv"), "--", argument]) == 2
    evaluated = capsys.readouterr().err
    for err, key in ((exported, "the directory"), (evaluated, "model")):
        assert FINISH.format(run=run) in err and "Traceback" not in err
        if given == "checkpoint":
            assert f"{key} {argument} is a training checkpoint, not a model" in err
            assert "gguf_file" not in err  # the config key's advice, which evaluate has not
        else:
            assert f"{key} {argument}: the run {run} has not saved its student" in err
    assert not list(tmp_path.rglob("*.gguf"))


def test_a_run_stopped_before_its_first_checkpoint_is_started_again(tmp_path) -> None:
    run = stopped_run(tmp_path, checkpoint=False)
    error = unfinished_run_error(run / "student", "model")
    assert error is not None and "ckpt_path" not in error
    # Its logs/ would block a fresh run there: the command says overwrite=true.
    assert f"hydra.run.dir={run} overwrite=true`" in error


def test_an_earlier_run_waiting_aside_is_pointed_at_not_overwritten(tmp_path) -> None:
    """After an overwriting run was killed before its first checkpoint, export and evaluate
    advised overwrite=true, which sets the earlier finished run aside again (probe 59)."""
    run = stopped_run(tmp_path, checkpoint=False)
    (run / ".overwritten" / "student").mkdir(parents=True)
    (run / ".overwritten" / "student" / "config.json").write_text("{}")
    error = unfinished_run_error(run / "student", "model")
    assert "the earlier run's student waits in" in error and "overwrite=true`" not in error
    assert f"`lightning-kd train hydra.run.dir={run}` (without ckpt_path or overwrite" in error


def test_a_finished_runs_checkpoint_points_at_its_student_and_other_paths_pass(tmp_path) -> None:
    run = stopped_run(tmp_path)
    (run / "student").mkdir()
    (run / "student" / "config.json").write_text("{}")
    error = unfinished_run_error(run / "checkpoints" / "last.ckpt", "model")
    assert error == (
        f"model {run}/checkpoints/last.ckpt is a training checkpoint, not a model: the run's "
        f"final student is {run}/student; give that"
    )
    assert unfinished_run_error(run / "student", "model") is None  # finished: loaded as it is
    assert unfinished_run_error(run, "model") is None  # the loader names run/student
    assert unfinished_run_error(tmp_path / "elsewhere", "model") is None
    assert unfinished_run_error(Path("smollm2"), "model") is None


def test_a_run_launched_with_config_dir_is_finished_with_it(tmp_path) -> None:
    run = stopped_run(tmp_path)
    sources = [
        {"path": "/opt/lightning_kd/conf", "schema": "file", "provider": "main"},
        {"path": "/home/me/my_conf", "schema": "file", "provider": "command-line"},
    ]
    record = {"hydra": {"runtime": {"config_sources": sources}, "job": {"config_name": "mine"}}}
    (run / ".hydra" / "hydra.yaml").write_text(OmegaConf.to_yaml(record))
    error = unfinished_run_error(run, "model")
    assert error is not None
    # The shipped configs' path is not repeated: it is wherever the package is installed.
    start = "`lightning-kd train --config-dir /home/me/my_conf --config-name mine experiment="
    assert start in error


def test_a_run_whose_record_is_damaged_is_told_how_to_finish_it_all_the_same(tmp_path) -> None:
    """A damaged .hydra/overrides.yaml made export and evaluate of the run a YAML traceback."""
    run = stopped_run(tmp_path)
    (run / ".hydra" / "overrides.yaml").write_text("- debug=smoke\n  : : [unclosed\n")
    error = unfinished_run_error(run, "model")
    assert error is not None and "has not saved its student" in error
    assert (
        f"finish it with `lightning-kd train <the run's own overrides> hydra.run.dir={run} "
        f"ckpt_path=last` (its record {run / '.hydra'} cannot be read: " in error
    )


def other_output(tmp_path: Path, command: str, record: bool) -> Path:
    """A finished ``generate`` or ``cache`` directory: Hydra's record (its overrides, and with
    ``record`` its job name) and the command's outputs."""
    run = tmp_path / "runs" / command
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- experiment=instruct\n")
    if record:
        job = {"hydra": {"job": {"name": command, "config_name": "config"}}}
        (run / ".hydra" / "hydra.yaml").write_text(OmegaConf.to_yaml(job))
    if command == "generate":
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        (run / "completions.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    else:
        (run / "shards").mkdir()
        for name in ("index.json", "meta.json"):
            (run / name).write_text("{}")
    return run


@pytest.mark.parametrize("record", [True, False], ids=["hydra's record", "its files alone"])
@pytest.mark.parametrize("command", ["generate", "cache"])
def test_a_generate_or_cache_directory_is_no_model_and_no_run_to_train(
    tmp_path, capsys, command, record
) -> None:
    """Both took any directory Hydra had recorded for a stopped training run and said to finish
    it with `lightning-kd train <the generate run's overrides> hydra.run.dir=DIR` (probe 38)."""
    run = other_output(tmp_path, command, record)
    text = tmp_path / "heldout.txt"
    text.write_text("Some held-out text.\n")
    assert main(["export", str(run), "--gguf", "f16"]) == 2
    exported = capsys.readouterr().err
    assert main(["evaluate", "--files", str(text), "--", str(run / "student")]) == 2
    evaluated = capsys.readouterr().err
    said = f"is a `lightning-kd {command}` output directory"
    assert f"the directory {run} {said}" in exported
    assert f"model {run / 'student'}: {run} {said}" in evaluated
    for err in (exported, evaluated):
        assert "give a saved model instead, e.g. a training run's student/ directory" in err
        assert "lightning-kd train" not in err and "has not saved its student" not in err
        assert "Traceback" not in err
    assert not list(tmp_path.rglob("*.gguf"))
