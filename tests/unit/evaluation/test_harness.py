"""lm-eval through the package: task names, lm-eval's results read back, the table, the shipped
tasks (held out, readable from anywhere). Scoring a model is in test_evaluate.py and, against
the standalone ``lm_eval`` command, in tests/integration/test_lm_eval_standalone.py."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest

from lightning_kd.evaluation import harness
from lightning_kd.evaluation.harness import (
    TASKS_DIR,
    Harness,
    logged_metrics,
    markdown,
    run_tasks,
    scores,
    task_errors,
    task_names,
)

CORPUS = Path(harness.__file__).parents[1] / "data" / "corpus"


def test_task_names_take_lm_evals_comma_lists() -> None:
    assert task_names("kd_heldout_choice, kd_heldout_prose") == (
        "kd_heldout_choice",
        "kd_heldout_prose",
    )
    assert task_names(["hellaswag", "arc_easy,arc_challenge"]) == (
        "hellaswag",
        "arc_easy",
        "arc_challenge",
    )
    assert task_names(None) == ()


def test_results_are_keyed_by_metric_and_an_uncomputed_stderr_is_none() -> None:
    results = {
        "kd_heldout_choice": {
            "alias": "kd_heldout_choice",
            "acc,none": 0.5,
            "acc_stderr,none": 0.1,
        },
        "kd_heldout_prose": {"word_perplexity,none": 80.0, "word_perplexity_stderr,none": "N/A"},
        "gsm8k": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.05},
    }
    # A filtered stderr ends in _stderr as every stderr does: it was read as a score of its own
    # (exact_match_stderr_strict-match), its stderr column empty (probe 33).
    assert scores(results) == {
        "kd_heldout_choice": {"acc": 0.5, "acc_stderr": 0.1},
        "kd_heldout_prose": {"word_perplexity": 80.0, "word_perplexity_stderr": None},
        "gsm8k": {"exact_match_strict-match": 0.25, "exact_match_strict-match_stderr": 0.05},
    }
    rows = [{"model": "m", "teacher": False, "scores": scores(results)}]
    assert "| gsm8k | exact_match_strict-match | m | 0.2500 | 0.0500 |" in markdown(rows)
    assert "stderr_strict" not in markdown(rows)
    assert logged_metrics(scores(results), prefix="teacher_") == {
        "lm_eval/kd_heldout_choice/teacher_acc": 0.5,
        "lm_eval/kd_heldout_choice/teacher_acc_stderr": 0.1,
        "lm_eval/kd_heldout_prose/teacher_word_perplexity": 80.0,
        "lm_eval/gsm8k/teacher_exact_match_strict-match": 0.25,
        "lm_eval/gsm8k/teacher_exact_match_strict-match_stderr": 0.05,
    }


def test_the_table_puts_each_model_beside_the_teacher() -> None:
    rows = [
        {"model": "smollm2", "teacher": True, "scores": {"t": {"acc": 0.8, "acc_stderr": 0.05}}},
        {"model": "runs/kd/student", "teacher": False, "scores": {"t": {"acc": 0.6}}},
    ]
    assert markdown(rows).splitlines()[2:] == [
        "| t | acc | smollm2 (teacher) | 0.8000 | 0.0500 | 1.000 |",
        "| t | acc | runs/kd/student | 0.6000 | — | 0.750 |",
    ]
    assert "÷ teacher" not in markdown(rows[1:])


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def ngrams(tokens: list[str], n: int = 6) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def test_the_shipped_tasks_share_no_six_words_with_the_training_corpus() -> None:
    corpus = set()
    for path in CORPUS.glob("*.jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                corpus |= ngrams(words(json.loads(line)["text"]))
    task = TASKS_DIR / "kd_heldout"
    prose = [json.loads(line)["text"] for line in (task / "prose.jsonl").open()]
    choice = [
        f"{row['question']} {row['choices'][row['answer']]}"
        for row in map(json.loads, (task / "choice.jsonl").open())
    ]
    assert len(prose) == 12 and len(choice) == 40
    shared = {gram for text in prose + choice for gram in ngrams(words(text)) & corpus}
    assert not shared


def test_the_shipped_rows_are_read_beside_their_yaml_from_any_directory(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("files", TASKS_DIR / "kd_heldout" / "files.py")
    files = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(files)
    data = files.beside({"test": "choice.jsonl"}, pretrained="ignored")
    assert data["test"].num_rows == 40
    assert set(data["test"].column_names) == {"question", "choices", "answer"}


def test_lm_eval_gets_a_model_directory_whole_and_only_the_tasks_index_it_needs(
    tmp_path: Path, monkeypatch
) -> None:
    """A relative directory shaped like a hub id (``runs/student``) reaches lm-eval absolute:
    lm-eval asks the hub about the ``pretrained`` it is given (its commit, for the record)."""
    import lm_eval

    (tmp_path / "runs" / "student").mkdir(parents=True)
    (tmp_path / "runs" / "student" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    calls = []

    def simple_evaluate(**arguments):
        calls.append(arguments)
        return {"results": {"kd_heldout_choice": {"acc,none": 0.5, "acc_stderr,none": 0.1}}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", simple_evaluate)
    harness = Harness(("kd_heldout_choice",), (), batch_size=4, device="cpu", limit=3)
    assert run_tasks("runs/student", harness) == {
        "kd_heldout_choice": {"acc": 0.5, "acc_stderr": 0.1}
    }
    (call,) = calls
    assert call["model_args"] == {
        "pretrained": str(tmp_path / "runs" / "student"),
        "dtype": "float32",
    }
    assert (call["batch_size"], call["limit"], call["device"]) == (4, 3, "cpu")
    tasks = call["task_manager"].all_tasks
    assert "kd_heldout_choice" in tasks and "hellaswag" not in tasks  # lm-eval's own: not read


def test_a_missing_include_directory_and_a_missing_lm_eval_are_named(
    tmp_path: Path, monkeypatch
) -> None:
    missing = tmp_path / "nope"
    assert task_errors(["kd_heldout"], [str(missing)], "--lm-eval", "--lm-eval-include") == [
        f"--lm-eval-include={missing}: no such directory (a directory of lm-eval task YAMLs)"
    ]
    assert task_errors(["kd_heldout"], [], "--lm-eval", "--lm-eval-include") == []
    monkeypatch.setattr(harness, "find_spec", lambda name: None)
    (error,) = task_errors(["kd_heldout"], [], "lm_eval.tasks", "lm_eval.include")
    assert error == (
        "lm_eval.tasks runs lm-eval, which is not installed: pip install 'lightning-kd[eval]'"
    )
    with pytest.raises(ModuleNotFoundError, match=r"lightning-kd\[eval\]"):
        harness.task_manager([], ["kd_heldout"])


def test_a_task_whose_data_cannot_be_loaded_is_named_before_any_model_loads(
    tmp_path: Path, monkeypatch
) -> None:
    """A hub task with no network was a ConnectionError traceback after the models had loaded
    (in a run: after training), lm-eval's retries first (probe 33)."""
    (tmp_path / "gone.yaml").write_text(
        "task: kd_gone\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'absent.jsonl'}\n"
        "output_type: loglikelihood_rolling\ntest_split: test\n"
        "doc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n"
    )
    (error,) = task_errors(["kd_heldout", "kd_gone"], [str(tmp_path)], "--lm-eval", "--inc")
    assert error.startswith("--lm-eval: lm-eval cannot load the data of task 'kd_gone' here (")
    assert "FileNotFoundError" in error and "--inc=DIR" in error

    def offline(manager, names):
        raise ConnectionError(
            "Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)"
        )

    monkeypatch.setattr("lm_eval.tasks.TaskManager.load", offline)
    (error,) = task_errors(["kd_heldout_choice"], [], "lm_eval.tasks", "lm_eval.include")
    assert (
        "task 'kd_heldout_choice' here (ConnectionError: Couldn't reach 'allenai/ai2_arc'" in error
    )
    assert "HF_DATASETS_OFFLINE=1" in error and "lm_eval.include=DIR" in error


def test_a_task_yaml_that_does_not_parse_is_named_with_its_line(tmp_path) -> None:
    """Its task was said unknown, with `lm_eval ls tasks` as the way on (probe 33)."""
    (tmp_path / "broken.yaml").write_text("task: broken\ndataset_path: json\n  bad: [indent\n")
    (tmp_path / "fine.yaml").write_text("task: fine\ncustom_dataset: !function files.beside\n")
    errors = task_errors(["broken"], [str(tmp_path)], "--lm-eval", "--lm-eval-include")
    assert errors[0].startswith("--lm-eval: lm-eval has no task 'broken'")
    assert errors[1:] == [
        f"--lm-eval-include: {tmp_path / 'broken.yaml'} line 3 does not parse as YAML, so "
        "lm-eval skips its task (mapping values are not allowed here)"
    ]
