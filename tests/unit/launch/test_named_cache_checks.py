"""A cache directory a run names that holds no complete cache is refused before any model loads
(a teachers entry's was found after both teachers had loaded: 56 s; probe 38)."""

from __future__ import annotations

from pathlib import Path

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.named_cache_checks import named_cache_errors
from lightning_kd.launch.train_checks import train_errors


def test_a_named_cache_that_is_not_one_is_refused_before_anything_loads(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    cfg = compose_config(["debug=smoke", f"distill.teacher_cache={missing}"], output_dir="/x")
    (error,) = [e for e in train_errors(cfg) if e.startswith("distill.teacher_cache=")]
    assert f"{missing} does not exist: check the path, or write one with `lightning-kd" in error
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = compose_config(["debug=smoke", f"distill.teacher_cache={empty}"], output_dir="/x")
    (error,) = [e for e in train_errors(cfg) if e.startswith("distill.teacher_cache=")]
    assert f"{empty} holds no complete teacher cache (no index.json)" in error
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = compose_config(["debug=smoke", f"distill.teacher_cache={run}"], output_dir="/x")
    assert any("is a training run's directory" in error for error in train_errors(cfg))


def test_an_entrys_missing_cache_is_refused_with_the_command_that_writes_it(tmp_path) -> None:
    missing = tmp_path / "gemma"
    overrides = ["experiment=two_teachers", f"teachers.1.cache={missing}"]
    # The check alone: train_errors would load both tokenizers (Gemma's 262k) for its others.
    (error,) = named_cache_errors(compose_config(overrides, output_dir="/x"))
    assert error.startswith(f"teachers.1.cache={missing} (entry 'gemma3_270m'): {missing} does")
    # Logits only, the run's student tokenizer by its name: the command runs as printed.
    assert "`lightning-kd cache teacher.path=gemma3_270m teacher.config=null" in error
    written = f"distill.blockwise_passes=0 student.source=smollm2 hydra.run.dir={missing}`"
    assert "distill.features=null " + written in error and "<" not in error
    assert "this run's teacher=" not in error  # the reader's advice writes the main teacher's


def test_a_named_cache_that_is_a_file_or_a_relative_path_elsewhere_is_said_so(
    tmp_path: Path, monkeypatch
) -> None:
    """A file was said to hold "no complete teacher cache", with advice to write one there; a
    relative path, read from another directory than the user thought, named no directory
    (probes 58, 59)."""
    from lightning_kd.cache.reader import missing_directory_error

    text = tmp_path / "t.txt"
    text.write_text("notes")
    assert missing_directory_error(text) == f"{text} is a file, not a teacher cache directory"
    assert missing_directory_error(text / "sub") == (
        f"{text / 'sub'} is under {text}, a file, not a teacher cache directory"
    )
    monkeypatch.chdir(tmp_path)
    assert missing_directory_error(Path("caches/smok")).startswith(
        f"caches/smok does not exist (read from {tmp_path}): check the path, or write one with"
    )
    assert missing_directory_error(tmp_path) is None
