"""``lm_eval.tasks`` at the end of a run: what the config asks for, the teacher it scores, the
metrics logged to the run's loggers and the summary's table. The run itself, through the
command: tests/integration/test_cli.py."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from lightning_kd.evaluation.harness import Harness
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.harness_run import (
    DEFAULTS,
    evaluate_run,
    harness_errors,
    harness_of,
    teacher_name,
)
from lightning_kd.training.summary import RunSummary
from tests.unit.evaluation.test_evaluate import save_tiny


def test_the_config_asks_for_nothing_by_default_and_names_the_teacher() -> None:
    assert harness_of(compose_config([])) is None
    assert harness_errors(compose_config([])) == []
    assert OmegaConf.to_container(compose_config([]).lm_eval) == {"tasks": None, **DEFAULTS}
    assert harness_of({}) is None and harness_errors({}) == []  # a config without the node
    cfg = compose_config(["lm_eval.tasks=[kd_heldout_choice,kd_heldout_prose]", "lm_eval.limit=5"])
    assert harness_of(cfg) == Harness(
        tasks=("kd_heldout_choice", "kd_heldout_prose"),
        include=(),
        batch_size=8,
        device="cpu",
        limit=5,
    )
    assert teacher_name(cfg) == "smollm2"  # evaluated as `evaluate` names it: its own cache
    # A run that runs its models' own code has lm-eval run it: it refused them (probe 45).
    trusting = compose_config(
        ["lm_eval.tasks=[kd_heldout_choice]", "teacher.trust_remote_code=true"]
    )
    assert harness_of(trusting).trust_remote_code and not harness_of(cfg).trust_remote_code
    assert teacher_name(compose_config(["debug=smoke"])) is None  # no saved weights to score
    encoder = compose_config(["experiment=minilm", "lm_eval.tasks=kd_heldout"])
    assert harness_errors(encoder) == [
        "lm_eval.tasks=['kd_heldout'] with teacher.task=encoder: lm-eval scores causal LMs"
    ]


def test_the_end_of_a_run_logs_and_tabulates_the_student_and_the_teacher(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_tiny(tmp_path / "teacher", 0), save_tiny(tmp_path / "run" / "student", 1)
    overrides = ["debug=smoke", f"teacher.path={tmp_path / 'teacher'}", "teacher.config=null"]
    overrides += ["lm_eval.tasks=kd_heldout_choice", "lm_eval.limit=2", "lm_eval.teacher=true"]
    cfg = compose_config(overrides)
    assert harness_errors(cfg) == []
    logger = CSVLogger(tmp_path / "run" / "logs", name="", version="")
    trainer = SimpleNamespace(loggers=[logger], global_step=6)

    rows = evaluate_run(cfg, tmp_path / "run" / "student", trainer)

    assert [row["model"] for row in rows] == [
        str(tmp_path / "teacher"),
        str(tmp_path / "run" / "student"),
    ]
    (logged,) = csv.DictReader((tmp_path / "run" / "logs" / "metrics.csv").open())
    student, teacher = (row["scores"]["kd_heldout_choice"] for row in reversed(rows))
    assert logged["step"] == "6"
    assert float(logged["lm_eval/kd_heldout_choice/acc"]) == student["acc"]
    assert float(logged["lm_eval/kd_heldout_choice/teacher_acc_norm"]) == teacher["acc_norm"]
    table = RunSummary(after={}, lm_eval=rows).markdown()
    assert "lm-eval on the exported student:" in table
    assert f"| kd_heldout_choice | acc | {tmp_path / 'teacher'} (teacher) |" in table


def test_a_device_lm_eval_cannot_run_on_is_refused_before_the_run(monkeypatch) -> None:
    """Found by lm-eval only after the run had trained, as a traceback."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    tasks = ["lm_eval.tasks=[kd_heldout_choice]", "lm_eval.teacher=false", "debug=smoke"]
    assert harness_errors(compose_config([*tasks, "lm_eval.device=cuda"])) == [
        "lm_eval.device=cuda: this machine has no cuda device; give cpu"
    ]
    assert harness_errors(compose_config([*tasks, "lm_eval.device=bogus"])) == [
        "lm_eval.device='bogus' is not a device; give cpu, cuda or cuda:N"
    ]
    assert harness_errors(compose_config([*tasks, "lm_eval.device=cpu"])) == []


def test_an_int8_teachers_row_says_lm_eval_scored_its_float_weights(
    tmp_path: Path, monkeypatch
) -> None:
    """lm-eval loads the teacher's saved weights: with teacher.quantize=int8 the row named "the
    teacher" scored the float model, not the int8 one the student learnt from (probe 55)."""
    scores = {"kd_heldout_choice": {"acc": 0.5, "acc_stderr": 0.1}}

    def scored(models, harness, teacher, before_each):
        named = [(teacher, True), *((model, False) for model in models)]
        return [{"model": m, "teacher": t, "scores": scores} for m, t in named]

    monkeypatch.setattr("lightning_kd.launch.harness_run.score_models", scored)
    overrides = ["lm_eval.tasks=kd_heldout_choice", "lm_eval.teacher=true"]
    trainer = SimpleNamespace(loggers=[], global_step=6)
    held = evaluate_run(compose_config([*overrides, "teacher.quantize=int8"]), tmp_path, trainer)
    table = RunSummary(after={}, lm_eval=held).markdown()
    assert "| smollm2 (teacher, float weights: the run distilled its int8 copy) |" in table
    plain = evaluate_run(compose_config(overrides), tmp_path, trainer)
    assert "| smollm2 (teacher) |" in RunSummary(after={}, lm_eval=plain).markdown()
