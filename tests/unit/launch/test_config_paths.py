"""The relative paths a run's own config files name, pinned for its printed resume command."""

from __future__ import annotations

from lightning_kd.launch.config_paths import config_file_paths


def test_a_config_files_relative_paths_are_pinned_absolute_unless_an_override_sets_them(
    tmp_path, monkeypatch
) -> None:
    """docs/config.md's experiment (data: {files: [chats.jsonl]}): its printed resume, run from
    another directory, was refused, "data.files entry 'chats.jsonl' does not exist" (probe 52)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chats.jsonl").write_text("{}\n")
    (tmp_path / "prompts.jsonl").write_text("{}\n")
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        "data:\n  files: [chats.jsonl]\n  val_files: null\n"
        "teacher:\n  path: smollm2\n"  # a packaged name: no local path
        "cache:\n  dir: ${output_dir}/cache\n"  # an interpolation: as written
        "generate:\n  prompts: prompts.jsonl\n"
        "seed: 0\n"
    )
    assert config_file_paths(run, ["seed=1"]) == [
        f"data.files=[{tmp_path}/chats.jsonl]",
        f"generate.prompts={tmp_path}/prompts.jsonl",
    ]
    given = [f"data.files=[{tmp_path}/chats.jsonl]"]  # the override's own, anchored already
    assert config_file_paths(run, given) == [f"generate.prompts={tmp_path}/prompts.jsonl"]
    assert config_file_paths(tmp_path / "nowhere", []) == []
