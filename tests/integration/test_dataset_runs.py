"""``data.dataset`` and ``data.streaming`` through the real command line: the embedded corpus read
as parquet trains the ``.jsonl`` run's losses, a streamed run killed mid-way resumes on the
uninterrupted run's losses, two DDP ranks stream disjoint shards, bad input exits 2 first."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from lightning_kd.data.reading import DEFAULT_FILES, read_documents
from lightning_kd.utils.refusal import REFUSED_EXIT
from tests.integration.test_cli import run_cli
from tests.integration.test_resume import train_losses
from tests.unit.data.test_chat import CHATML, conversations, write_rows
from tests.unit.data.test_datasets import write_parquet

QUIET = ["~callbacks.progress", "+trainer.enable_progress_bar=false", "~callbacks.lr_monitor"]
"""Per-step progress output costs more than a tiny model's step; the losses do not change."""


def run(env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    """``python run.py`` with ``datasets`` offline and its caches in the test's directory."""
    return run_cli(*overrides, env={**env, "OMP_NUM_THREADS": "1"})


def test_bad_dataset_input_exits_2_before_anything_loads(tmp_path, datasets_home) -> None:
    parquet = write_parquet(tmp_path / "d.parquet", [{"body": "text " * 50}])
    run_dir = tmp_path / "run"
    result = run(
        datasets_home,
        "debug=smoke",
        "data.dataset.path=parquet",
        f"data.dataset.data_files={parquet}",
        "data.dataset.val_split=test",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == REFUSED_EXIT, result.stderr[-3000:]
    assert "lightning-kd: 2 values are refused" in result.stderr
    assert "split 'train' has no column 'text'; its columns: ['body']" in result.stderr
    assert "has no split 'test'; its splits: ['train']" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "logs").exists()


@pytest.mark.slow
def test_the_embedded_corpus_as_parquet_trains_the_jsonl_runs_losses(tmp_path, datasets_home):
    """The default run's data (debug=smoke, fp32) from the embedded .jsonl.gz files and from the
    same rows as a parquet file read through datasets: the same loss at every step."""
    rows = [{"text": text} for path in DEFAULT_FILES for text in read_documents(path)]
    parquet = write_parquet(tmp_path / "corpus.parquet", rows)
    common = ["debug=smoke", *QUIET]
    files = run(datasets_home, *common, f"hydra.run.dir={tmp_path / 'files'}")
    dataset = run(
        datasets_home,
        *common,
        "data.dataset.path=parquet",
        f"data.dataset.data_files={parquet}",
        "data.max_train_examples=180",  # the default run's subset (set for the embedded files)
        f"hydra.run.dir={tmp_path / 'dataset'}",
    )
    assert files.returncode == dataset.returncode == 0, dataset.stderr[-3000:]
    expected = train_losses(tmp_path / "files")
    assert sorted(expected) == list(range(6))
    assert train_losses(tmp_path / "dataset") == expected


@pytest.mark.slow
def test_a_chat_dataset_trains_the_chat_files_losses(tmp_path, datasets_home) -> None:
    rows = conversations(40)
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    common = ["debug=smoke", "data=chat", f"data.chat_template={template}", *QUIET]
    common.append("data.block_size=160")
    jsonl = write_rows(tmp_path / "c.jsonl", rows)
    files = run(datasets_home, *common, f"data.files=[{jsonl}]", f"hydra.run.dir={tmp_path / 'f'}")
    parquet = write_parquet(tmp_path / "c.parquet", rows)
    source = ["data.dataset.path=parquet", f"data.dataset.data_files={parquet}"]
    dataset = run(datasets_home, *common, *source, f"hydra.run.dir={tmp_path / 'd'}")
    assert files.returncode == dataset.returncode == 0, dataset.stderr[-3000:]
    assert train_losses(tmp_path / "d") == train_losses(tmp_path / "f")


def streamed(tmp_path: Path, steps: int) -> list[str]:
    """A smoke run of ``steps`` steps streaming a small corpus (several passes over it)."""
    rows = [{"text": text[:300]} for text in list(read_documents(DEFAULT_FILES[0]))[:12]]
    parquet = write_parquet(tmp_path / "small.parquet", rows)
    return [
        "debug=smoke",
        *QUIET,
        "data.streaming=true",
        "data.dataset.path=parquet",
        f"data.dataset.data_files={parquet}",
        "data.block_size=16",
        "data.batch_size=2",
        "data.val_size=8",
        "data.shuffle_buffer=16",
        "distill.features=null",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "validate_before=false",
        "checkpoint.every=40",
    ]


@pytest.fixture(scope="module")
def stream_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A directory for the streamed runs of this module, and their environment (datasets
    offline, its caches there)."""
    root = tmp_path_factory.mktemp("streamed")
    env = {"HF_DATASETS_CACHE": str(root / "hf_datasets"), "LIGHTNING_KD_CACHE": str(root / "kd")}
    return root, env | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def uninterrupted_stream(stream_home) -> Path:
    root, env = stream_home
    result = run(env, *streamed(root, 200), f"hydra.run.dir={root / 'whole'}")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "whole"


STOPS = {
    # kill -9 as step 120 of 200 begins: its checkpoint (checkpoint.every=40) is the last written
    "kill": ("+callbacks.stop={_target_: tests.helpers.KillAtStep, step: 120}", -signal.SIGKILL),
    # SIGTERM as micro-batch 125 begins: the run stops after that step, saving a checkpoint
    "sigterm": (
        "+callbacks.stop={_target_: tests.helpers.SignalAtStep, batch: 125, signal: SIGTERM}",
        128 + signal.SIGTERM,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_a_stopped_streamed_run_resumes_on_the_uninterrupted_losses(
    tmp_path, stream_home, uninterrupted_stream, stop
) -> None:
    """Stopped mid-run and resumed with ckpt_path=last: the steps after the checkpoint train on
    the batches, and with the losses, of the run that was never stopped (steps 121-200 after
    kill -9 at step 120; several passes over the 12 rows, 16-example shuffle windows)."""
    root, env = stream_home
    common = streamed(root, 200)
    callback, code = stop
    stopped = run(env, *common, callback, f"hydra.run.dir={tmp_path / 'run'}")
    assert stopped.returncode == code, stopped.stderr[-3000:]
    resumed = run(env, *common, "ckpt_path=last", f"hydra.run.dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = train_losses(uninterrupted_stream), train_losses(tmp_path / "run")
    assert sorted(got) == sorted(expected) == list(range(200))
    assert all(abs(got[step] - expected[step]) < 1e-6 for step in range(200))


@pytest.mark.slow
def test_two_ranks_stream_disjoint_shards(tmp_path, datasets_home) -> None:
    """strategy=ddp trainer.devices=2: each rank trains on rows of its own share alone (the
    rows of one file each, a shard a rank), and neither on the validation rows."""
    letters = "ABCDEFGHIJ"
    shards = [
        write_parquet(
            tmp_path / f"{i}.parquet", [{"text": c * 40} for c in letters[5 * i : 5 * i + 5]]
        )
        for i in (0, 1)
    ]
    common = [c for c in streamed(tmp_path, 12) if not c.startswith("data.dataset.data_files")]
    record = tmp_path / "batches"
    result = run(
        datasets_home,
        *common,
        f"data.dataset.data_files=[{shards[0]},{shards[1]}]",
        "data.val_size=2",
        "strategy=ddp",
        "trainer.devices=2",
        f"+callbacks.record={{_target_: tests.helpers.RecordBatches, directory: {record}}}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from lightning_kd.models.loading import byte_tokenizer

    tokenizer = byte_tokenizer()
    seen = []
    for rank in (0, 1):
        batches = [
            json.loads(line) for line in (record / f"rank{rank}.jsonl").read_text().splitlines()
        ]
        assert len(batches) == 12
        tokens = [t for batch in batches for row in batch for t in row if t < 256]
        seen.append(set(tokenizer.decode(tokens)))
    assert seen[0] | seen[1] == set(letters) - {"A"}  # validation: 2 blocks of row "A" (41)
    assert not seen[0] & seen[1]
    assert {frozenset(s) for s in seen} == {frozenset("BCDE"), frozenset("FGHIJ")}
