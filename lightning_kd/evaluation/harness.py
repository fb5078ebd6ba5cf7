"""lm-eval's tasks on saved models: the library half of ``lightning-kd evaluate --lm-eval`` and of
``lm_eval.tasks`` at the end of a run.

    lightning-kd evaluate --lm-eval kd_heldout --teacher smollm2 -- runs/kd/student

Each model is scored through lm-eval's own Python API (``lm_eval.simple_evaluate``, its ``hf``
model on the ``save_pretrained`` directory, lm-eval's defaults otherwise), so a figure here is the
one ``lm_eval --model hf --model_args pretrained=DIR,dtype=float32 --tasks NAME --include_path
DIR --device cpu`` prints for the same model (a test holds the two equal). Task names are
lm-eval's own (``hellaswag``, ``arc_easy``: lm-eval downloads their data from the Hugging Face hub
on first use), those of the include directories, or the package's (:data:`TASKS_DIR`, always
included, no network: ``kd_heldout_choice``, ``kd_heldout_prose``, the tag ``kd_heldout`` for
both). lm-eval is an optional dependency: ``pip install 'lightning-kd[eval]'``.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from lightning_kd.evaluation.saved_models import model_location
from lightning_kd.utils.refusal import first_line

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
"""The package's own lm-eval tasks, held-out text no training corpus of it holds."""
INSTALL = "pip install 'lightning-kd[eval]'"


@dataclass(frozen=True)
class Harness:
    """Which lm-eval tasks to run, and how (the ``hf`` model's arguments)."""

    tasks: tuple[str, ...]
    """Task, group or tag names, as ``lm_eval --tasks`` takes them."""
    include: tuple[str, ...]
    """Directories of task YAMLs of the user's own (``lm_eval --include_path``)."""
    batch_size: int
    device: str
    """Where the models run: ``cpu``, ``cuda``, ``cuda:1``."""
    limit: int | None
    """At most this many examples of each task (lm-eval's ``--limit``: for a quick look only)."""
    dtype: str = "float32"
    """The weights' dtype, as every ``evaluate`` measurement loads them."""
    trust_remote_code: bool = False
    """Run a model's own code (a custom architecture's), as its run did."""


def task_names(tasks: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"a,b"`` or ``["a", "b,c"]`` as the names they hold (lm-eval's comma lists)."""
    if tasks is None:
        return ()
    entries = [tasks] if isinstance(tasks, str) else list(tasks)
    return tuple(
        name.strip() for entry in entries for name in str(entry).split(",") if name.strip()
    )


def missing_lm_eval(key: str) -> str | None:
    """Why ``key`` cannot run (lm-eval not installed, with the fix), or None."""
    if find_spec("lm_eval") is None:
        return f"{key} runs lm-eval, which is not installed: {INSTALL}"
    return None


def task_manager(include: Sequence[str], names: Sequence[str] = (), metadata: dict | None = None):
    """lm-eval's ``TaskManager`` over the package's tasks and ``include``; lm-eval's own tasks
    too unless every one of ``names`` is a task or tag found there (indexing lm-eval's 14,000
    task files takes seconds; a group may name any task, so it takes the full index)."""
    if message := missing_lm_eval("lm-eval"):
        raise ModuleNotFoundError(message)
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR), *include]
    local = TaskManager(include_path=paths, include_defaults=False, metadata=metadata)
    if names and set(names) <= set(local.all_subtasks) | set(local.all_tags):
        return local
    return TaskManager(include_path=paths, metadata=metadata)


