"""The samples callback's settings and its summary table (its run: tests/test_chat.py)."""

from __future__ import annotations

import csv
import signal

import pytest
import torch

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.training.rundir import OUTPUTS
from lightning_kd.training.samples import (
    FIELDS,
    SAMPLES_NAME,
    CompletionSamples,
    StopRequested,
    drop_rows_after,
    samples_markdown,
)
from lightning_kd.utils.refusal import Refused
from lightning_kd.utils.stopping import STOP
from tests.conftest import make_datamodule, make_module, make_trainer


@pytest.mark.parametrize("setting", ["every", "prompts", "max_new_tokens", "text_prompt"])
def test_a_count_below_one_is_refused_by_name(setting) -> None:
    with pytest.raises(ValueError, match=r"callbacks.samples: every, prompts, max_new_tokens"):
        CompletionSamples(**{setting: 0})


def test_the_summary_shows_the_last_steps_rows_escaped(tmp_path) -> None:
    assert samples_markdown(tmp_path) == ""  # no callback, no table
    with open(tmp_path / SAMPLES_NAME, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        writer.writerow([2, "old", "a", "b"])
        writer.writerow([4, "Q|x\nnext", "mine", "theirs"])
    table = samples_markdown(tmp_path)
    assert "Completions at step 4" in table and "old" not in table
    assert "| Q\\|x ⏎ next | mine | theirs |" in table


def test_bad_settings_are_refused_with_the_config() -> None:
    """They were Hydra's raw instantiate error (exit 1), naming all four keys, after the run's
    directory was claimed."""
    cfg = compose_config(["debug=smoke", "+callbacks=samples"], output_dir="/tmp/unused")
    assert config_errors(cfg) == []
    cfg.callbacks.samples.every = 0
    cfg.callbacks.samples.max_new_tokens = -3
    errors = config_errors(cfg)
    assert any(e.startswith("callbacks.samples.every=0: must be an integer >= 1") for e in errors)
    assert any(e.startswith("callbacks.samples.max_new_tokens=-3") for e in errors)


def test_completions_beyond_the_positions_are_refused_before_the_first_step(
    tiny_teacher, corpus
) -> None:
    """100 000 new tokens past 128 positions generated for minutes once training had ended."""
    trainer = make_trainer(max_steps=1, callbacks=[CompletionSamples(max_new_tokens=100_000)])
    with pytest.raises(Refused, match=r"callbacks.samples.max_new_tokens=100000 .* the student"):
        trainer.fit(make_module(tiny_teacher), make_datamodule([corpus]))


def test_a_resume_drops_the_rows_after_its_checkpoint(tmp_path) -> None:
    """They were written again after the rows the stopped run had left (step 30 twice)."""
    path = tmp_path / SAMPLES_NAME
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        writer.writerows([[step, "p", "s", "t"] for step in (10, 20, 30)])
    drop_rows_after(path, 20)
    with open(path, newline="") as handle:
        assert [row["step"] for row in csv.DictReader(handle)] == ["10", "20"]
    drop_rows_after(tmp_path / "absent.csv", 0)  # nothing to drop


def test_a_stop_request_ends_a_generation_at_the_next_token() -> None:
    """SIGTERM during the completions went unheard for minutes."""
    stop = StopRequested()
    assert not stop(torch.zeros(1, 1), torch.zeros(1, 1))
    STOP.signum = signal.SIGTERM
    try:
        assert stop(torch.zeros(1, 1), torch.zeros(1, 1))
    finally:
        STOP.signum = None


def test_overwrite_removes_the_samples_of_the_run_it_replaces() -> None:
    """They were kept, and the new run appended to the old run's rows."""
    assert SAMPLES_NAME in OUTPUTS


def test_a_cached_teachers_column_says_it_was_not_run(tiny_teacher, corpus, tmp_path, capsys):
    """Its cells were empty, as if the teacher had answered nothing, without a word (probe 55):
    a run reading its teacher's cache has no teacher to run."""
    from types import SimpleNamespace

    from lightning_kd.models.loading import load_teacher
    from lightning_kd.training.samples import CACHED_NOTE, NOT_RUN

    data = make_datamodule([corpus])
    data.setup("fit")
    student = load_teacher(tiny_teacher, "32-true")
    distiller = SimpleNamespace(student=student, teacher=None, cross=None)
    module = SimpleNamespace(distiller=distiller, tokenizer=data.tokenizer)
    trainer = SimpleNamespace(
        is_global_zero=True, global_step=0, default_root_dir=str(tmp_path), datamodule=data
    )
    samples = CompletionSamples(prompts=2, max_new_tokens=3)
    samples.on_train_start(trainer, module)
    assert CACHED_NOTE in capsys.readouterr().out
    samples.write(trainer, module, 4)
    with open(tmp_path / SAMPLES_NAME, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and all(row["teacher"] == NOT_RUN for row in rows)
    assert NOT_RUN in samples_markdown(tmp_path)
