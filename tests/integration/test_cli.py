"""The Hydra launch through the real command line: python run.py ..."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.cli import main as cli_main
from lightning_kd.models.precision import probe_hardware, resolve_precision
from lightning_kd.training.rundir import claim_run_dir
from tests.conftest import ROOT
from tests.unit.evaluation.test_evaluate import save_tiny


def run_cli(*overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python run.py <overrides>`` in the checkout, with ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "run.py", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=None if env is None else {**os.environ, **env},
    )


def command_here(capsys, verb: str, *overrides: str) -> subprocess.CompletedProcess:
    """``lightning-kd <verb> <overrides>`` (``run``: ``train``, as run.py) in this process, as the
    command line runs it, with its exit status and output as a subprocess's: for tests that read
    what a command prints and writes, without a fresh interpreter's seconds of imports."""
    argv = ["train" if verb == "run" else verb, *overrides]
    try:
        status = cli_main(argv)
    except SystemExit as leaving:
        status = leaving.code
    code = 0 if status is None else status if isinstance(status, int) else 1
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


def run_in_process(argv: list[str], capsys) -> tuple[int, str]:
    """``lightning-kd <argv>`` in this process, as the command line runs it: its exit status
    and what it printed, stdout and stderr together."""
    ran = command_here(capsys, *argv)
    return ran.returncode, ran.stdout + ran.stderr