def task_errors(
    tasks: Sequence[str], include: Sequence[str], key: str, include_key: str
) -> list[str]:
    """Each of ``tasks`` lm-eval does not know (with its nearest names) and each ``include``
    directory that is not one, before any model loads; ``key`` and ``include_key`` name the
    options (or config keys) that gave them."""
    if message := missing_lm_eval(key):
        return [message]
    if not tasks:
        return [f"{key} names no task: give lm-eval task names, e.g. {key}=kd_heldout"]
    errors = [
        f"{include_key}={path}: no such directory (a directory of lm-eval task YAMLs)"
        for path in include
        if not Path(path).is_dir()
    ]
    if errors:
        return errors
    manager = task_manager(include, tasks)  # lm-eval's own index takes seconds: built once
    known = manager.all_tasks
    for name in tasks:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f"nearest: {', '.join(near)}" if near else "see `lm_eval ls tasks`"
            errors.append(
                f"{key}: lm-eval has no task {name!r} ({hint}); the package's own: "
                "kd_heldout_choice, kd_heldout_prose (both: kd_heldout)"
            )
    if errors:  # lm-eval's index skips a YAML that does not parse, without a word
        return errors + unreadable_yaml_errors(include, include_key)
    return task_data_errors(tasks, manager, key, include_key)


def unreadable_yaml_errors(include: Sequence[str], include_key: str) -> list[str]:
    """Each task YAML of the ``include`` directories that does not parse (its task was said
    unknown, the user sent to `lm_eval ls tasks` and not to the line of their file)."""
    import yaml

    class Tagged(yaml.SafeLoader):  # lm-eval's !function and the like: read, not run
        pass

    Tagged.add_multi_constructor("!", lambda loader, suffix, node: None)
    errors = []
    for path in sorted(p for directory in include for p in Path(directory).rglob("*.yaml")):
        try:
            yaml.load(path.read_text(encoding="utf-8"), Loader=Tagged)  # a SafeLoader
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            where = getattr(error, "problem_mark", None)
            line = f" line {where.line + 1}" if where is not None else ""
            errors.append(
                f"{include_key}: {path}{line} does not parse as YAML, so lm-eval skips its task "
                f"({first_line(error)})"
            )
    return errors


def task_data_errors(tasks: Sequence[str], manager: Any, key: str, include_key: str) -> list[str]:
    """Each of ``tasks`` whose data lm-eval cannot load here (a hub dataset with no network, a
    file of a task of one's own gone), found by building the tasks once before any model loads:
    it was a ``ConnectionError`` traceback after the models had loaded (after training, in a
    run), through ``manager`` (:func:`task_manager`'s). lm-eval builds them again for each
    model, from the datasets cache."""
    logging.getLogger("lm_eval.api.task").addFilter(custom_dataset_advice)
    errors = []
    for name in tasks:
        try:
            manager.load([name])
        except OSError as error:  # ConnectionError, FileNotFoundError (datasets' not found)
            errors.append(
                f"{key}: lm-eval cannot load the data of task {name!r} here "
                f"({type(error).__name__}: {first_line(error)}). A task read from the Hugging "
                "Face hub needs the network once (the datasets cache keeps it; then "
                "HF_DATASETS_OFFLINE=1 reads it offline); without it, use a task of local files "
                f"({include_key}=DIR, or the package's kd_heldout)"
            )
    return errors


def device_errors(device: str, key: str) -> list[str]:
    """Where lm-eval is to run the models: a device torch knows and this machine has (found
    by lm-eval only once it loads a model: after the training run it scores)."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        return [f"{key}={device!r} is not a device; give cpu, cuda or cuda:N"]
    present = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not present.get(kind, True):
        return [f"{key}={device}: this machine has no {kind} device; give cpu"]
    return []


def run_tasks(model: str, harness: Harness) -> dict[str, dict[str, float | None]]:
    """``harness``'s tasks on ``model`` (a directory, a Hugging Face id or ``smollm2``):
    ``{task: {metric: value, metric_stderr: value or None}}`` as lm-eval reports them."""
    from lm_eval import simple_evaluate

    logging.getLogger("lm_eval.api.task").addFilter(custom_dataset_advice)
    location = model_location(model)
    if Path(location).is_dir():  # lm-eval asks the hub about a relative path shaped like org/name
        location = str(Path(location).resolve())
    arguments = {"pretrained": location, "dtype": harness.dtype}
    if harness.trust_remote_code:  # lm-eval's hf model refused a custom-code one (probe 45)
        arguments["trust_remote_code"] = True
    results = simple_evaluate(
        model="hf",
        model_args=arguments,
        tasks=list(harness.tasks),
        batch_size=harness.batch_size,
        device=harness.device,
        limit=harness.limit,
        log_samples=False,
        task_manager=task_manager(harness.include, harness.tasks, arguments),
    )
    return scores(results["results"])


def custom_dataset_advice(record: logging.LogRecord) -> bool:
    """Drop lm-eval's advice to pass ``--metadata`` that a task with a ``custom_dataset`` (the
    package's: ``tasks/kd_heldout/files.py``) triggers each time it loads: it needs none."""
    return "Custom kwargs can be passed" not in record.getMessage()


