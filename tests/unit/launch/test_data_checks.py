"""``data.dataset`` and ``data.streaming`` checked from the composed config before anything loads:
what cannot go together, and a dataset opened (streamed, nothing prepared) for its splits and
columns."""

from __future__ import annotations

import pytest

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.data_checks import dataset_errors
from tests.unit.data.test_datasets import write_parquet

STREAM = ["data.streaming=true", "data.dataset.path=parquet", "data.dataset.data_files=d.parquet"]


def test_the_dataset_keys_compose_and_the_default_runs_subset_stays_with_its_corpus() -> None:
    files = ["data.dataset.path=json", "data.dataset.data_files=[a.jsonl,b.jsonl]"]
    cfg = compose_config([*files, "data.dataset.val_split=validation"])
    assert cfg.data.dataset.data_files == ["a.jsonl", "b.jsonl"]
    assert cfg.data.max_train_examples is None  # 180 is the embedded corpus's alone
    mapping = compose_config(["data.dataset.path=parquet", "data.dataset.data_files={a: x}"])
    assert mapping.data.dataset.data_files == {"a": "x"}
    assert config_errors(compose_config(["data=chat", *STREAM, "trainer.max_steps=5"])) == [
        "distill.blockwise_passes=5 with data.streaming=true: the block-wise repair passes over "
        "a fixed set of training blocks, which a stream never holds; set "
        "distill.blockwise_passes=0"
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data.dataset.path=parquet", "data.files=[a.txt]"],
            "data.dataset.path='parquet' and data.files=['a.txt'] both name the data: drop one "
            "(data.files=null to read the dataset, or data.dataset.path=null to read the files)",
        ),
        (
            ["data.streaming=true"],
            "data.streaming=true reads a dataset row by row: set data.dataset.path",
        ),
        (
            [*STREAM, "distill.teacher_cache=/caches/x"],
            "distill.teacher_cache='/caches/x' with data.streaming=true: a cache holds",
        ),
        ([*STREAM, "trainer.max_steps=-1"], "trainer.max_steps=-1 with data.streaming=true"),
        ([*STREAM, "data.num_workers=2"], "data.num_workers=2 with data.streaming=true"),
        (
            [*STREAM, "data.max_train_examples=50"],
            "data.max_train_examples=50 with data.streaming=true: a stream has no fixed",
        ),
        (
            ["data.dataset.path=x", "data.dataset.val_split=train"],
            "data.dataset.val_split='train' is the split trained on",
        ),
        (["+data.dataset.revision=main"], "data.dataset: unknown key(s) ['revision']"),
        (["data.val_size=0"], "data.val_size=0: must be an integer >= 1"),
        (  # datasets ignores it: a typo'd or misplaced config name went unnoticed
            ["data.dataset.path=json", "data.dataset.data_files=a.jsonl", "data.dataset.name=foo"],
            "data.dataset.name='foo' with the json builder, which reads data.dataset.data_files",
        ),
    ],
    ids=[
        "dataset_and_files",
        "stream_without_dataset",
        "stream_cache",
        "stream_forever",
        "stream_workers",
        "stream_subset",
        "val_split_is_split",
        "unknown_key",
        "val_size",
        "name_of_a_file_builder",
    ],
)
def test_settings_that_cannot_go_together_are_refused(overrides, message) -> None:
    cfg = compose_config(["distill.blockwise_passes=0", *overrides])
    assert any(message in error for error in config_errors(cfg)), config_errors(cfg)


def test_a_dataset_is_opened_for_its_splits_and_columns_before_anything_loads(
    tmp_path, datasets_home
) -> None:
    parquet = write_parquet(tmp_path / "d.parquet", [{"body": "text " * 50}])
    source = ["data.dataset.path=parquet", f"data.dataset.data_files={parquet}"]
    errors = dataset_errors(compose_config([*source, "data.dataset.val_split=test"]))
    assert len(errors) == 2
    column = "split 'train' has no column 'text'; its columns: ['body']; set data.text_field"
    assert errors[0].endswith(column)
    assert "data.dataset.val_split='test'" in errors[1] and "its splits: ['train']" in errors[1]
    chat = dataset_errors(compose_config(["data=chat", *source, "data.messages_field=turns"]))
    assert chat[0].endswith(
        "has neither column 'turns' nor 'prompt' and 'completion' nor 'instruction' and "
        "'output' nor 'conversations'; its columns: ['body']; set "
        "data.messages_field (or data.prompt_field and data.completion_field) to the columns "
        "holding the conversation"
    )
    assert dataset_errors(compose_config([*source, "data.text_field=body"])) == []


def test_on_policy_kd_without_chat_prompts_is_refused_with_the_config() -> None:
    """Text rows and packed chat blocks have no prompt to complete: the run failed at its first
    sampled micro-batch, and again at the same step on every resume it advised."""
    (error,) = config_errors(compose_config(["debug=smoke", "distill.on_policy=0.2"]))
    assert error.startswith("distill.on_policy=0.2 with text data (data._target_=")
    assert "use chat data (data=chat, data.pack=false), or set distill.on_policy=0" in error
    packed = ["experiment=instruct_onpolicy", "debug=smoke", "data.pack=true"]
    (error,) = config_errors(compose_config(packed))
    assert "distill.on_policy=0.5 with data.pack=true" in error and "set data.pack=false" in error
    assert config_errors(compose_config(packed[:2])) == []


def test_every_missing_entry_is_named_with_where_it_was_read_from(tmp_path, monkeypatch) -> None:
    """Only the first missing entry was named, the next on the next try, and a relative one
    named no directory: from another directory than the user thought, no place (probe 58)."""
    from lightning_kd.launch.config import compose_config
    from lightning_kd.launch.data_checks import data_file_errors

    monkeypatch.chdir(tmp_path)
    cfg = compose_config(["debug=smoke", "data.files=[notes.txt,corpus/*.jsonl]"])
    assert data_file_errors(cfg) == [
        f"data.files entry 'notes.txt' does not exist (read from {tmp_path})",
        f"data.files pattern 'corpus/*.jsonl' matches no file (read from {tmp_path})",
    ]
