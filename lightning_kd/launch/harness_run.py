"""lm-eval's tasks at the end of a run (``lm_eval.tasks``): checked before anything loads, run on
the exported student (and the teacher, for the ratio) once it is written, logged to the run's
loggers as ``lm_eval/<task>/<metric>`` (the teacher's as ``lm_eval/<task>/teacher_<metric>``) and
returned for the summary."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_kd.evaluation.harness import (
    Harness,
    device_errors,
    logged_metrics,
    score_models,
    task_errors,
    task_names,
)
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.models.sources import teacher_dir
from lightning_kd.utils.stopping import STOP, Interrupted

DEFAULTS = {"include": [], "teacher": True, "batch_size": 8, "limit": None, "device": "cpu"}
"""The ``lm_eval`` node's keys beside ``tasks`` where a config leaves them out (conf/config.yaml
writes the same; a test holds the two equal)."""


def setting(cfg: Mapping, key: str) -> Any:
    """``cfg``'s ``lm_eval.<key>``, or its :data:`DEFAULTS` value where the config has none."""
    value = lookup(cfg, f"lm_eval.{key}")
    return DEFAULTS.get(key) if value is ABSENT else value


def harness_of(cfg: Mapping) -> Harness | None:
    """What ``cfg``'s ``lm_eval`` node asks for (None: no tasks, nothing to run)."""
    tasks = task_names(setting(cfg, "tasks"))
    if not tasks:
        return None
    include = setting(cfg, "include") or ()
    return Harness(
        tasks=tasks,
        include=(include,) if isinstance(include, str) else tuple(map(str, include)),
        batch_size=setting(cfg, "batch_size"),
        device=str(setting(cfg, "device")),
        limit=setting(cfg, "limit"),
        trust_remote_code=trusts_code(cfg),
    )


GROUPS = ("student", "teacher")
"""The config groups whose ``trust_remote_code`` says the run runs its models' own code."""


def trusts_code(cfg: Mapping) -> bool:
    """Whether the run runs its models' own code (``student``'s or ``teacher``'s
    ``trust_remote_code``): lm-eval then does too (it refused a custom-code student, probe 45)."""
    return any(lookup(cfg, f"{group}.trust_remote_code") is True for group in GROUPS)


def harness_errors(cfg: Mapping) -> list[str]:
    """Why ``lm_eval.tasks`` cannot run at the end of this run (lm-eval missing, a task it does
    not know, no student exported, a teacher with no saved weights), before anything loads."""
    harness = harness_of(cfg)
    if harness is None:
        return []
    tasks = f"lm_eval.tasks={list(harness.tasks)}"
    errors = []
    if lookup(cfg, "export_student") is not True:
        errors.append(f"{tasks} scores the exported student: set export_student=true")
    if lookup(cfg, "teacher.task") == "encoder":
        errors.append(f"{tasks} with teacher.task=encoder: lm-eval scores causal LMs")
    scores_teacher = setting(cfg, "teacher")
    if not isinstance(scores_teacher, bool):
        errors.append(f"lm_eval.teacher={scores_teacher!r}: use true or false")
    elif scores_teacher and lookup(cfg, "teacher.path") in (None, ABSENT):
        errors.append(
            "lm_eval.teacher=true scores the teacher's saved weights, but teacher.path=null "
            "builds it from teacher.config: set lm_eval.teacher=false"
        )
    errors += device_errors(harness.device, "lm_eval.device")
    return errors + task_errors(harness.tasks, harness.include, "lm_eval.tasks", "lm_eval.include")


class ScoringFailed(RuntimeError):
    """``lm_eval.tasks`` failed once the run had trained and written its student: said whole,
    exit 1 (its cause was a traceback under Hydra's)."""


def stop_between(kept: str) -> None:
    """A stop asked for during lm-eval ends it before the next model (each model's pass runs
    whole: lm-eval has no clean point inside it), said here with ``kept``. It was acknowledged,
    then every model was scored and the run exited 0, past a preemption's grace."""
    try:
        STOP.check("during lm_eval.tasks", detail=kept)
    except Interrupted as stop:
        print(f"\n{stop}", flush=True)
        stop.reported = True
        raise


def teacher_name(cfg: Mapping) -> str | None:
    """The teacher as ``evaluate`` names a model (``smollm2``, a directory, a hub id), or None
    when ``lm_eval.teacher`` is off."""
    if not setting(cfg, "teacher"):
        return None
    path, gguf_file = lookup(cfg, "teacher.path"), lookup(cfg, "teacher.gguf_file")
    if gguf_file not in (None, ABSENT):  # a GGUF file in a directory: its converted copy
        return teacher_dir(path, gguf_file)
    return path


def evaluate_run(cfg: Mapping, student_dir: Path, trainer) -> list[dict] | None:
    """The tasks of ``cfg``'s ``lm_eval`` node on the student in ``student_dir`` (and the
    teacher), logged at the run's last step to each of ``trainer.loggers``; the table's rows for
    the summary (None when no task is asked for)."""
    harness = harness_of(cfg)
    if harness is None:
        return None
    teacher = teacher_name(cfg)
    again = f"lightning-kd evaluate --lm-eval {','.join(harness.tasks)}"
    again += " --trust-remote-code" if harness.trust_remote_code else ""
    again += f"{f' --teacher {teacher}' if teacher is not None else ''} -- {student_dir}"
    kept = f"the student and the summary are written; score them with `{again}`"
    try:
        rows = score_models([str(student_dir)], harness, teacher, lambda: stop_between(kept))
    except Interrupted:
        raise
    except Exception as error:  # the run is trained and exported: say how to score it again
        raise ScoringFailed(
            f"lm_eval.tasks failed after training ({type(error).__name__}: {error}); the student "
            f"and the summary are written: score it again with `{again}`"
        ) from error
    if teacher is not None and (mode := lookup(cfg, "teacher.quantize")) not in (None, ABSENT):
        rows[0]["held"] = f"float weights: the run distilled its {mode} copy"  # probe 55
    metrics = logged_metrics(rows[-1]["scores"])
    if teacher is not None:
        metrics |= logged_metrics(rows[0]["scores"], prefix="teacher_")
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
        logger.save()
    return rows