def scores(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """lm-eval's ``results`` (``{task: {"acc,none": ..., "acc_stderr,none": ...}}``) keyed by
    metric alone (``acc``, ``acc_stderr``; ``exact_match_strict-match`` and
    ``exact_match_strict-match_stderr`` for another filter than ``none``); a stderr lm-eval did
    not compute ("N/A") is None."""
    table = {}
    for task, entries in results.items():
        table[task] = {}
        for name, value in entries.items():
            metric, comma, kept = name.partition(",")
            if not comma:
                continue  # alias, name, sample_len
            key = metric if kept == "none" else filtered(metric, kept)
            table[task][key] = float(value) if isinstance(value, int | float) else None
    return table


def filtered(metric: str, kept: str) -> str:
    """The key of ``metric`` under lm-eval's filter ``kept``, its stderr's ending in ``_stderr``
    as every stderr does (``exact_match_strict-match_stderr``): the table reads a stderr by that
    ending (``exact_match_stderr_strict-match`` was shown as a score of its own)."""
    if metric.endswith("_stderr"):
        return f"{metric.removesuffix('_stderr')}_{kept}_stderr"
    return f"{metric}_{kept}"


def score_models(
    models: Sequence[str],
    harness: Harness,
    teacher: str | None = None,
    before_each: Callable[[], None] | None = None,
) -> list[dict]:
    """A row per model (``teacher`` first, marked), each with its :func:`run_tasks` scores;
    ``before_each`` is called before each model (a run's stop request raises there)."""
    named = ([(teacher, True)] if teacher is not None else []) + [(m, False) for m in models]
    rows = []
    for name, is_teacher in named:
        if before_each is not None:
            before_each()
        rows.append({"model": name, "teacher": is_teacher, "scores": run_tasks(name, harness)})
        print(f"{name}: lm-eval {', '.join(harness.tasks)} done", flush=True)
    return rows


def logged_metrics(scores: dict[str, dict[str, float | None]], prefix: str = "") -> dict:
    """``{"lm_eval/<task>/<prefix><metric>": value}`` for a logger (a stderr lm-eval did not
    compute left out)."""
    return {
        f"lm_eval/{task}/{prefix}{metric}": value
        for task, metrics in scores.items()
        for metric, value in metrics.items()
        if value is not None
    }


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"


def marked(row: dict) -> str:
    """The teacher row's mark, with how its model was held otherwise than the run held it
    (``held``: an int8 teacher's lm-eval scores its float weights)."""
    return f"teacher, {row['held']}" if row.get("held") else "teacher"


def markdown(rows: list[dict]) -> str:
    """The rows as one markdown table: a line per task, metric and model, with its stderr and,
    when a teacher row is there, the model's value over the teacher's."""
    teacher = next((row["scores"] for row in rows if row["teacher"]), None)
    head = "| task | metric | model | value | ± stderr |" + (" ÷ teacher |" if teacher else "")
    lines = [head, "|---|---|---|---:|---:|" + ("---:|" if teacher else "")]
    for task, metrics in rows[0]["scores"].items():
        for metric in (m for m in metrics if not m.endswith("_stderr")):
            for row in rows:
                value = row["scores"][task][metric]
                name = f"{row['model']} ({marked(row)})" if row["teacher"] else row["model"]
                line = f"| {task} | {metric} | {name} | {fmt(value)} | "
                line += f"{fmt(row['scores'][task].get(f'{metric}_stderr'))} |"
                if teacher:
                    reference = teacher[task][metric]
                    ratio = value / reference if value is not None and reference else None
                    line += f" {'—' if ratio is None else f'{ratio:.3f}'} |"
                lines.append(line)
    return "\n".join(lines)
