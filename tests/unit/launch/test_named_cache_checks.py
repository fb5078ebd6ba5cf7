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
    assert f"{missing} holds no complete teacher cache (no index.json)" in error
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = compose_config(["debug=smoke", f"distill.teacher_cache={run}"], output_dir="/x")
    assert any("is a training run's directory" in error for error in train_errors(cfg))


def test_an_entrys_missing_cache_is_refused_with_the_command_that_writes_it(tmp_path) -> None:
    missing = tmp_path / "gemma"
    overrides = ["experiment=two_teachers", f"teachers.1.cache={missing}"]
    # The check alone: train_errors would load both tokenizers (Gemma's 262k) for its others.
    (error,) = named_cache_errors(compose_config(overrides, output_dir="/x"))
    assert error.startswith(f"teachers.1.cache={missing} (entry 'gemma3_270m'): {missing} holds")
    # Logits only, the run's student tokenizer by its name: the command runs as printed.
    assert "`lightning-kd cache teacher.path=gemma3_270m teacher.config=null" in error
    written = f"distill.blockwise_passes=0 student.source=smollm2 hydra.run.dir={missing}`"
    assert "distill.features=null " + written in error and "<" not in error
    assert "this run's teacher=" not in error  # the reader's advice writes the main teacher's