def test_smoke_run_writes_everything_under_the_run_dir(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    # lm_eval.tasks: two questions of the shipped task on the exported student (seconds).
    lm_eval = ["lm_eval.tasks=[kd_heldout_choice]", "lm_eval.limit=2"]
    result = run_cli("debug=smoke", "export.gguf=q8_0", *lm_eval, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text(), parse_constant=no_constants)
    assert summary["steps"] == 6
    assert summary["after"]["val/ppl"] < summary["before"]["val/ppl"]
    assert summary["teacher_ppl"] > 0 and summary["tokens_per_second"] > 0
    assert summary["precision"]["trainer.precision"] == "32-true"  # debug=smoke pins it
    assert "precision: trainer.precision=32-true teacher.dtype=float32" in result.stdout
    assert "| student perplexity (val) |" in result.stdout
    assert "Resume with" not in result.stdout
    # Noise with nothing to act on: Lightning's advertisement, DeepSpeed's CPU notice.
    assert "Tip:" not in result.stdout + result.stderr
    assert "Setting accelerator to CPU" not in result.stdout
    assert (run_dir / "logs" / "metrics.csv").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    (scored,) = summary["lm_eval"]  # the student's row (debug=smoke's teacher has no weights)
    acc = scored["scores"]["kd_heldout_choice"]["acc"]
    assert scored["model"] == str(run_dir / "student") and acc in (0, 0.5, 1)
    with (run_dir / "logs" / "metrics.csv").open() as handle:
        logged = [row for row in csv.DictReader(handle) if row["lm_eval/kd_heldout_choice/acc"]]
    (logged,) = logged
    assert float(logged["lm_eval/kd_heldout_choice/acc"]) == acc and logged["step"] == "6"
    assert f"| kd_heldout_choice | acc | {run_dir / 'student'} | {acc:.4f} |" in result.stdout
    assert (run_dir / ".hydra" / "config.yaml").is_file()

    student = AutoModelForCausalLM.from_pretrained(run_dir / "student")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "student")
    ids = tokenizer("def f(x): return x", return_tensors="pt")["input_ids"]
    assert student.config.num_hidden_layers == 2
    assert torch.isfinite(student(ids).logits).all()
    # export.gguf=q8_0: the same student as one GGUF beside it, in the summary's written rows.
    gguf = AutoModelForCausalLM.from_pretrained(run_dir, gguf_file="student.q8_0.gguf")
    assert torch.allclose(gguf(ids).logits, student(ids).logits, atol=0.05)
    written = summary["written"]["student.q8_0.gguf"]
    assert written["bytes"] == (run_dir / "student.q8_0.gguf").stat().st_size

    assert "trainer.max_steps" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    log = run_dir / "train.log"  # Hydra's job log: created by the first line logged, if any
    assert not log.exists() or log.stat().st_size > 0

    # The finished run directory is not run into again by mistake (refused before any load),
    # and the refused launch leaves everything the run wrote as it was, its record included.
    # The refusals run in this process (each as the command line runs it): a fresh interpreter
    # would spend its seconds importing what a refusal never reaches.
    record = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    smoke = ["train", "debug=smoke"]
    code, output = run_in_process(
        [*smoke, "trainer.max_steps=3", f"hydra.run.dir={run_dir}"], capsys
    )
    assert code not in (0, None)
    assert f"run directory {run_dir} already holds a run's outputs" in output
    assert changed_files(run_dir, record) == []
    # A resume refused for its settings: nothing rewritten either (record, metrics), and no
    # "Resume with" pointing at the command that was just refused.
    further = ["trainer.max_steps=8", "resume_reset_optimizer=true", "distill.temperature=2"]
    resume = [*smoke, "ckpt_path=last", *further, f"hydra.run.dir={run_dir}"]
    code, output = run_in_process(resume, capsys)
    assert code not in (0, None) and "distill.temperature: checkpoint 1.0" in output
    assert "The latest checkpoint is" not in output  # the printed resume command's lead
    assert changed_files(run_dir, record) == []
    # Another run's checkpoint resumes nothing here (it would replace this run's outputs), and
    # this finished run has nothing left to resume at its own length.
    foreign = tmp_path / "elsewhere" / "last.ckpt"
    foreign.parent.mkdir()
    foreign.write_bytes((run_dir / "checkpoints" / "last.ckpt").read_bytes())
    code, output = run_in_process(
        [*smoke, f"ckpt_path={foreign}", f"hydra.run.dir={run_dir}"], capsys
    )
    # Refusals: exit 2 with the message alone, as for a bad value (they were tracebacks).
    assert code == 2 and "already holds a run's outputs" in output
    assert "Traceback" not in output
    code, output = run_in_process([*smoke, "ckpt_path=last", f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2 and f"the run in {run_dir} is finished" in output
    assert changed_files(run_dir, record) == []
    # Its checkpoint given by path to a new directory "trained" 0 steps and exited 0 (probe 52).
    fresh = [f"ckpt_path={run_dir}/checkpoints/last.ckpt", f"hydra.run.dir={tmp_path}/fresh"]
    code, output = run_in_process([*smoke, *fresh], capsys)
    assert code == 2 and f"the run in {run_dir} is finished" in output
    # The same for a launch refused because another process holds the directory (a running run;
    # in its own interpreter, since this one's claim would not stop this one).
    with claim_run_dir(run_dir, resuming=True, overwrite=False):
        longer = ["trainer.max_steps=8", "resume_reset_optimizer=true"]
        busy = run_cli("debug=smoke", "ckpt_path=last", *longer, f"hydra.run.dir={run_dir}")
    assert busy.returncode == 2 and "is in use by another run" in busy.stderr
    assert "Traceback" not in busy.stderr
    assert changed_files(run_dir, record) == []


def changed_files(run_dir: Path, record: dict[Path, bytes]) -> list[str]:
    """The files under ``run_dir`` whose bytes differ from ``record``'s (or that came or went),
    but the lock file (which names whichever process holds the directory)."""
    after = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    record, after = ({p: b for p, b in d.items() if p.name != ".lock"} for d in (record, after))
    return sorted(str(p) for p in record.keys() | after.keys() if record.get(p) != after.get(p))


def no_constants(name: str) -> None:
    raise ValueError(f"summary.json holds a bare {name}: not strict JSON")


@pytest.mark.slow  # another smoke run, lm-eval's whole shipped tasks on two models
def test_a_run_scores_the_teacher_beside_the_student(tmp_path: Path) -> None:
    save_tiny(tmp_path / "teacher", seed=0)
    run_dir = tmp_path / "run"
    teacher = [f"teacher.path={tmp_path / 'teacher'}", "teacher.config=null"]
    lm_eval = ["lm_eval.tasks=[kd_heldout]", "lm_eval.teacher=true"]
    result = run_cli("debug=smoke", *teacher, *lm_eval, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((run_dir / "summary.json").read_text())["lm_eval"]
    assert [(row["model"], row["teacher"]) for row in rows] == [
        (str(tmp_path / "teacher"), True),
        (str(run_dir / "student"), False),
    ]
    with (run_dir / "logs" / "metrics.csv").open() as handle:
        (logged,) = [
            row for row in csv.DictReader(handle) if row["lm_eval/kd_heldout_prose/bits_per_byte"]
        ]
    for prefix, row in (("teacher_", rows[0]), ("", rows[1])):
        for task, metrics in row["scores"].items():
            for metric, value in metrics.items():
                if value is not None:
                    assert float(logged[f"lm_eval/{task}/{prefix}{metric}"]) == value
    assert "| ÷ teacher |" in (run_dir / "summary.md").read_text()


def test_lm_eval_failing_after_training_leaves_the_summary(tmp_path, capsys, monkeypatch):
    """A task that fails once the run has trained (an offline hub dataset) lost the summary:
    it is written first, then the command fails, naming how to score the student again."""

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub")

    monkeypatch.setattr("lightning_kd.launch.harness_run.score_models", offline)
    run = tmp_path / "run"
    argv = ["train", "debug=smoke", "trainer.max_steps=1", "validate_before=false"]
    argv += ["lm_eval.tasks=[kd_heldout_choice]", "lm_eval.teacher=false", f"hydra.run.dir={run}"]
    code, output = run_in_process(argv, capsys)
    assert code not in (0, None)
    assert "lm_eval.tasks failed after training (ConnectionError" in output
    assert "Traceback" not in output and "Error executing job" not in output  # said whole
    assert f"lightning-kd evaluate --lm-eval kd_heldout_choice -- {run / 'student'}" in output
    assert json.loads((run / "summary.json").read_text())["steps"] == 1


def test_a_stop_during_lm_eval_after_training_ends_it_before_the_next_model(
    tmp_path, capsys, monkeypatch
):
    """SIGTERM in the teacher's lm-eval pass was acknowledged, then the student was scored too
    and the run exited 0, past a preemption's grace (probe 33)."""
    import os
    import signal

    def signalled(model, harness):
        os.kill(os.getpid(), signal.SIGTERM)  # while this model's pass runs
        return {"kd_heldout_choice": {"acc": 0.5}}

    from lightning_kd.models.loading import byte_tokenizer
    from tests.integration.test_cross_tokenizer_run import save_model

    monkeypatch.setattr("lightning_kd.evaluation.harness.run_tasks", signalled)
    teacher = save_model(tmp_path / "teacher", byte_tokenizer(), 0)  # a path lm-eval scores
    run = tmp_path / "run"
    argv = ["train", "debug=smoke", "trainer.max_steps=1", "validate_before=false"]
    argv += [f"teacher.path={teacher}", "teacher.config=null", "teacher.dtype=float32"]
    argv += ["lm_eval.tasks=[kd_heldout_choice]", "lm_eval.teacher=true", f"hydra.run.dir={run}"]
    code, output = run_in_process(argv, capsys)
    assert code == 143, output[-2000:]
    assert "SIGTERM received: stopped during lm_eval.tasks (the student and the summary" in output
    assert "--teacher " in output and f"-- {run / 'student'}`)" in output
    assert "Resume with" not in output and output.count("stopped during lm_eval") == 1
    assert json.loads((run / "summary.json").read_text())["steps"] == 1


def test_bad_config_values_fail_with_a_clear_message(tmp_path: Path, capsys) -> None:
    """Run in this process (``lightning-kd train`` as the CLI runs it): a process start-up each
    cost more than the runs themselves."""
    cases = {
        "debug=smoke distill.divergence=kl": "unknown divergence 'kl'",
        "teacher.path=/no/such/model": "teacher.path=/no/such/model does not exist",
        "debug=smoke teacher.path=x/y": "give exactly one of teacher.path",
        "debug=smoke student.num_layers=9": "student.num_layers=9 is larger than the teacher's 4",
        "debug=smoke student.layers=importance student.num_layers=9": (
            "student.num_layers=9 is larger than the teacher's 4 layers; choose 1..4"
        ),
        # the smoke corpus: 180 training blocks, 45 batches of 4 (each was 1 batch of 180, or
        # a window of 45 per step, said nowhere)
        "debug=smoke data.batch_size=200": "data.batch_size=200 but an epoch holds 180 training",
        "debug=smoke trainer.accumulate_grad_batches=64": (
            "trainer.accumulate_grad_batches=64 but an epoch is 45 batch(es)"
        ),
        "debug=smoke trainer.accumulate_grad_batches=64 distill.teacher_cache=null": (
            "trainer.accumulate_grad_batches=64 but an epoch is 45 batch(es)"
        ),
        # generated for minutes once training had ended, past the teacher's 512 positions
        "debug=smoke +callbacks=samples callbacks.samples.max_new_tokens=100000": (
            "callbacks.samples.max_new_tokens=100000 is longer than the teacher's 512 positions"
        ),
    }
    for number, override in enumerate(cases):
        # A directory each: a run that failed after its logger started leaves logs/ behind.
        argv = ["train", *override.split(), f"hydra.run.dir={tmp_path / str(number)}"]
        code, output = run_in_process(argv, capsys)
        assert code not in (0, None), override
        assert cases[override] in output, (override, output[-2000:])


def test_multirun_sweep_gives_each_job_its_own_directory(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    before = stray_run_dirs()
    result = run_cli(
        "-m",
        "debug=smoke",
        "distill.divergence=forward_kl,reverse_kl",
        "trainer.max_steps=2",
        "validate_before=false",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(path for path in sweep.iterdir() if path.is_dir() and path.name.isdigit())
    assert [job.name for job in jobs] == ["0", "1"]
    for job, divergence in zip(jobs, ("forward_kl", "reverse_kl"), strict=True):
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        assert f"distill.divergence={divergence}" in overrides
        assert json.loads((job / "summary.json").read_text())["steps"] == 2
        assert (job / "student" / "model.safetensors").is_file()
        assert (job / "checkpoints" / "last.ckpt").is_file()
        assert (job / "logs" / "metrics.csv").is_file()
    assert stray_run_dirs() == before, "nothing of the sweep lands in the working directory"
    # launched again into its directory: refused with the key a sweep reads (it named
    # hydra.run.dir, which a -m launch ignores)
    again = run_cli(*result.args[2:])
    assert again.returncode == 2
    assert "another sweep directory (hydra.sweep.dir=...: a -m launch" in again.stderr


def test_a_bad_value_in_any_job_of_a_sweep_is_refused_before_the_first_runs(tmp_path, capsys):
    """Hydra's basic launcher runs the jobs one after another: job 1's bad value was found once
    job 0 had trained, and job 2 never ran, without a word."""
    sweep = tmp_path / "sweep"
    argv = ["train", "-m", "debug=smoke", "distill.temperature=1,0,2", f"hydra.sweep.dir={sweep}"]
    code, output = run_in_process(argv, capsys)
    assert code == 2, output[-2000:]
    assert "job debug=smoke distill.temperature=0: distill.temperature=0: must be" in output
    assert not (sweep / "0").exists()


def test_a_sweeps_jobs_get_trains_whole_check_before_the_first_runs(tmp_path, capsys):
    """The sweep's check read each job's numbers alone: a misspelt divergence in the last job
    was found once the jobs before it had trained (probe 37). It is named now, with its job,
    before any runs (the other checks train makes: tests/unit/launch/test_train_checks.py)."""
    sweep = tmp_path / "sweep"
    argv = ["train", "-m", "debug=smoke", "distill.divergence=forward_kl,bogus"]
    code, output = run_in_process([*argv, f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 2, output[-2000:]
    assert "  job debug=smoke distill.divergence=bogus: unknown divergence 'bogus'" in output
    assert not sweep.exists() or not any(sweep.iterdir())


def test_a_failing_sweep_check_stops_the_sweep_with_its_traceback(tmp_path, capsys, monkeypatch):
    """Hydra turns a callback's exception into a warning and runs the jobs: a bug in the
    sweep's check let every job run unchecked, without a word."""
    from lightning_kd.cli import hydra_command

    def broken(config, job_errors, here=True):
        raise RuntimeError("the check's own bug")

    monkeypatch.setattr(hydra_command, "sweep_job_errors", broken)
    sweep = tmp_path / "sweep"
    argv = ["train", "-m", "debug=smoke", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    code, output = run_in_process(argv, capsys)
    assert code == 1, output[-2000:]
    assert "the sweep's check failed before any job ran" in output
    assert "RuntimeError: the check's own bug" in output
    assert not (sweep / "0").exists()


def stray_run_dirs() -> set[Path]:
    """Hydra's default run and sweep directories under the working directory."""
    return {*ROOT.glob("outputs/*/*"), *ROOT.glob("multirun/*/*")}


def test_local_directories_serve_as_teacher_and_student(tmp_path: Path, capsys) -> None:
    """A run's exported student is a plain HF directory: distil it further (teacher.path=DIR),
    and start a student from it (student.path=DIR) — nothing from a hub. (In this process: the
    command line's own process is the smoke test's.)"""
    first = tmp_path / "first"
    argv = ["train", "debug=smoke", "validate_before=false", f"hydra.run.dir={first}"]
    code, output = run_in_process(argv, capsys)
    assert code in (0, None), output[-3000:]
    exported = first / "student"
    runs = {
        # auto precision, as the default run resolves it on this machine
        "teacher": [
            "teacher.config=null",
            f"teacher.path={exported}",
            "student.num_layers=1",
            "trainer.precision=auto",
            "teacher.dtype=auto",
        ],
        "student": [f"student.path={exported}"],
    }
    for role, overrides in runs.items():
        run_dir = tmp_path / role
        code, output = run_in_process(
            ["train", "debug=smoke", *overrides, f"hydra.run.dir={run_dir}"], capsys
        )
        assert code in (0, None), (role, output[-3000:])
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 6 and summary["after"]["val/ppl"] > 0
    expected = resolve_precision("auto", "auto", probe_hardware("cpu"))
    summary = json.loads((tmp_path / "teacher" / "summary.json").read_text())
    assert summary["precision"] == expected.as_dict()
    config = json.loads((tmp_path / "teacher" / "student" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
