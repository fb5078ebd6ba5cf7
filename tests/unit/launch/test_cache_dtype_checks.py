"""An explicit teacher dtype against the dtype a named cache was written in (probe 32)."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_kd.cache.format import FORMAT_VERSION, INDEX_NAME
from lightning_kd.launch.cache_dtype_checks import cache_dtype_errors
from lightning_kd.launch.config import compose_config
from tests.integration.test_cli import run_in_process


def bf16_cache(directory: Path) -> Path:
    """A directory whose index says its teacher was loaded in bfloat16 (all the check reads)."""
    directory.mkdir()
    index = {"format": FORMAT_VERSION, "key": {"teacher_dtype": "bfloat16"}, "shards": []}
    (directory / INDEX_NAME).write_text(json.dumps(index))
    return directory


def test_an_explicit_dtype_unlike_the_caches_is_refused_with_both_fixes(tmp_path) -> None:
    """teacher.dtype=float32 over a bfloat16 cache trained from bfloat16 logits while the
    summary said "teacher float32"."""
    cache = bf16_cache(tmp_path / "cache")
    given = ["debug=smoke", f"distill.teacher_cache={cache}"]
    (error,) = cache_dtype_errors(compose_config([*given, "teacher.dtype=float32"]))
    assert error.startswith(f"teacher.dtype=float32, but the teacher cache {cache} was written")
    assert "set teacher.dtype=bfloat16 (or auto)" in error and "teacher.dtype=float32)" in error
    for alike in ("teacher.dtype=bfloat16", "teacher.dtype=auto"):
        assert cache_dtype_errors(compose_config([*given, alike])) == []
    online = ["debug=smoke", "teacher.dtype=float32", "distill.teacher_cache=null"]
    assert cache_dtype_errors(compose_config(online)) == []


def test_a_teachers_entry_is_held_to_its_own_cache(tmp_path) -> None:
    cache = bf16_cache(tmp_path / "entry")
    entry = f"{{name: other, weight: 0.5, config: {{model_type: llama}}, cache: '{cache}'"
    teachers = f"teachers=[{{name: tiny, weight: 0.5}}, {entry}, dtype: float32}}]"
    (error,) = cache_dtype_errors(compose_config(["debug=smoke", teachers]))
    assert error.startswith(f"teachers.1.dtype=float32, but the teacher cache {cache}")


def test_a_run_is_refused_before_anything_loads(tmp_path, capsys) -> None:
    cache = bf16_cache(tmp_path / "cache")
    argv = ["train", "debug=smoke", "teacher.dtype=float32", f"distill.teacher_cache={cache}"]
    code, output = run_in_process([*argv, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and "teacher.dtype=float32, but the teacher cache" in output
    assert "Traceback" not in output


def test_an_auto_dtype_over_a_cache_is_said_as_the_caches(tmp_path) -> None:
    """teacher.dtype=auto trains from the teacher its cache was written by: the precision line
    and the summary named the dtype auto picks for this machine instead (probe 32)."""
    from lightning_kd.launch.build import with_precision

    cache = bf16_cache(tmp_path / "cache")
    given = ["debug=smoke", "trainer.precision=32-true", "teacher.dtype=auto"]
    cfg = compose_config([*given, f"distill.teacher_cache={cache}"])
    trained, choice = with_precision(cfg, announce=False, training=True)
    assert choice.teacher_dtype == trained.teacher.dtype == "bfloat16"
    assert choice.line().endswith(f"teacher.dtype as the teacher cache {cache} was written)")
    assert with_precision(cfg, announce=False)[1].teacher_dtype == "float32", "cache: its own"
    online = compose_config([*given, "distill.teacher_cache=null"])
    assert with_precision(online, announce=False, training=True)[1].teacher_dtype == "float32"


def test_an_auto_entry_over_a_cache_of_another_dtype_is_in_the_precision_row(tmp_path) -> None:
    from lightning_kd.distill.teacher_entries import teacher_entries
    from lightning_kd.launch.teacher_list import held_precisions
    from lightning_kd.models.loading import TeacherSpec
    from tests.conftest import TINY_LLAMA

    cache = bf16_cache(tmp_path / "entry")
    cfg = compose_config(["debug=smoke", "teacher.dtype=float32"])
    other = {**TINY_LLAMA, "num_hidden_layers": 3}
    listed = [
        {"name": "main", "weight": 0.5},
        {"name": "b", "weight": 0.5, "config": other, "cache": str(cache)},
    ]
    entries = teacher_entries(listed, TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    assert held_precisions(cfg, entries) == {"dtype[b]": "bfloat16"}
