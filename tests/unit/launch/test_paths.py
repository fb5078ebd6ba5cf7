"""Where a command writes is checked before anything loads: a file, a '~', a training run."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_kd.launch import paths
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.paths import (
    cache_dir_errors,
    cache_root_errors,
    out_dir_errors,
    out_file_errors,
    run_dir_errors,
    training_run_errors,
)


def test_a_run_directory_that_is_a_file_or_under_one_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("hi")
    (error,) = run_dir_errors(str(afile))
    assert f"hydra.run.dir={afile} is a file; give a directory" in error
    (error,) = run_dir_errors(str(afile / "sub"))
    assert f"is under the file {afile}" in error
    assert run_dir_errors(str(tmp_path / "new" / "run")) == []  # missing: Hydra creates it


def test_a_run_directory_with_a_tilde_is_refused_with_an_expanded_example() -> None:
    (error,) = run_dir_errors("~/advtilde_x")
    assert "Hydra does not expand '~'" in error
    assert f"hydra.run.dir={Path.home()}/advtilde_x" in error
    # What Hydra's runtime.output_dir makes of it (relative to the cwd) is refused the same way.
    assert run_dir_errors("/tmp/cwd/~/advtilde_x")


def test_an_output_file_that_is_a_directory_is_refused_a_missing_parent_is_not(
    tmp_path: Path,
) -> None:
    (error,) = out_file_errors("--out", tmp_path)
    assert f"--out {tmp_path} is a directory; give a file path" in error
    assert out_file_errors("--out", tmp_path / "nodir" / "sub" / "out.json") == []
    (tmp_path / "afile").write_text("")
    (error,) = out_file_errors("--out", tmp_path / "afile" / "out.json")
    assert "is under the file" in error
    assert out_file_errors("--out", None) == []


def test_an_output_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "bench.json"
    afile.write_text("{}")
    (error,) = out_dir_errors("--out", afile)
    assert f"--out {afile} is a file; give a directory" in error
    assert out_dir_errors("--out", tmp_path / "new") == []


def test_a_training_runs_directory_is_refused_for_cache_and_generate(tmp_path: Path) -> None:
    run = tmp_path / "base"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / "summary.json").write_text("{}")
    (error,) = training_run_errors(run, "cache")
    assert (
        f"hydra.run.dir={run} holds a training run's outputs (checkpoints, summary.json)" in error
    )
    assert f"hydra.run.dir={run}-cache" in error
    # A cache's or generate's own files are not a training run's: writing there again resumes.
    own = tmp_path / "cache"
    (own / "shards").mkdir(parents=True)
    (own / "meta.json").write_text("{}")
    (own / "completions.jsonl").write_text("")
    assert training_run_errors(own, "cache") == []


def test_an_output_where_nothing_can_be_written_is_refused_before_the_work(
    tmp_path: Path, monkeypatch
) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    real = paths.os.access
    monkeypatch.setattr(paths.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    unwritable = f"{locked} is not writable (read-only, or no permission)"
    (error,) = out_file_errors("--out", locked / "sub" / "x.json")  # the nearest that exists
    assert error.startswith(f"--out {locked / 'sub' / 'x.json'}: {unwritable}")
    (error,) = run_dir_errors(locked / "run")
    assert error.startswith(f"hydra.run.dir={locked / 'run'}: {unwritable}")
    assert out_file_errors("--out", tmp_path / "x.json") == []


def test_a_cache_directory_that_cannot_be_written_is_refused_with_the_variable(
    tmp_path: Path, monkeypatch
) -> None:
    """A read-only ``$HOME`` (or ``$LIGHTNING_KD_CACHE``) failed in the first file digest's
    write, with a traceback, after the run had started."""
    locked = tmp_path / "ro"
    locked.mkdir()
    real = paths.os.access
    monkeypatch.setattr(paths.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(locked / "kd"))
    (error,) = cache_root_errors()
    assert error.startswith(f"$LIGHTNING_KD_CACHE ({locked / 'kd'}) cannot be written")
    assert "set LIGHTNING_KD_CACHE to a directory you can write" in error
    assert f"LIGHTNING_KD_SHARED_CACHE={locked / 'kd'}" in error
    assert any(e.startswith("$LIGHTNING_KD_CACHE") for e in config_errors(compose_config([])))
    (locked / "file").write_text("")
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(locked / "file" / "kd"))
    assert cache_root_errors() == [
        f"$LIGHTNING_KD_CACHE ({locked / 'file' / 'kd'}) is under the file {locked / 'file'}; "
        "set LIGHTNING_KD_CACHE to a directory"
    ]
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "fine"))
    assert cache_root_errors() == []


def test_a_cache_dir_that_cannot_hold_a_cache_is_refused_with_the_config(
    tmp_path: Path, monkeypatch
) -> None:
    """``cache.dir`` a file, under one, or read-only was a ``FileExistsError`` traceback once
    the data was tokenized and the teacher loaded, as ``auto`` made its directory (probe 37)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    (error,) = config_errors(compose_config(["debug=smoke", f"cache.dir={afile}"]))
    assert error == f"cache.dir={afile} is a file; give a directory (or null: the package's cache)"
    (error,) = cache_dir_errors(str(afile / "sub"))
    assert error.startswith(f"cache.dir={afile / 'sub'} is under the file {afile}; ")
    locked = tmp_path / "ro"
    locked.mkdir()
    real = paths.os.access
    monkeypatch.setattr(paths.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    (error,) = cache_dir_errors(str(locked / "caches"))
    assert error.startswith(f"cache.dir={locked / 'caches'}: {locked} is not writable")
    assert cache_dir_errors(str(tmp_path / "caches")) == [] and cache_dir_errors(None) == []


def test_a_run_directory_whose_checkpoints_cannot_be_written_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    """Found at the first checkpoint, after the steps since the last one (a raw double
    traceback); a file named ``logs`` was a ``FileExistsError`` once the models had loaded,
    one named ``checkpoints`` "has no checkpoint yet" (probe 23)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "logs").write_text("hi\n")
    real = paths.os.access
    locked = run / "checkpoints"
    monkeypatch.setattr(paths.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    errors = config_errors({"output_dir": str(run)})
    assert errors == [
        f"hydra.run.dir={run}: {locked} is not writable (read-only, or no permission), and the "
        "run writes its checkpoints there; make it writable, or give another hydra.run.dir",
        f"hydra.run.dir={run}: {run / 'logs'} is a file where the run writes its logs/ "
        "directory; move it away",
    ]
    monkeypatch.setattr(paths.os, "access", real)
    (run / "logs").unlink()
    assert config_errors({"output_dir": str(run)}) == []


def test_a_run_directory_the_current_directory_cannot_take_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    """``lightning-kd train`` in a directory that cannot hold ``outputs/`` (read-only, another
    owner's; /proc and /sys even for root, which ``os.access`` lets write anywhere) was Hydra's
    traceback, exit 1: it makes the run directory before any task checks anything."""
    assert not paths.writable(Path("/proc")) and paths.writable(tmp_path)
    monkeypatch.chdir("/proc")
    (error,) = paths.default_run_dir_errors(["debug=smoke"])
    assert error.startswith("the run directory, outputs/<date>/<time> in the current directory")
    assert "run from a directory you can write to, or give one with hydra.run.dir=DIR" in error
    given_ways = (["hydra.run.dir=/tmp/x"], ["++hydra.run.dir=/tmp/x"], ["-m", "seed=0,1"])
    for given in (*given_ways, ["--cfg", "job"]):
        assert paths.default_run_dir_errors(given) == [], given  # none made here
    # Configs of one's own may name it (hydra: {run: {dir: ...}}): it was refused as unnamed.
    assert paths.default_run_dir_errors(["experiment=mine"], own_configs=True) == []
    (named,) = run_dir_errors("/proc/kd_run")
    assert named.startswith("hydra.run.dir=/proc/kd_run: /proc is not writable")
    monkeypatch.chdir(tmp_path)
    assert paths.default_run_dir_errors(["debug=smoke"]) == []


def test_a_run_directory_name_longer_than_a_file_system_takes_is_refused() -> None:
    """os.stat's ENAMETOOLONG was a raw traceback from the package's own check (probe 48)."""
    from lightning_kd.launch.paths import run_dir_errors

    (error,) = run_dir_errors(f"/tmp/{'x' * 300}/run")
    assert error.startswith("hydra.run.dir: its name xxxxxxxxxxxxxxxxxxxxxxxx... is 300 bytes")
    assert run_dir_errors(f"/tmp/{'x' * 200}/{'y' * 200}") == []  # each name short enough


def test_the_package_cache_expands_a_home_in_its_variable(monkeypatch) -> None:
    """LIGHTNING_KD_CACHE='~/kdcache', quoted in a job script, made a directory named '~'
    (probe 48)."""
    from pathlib import Path

    from lightning_kd.models.sources import cache_root

    monkeypatch.setenv("LIGHTNING_KD_CACHE", "~/kdcache")
    assert cache_root() == Path.home() / "kdcache"


def test_a_run_directory_through_a_broken_link_is_said_to_be_one(tmp_path) -> None:
    """A link to a disk not mounted was refused as "is a file" (probe 48)."""
    from lightning_kd.launch.paths import run_dir_errors

    (tmp_path / "runs").symlink_to(tmp_path / "unmounted" / "runs")
    (error,) = run_dir_errors(tmp_path / "runs" / "kd")
    assert error == (
        f"hydra.run.dir={tmp_path}/runs/kd: {tmp_path}/runs is a link to "
        f"{tmp_path}/unmounted/runs, which does not exist (a disk not mounted?); mount or create "
        "it, or give another directory"
    )


def test_an_unwritable_default_cache_is_not_named_as_a_variable_set(tmp_path, monkeypatch) -> None:
    """With LIGHTNING_KD_CACHE unset and a read-only home, the refusal named the variable as if
    the user had set it; both ways, it names the shared cache's way (probe 48)."""
    from lightning_kd.launch import paths

    monkeypatch.setattr(paths, "unwritable_errors", lambda named, root: ["read-only"])
    monkeypatch.delenv("LIGHTNING_KD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (unset,) = paths.cache_root_errors()
    assert unset.startswith(f"the package's cache {tmp_path}/lightning_kd cannot be written")
    assert f"LIGHTNING_KD_SHARED_CACHE={tmp_path}/lightning_kd" in unset
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "mine"))
    (named,) = paths.cache_root_errors()
    assert named.startswith(f"$LIGHTNING_KD_CACHE ({tmp_path}/mine) cannot be written")


def test_a_run_into_another_runs_outputs_or_another_commands_directory_is_refused(
    tmp_path: Path,
) -> None:
    """A run launched into another run's student/ was accepted; that run's next export removed
    it whole, checkpoints and all, without a word. A run into a teacher cache's or a
    generation's directory wrote its record (.hydra/) over theirs (probe 59)."""
    from lightning_kd.launch.paths import foreign_directory_errors

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "student").mkdir()
    (run / "student" / "config.json").write_text("{}")
    assert foreign_directory_errors(run / "student") == [
        f"hydra.run.dir={run / 'student'} is inside the student/ of the training run in {run}, "
        f"which replaces it whole when it exports or is overwritten: give this run a directory "
        f"of its own, e.g. hydra.run.dir={run}-2"
    ]
    (nested,) = foreign_directory_errors(run / "student" / "sub")  # one level down (verify 60)
    assert nested.startswith(f"hydra.run.dir={run / 'student' / 'sub'} is inside the student/")
    (run / "student" / "model.safetensors").write_bytes(b"")  # a saved model, no run around it
    (saved,) = foreign_directory_errors(run / "student")[:1]
    assert "is inside the student/" in saved
    assert foreign_directory_errors(run) == []  # its own directory: a resume
    assert foreign_directory_errors(tmp_path / "elsewhere" / "student") == []
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    (error,) = foreign_directory_errors(model)
    assert error.startswith(f"hydra.run.dir={model} holds a saved model (config.json and its")
    cache, generated = tmp_path / "cache", tmp_path / "gen"
    (cache / "shards").mkdir(parents=True)
    generated.mkdir()
    (generated / "completions.jsonl").write_text("")
    for directory, command in ((cache, "cache"), (generated, "generate")):
        (error,) = foreign_directory_errors(directory)
        said = f"hydra.run.dir={directory} holds the output of lightning-kd {command};"
        assert error.startswith(said)


def test_a_directory_where_a_lock_or_a_run_file_belongs_is_named(tmp_path: Path) -> None:
    """Each was an IsADirectoryError traceback: a lock at the start, summary.json after the
    run had trained and exported (probe 59)."""
    from lightning_kd.launch.paths import run_subdirectory_errors
    from lightning_kd.utils.locks import take_lock
    from lightning_kd.utils.refusal import Refused

    (tmp_path / ".lock").mkdir()
    with pytest.raises(Refused, match=r"\.lock is a directory where a lock file belongs: remove"):
        take_lock(tmp_path / ".lock")
    from lightning_kd.cli import main as cli

    # through the command: the refusal's clean-up took the lock again, a traceback (verify 60)
    with pytest.raises(SystemExit) as refused:
        cli(["train", "debug=smoke", f"hydra.run.dir={tmp_path}"])
    assert refused.value.code == 2
    (tmp_path / "summary.json").mkdir()
    (error,) = run_subdirectory_errors(tmp_path)
    said = "summary.json is a directory where the run writes its file of that name; move it"
    assert error.endswith(said + " away")


def test_a_student_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """The export renamed the link aside and wrote a directory in its place: the link's target,
    a shared models directory, kept the old student without a word (probe 59)."""
    from lightning_kd.launch.paths import run_subdirectory_errors

    (tmp_path / "shared").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "student").symlink_to(tmp_path / "shared")
    (error,) = run_subdirectory_errors(tmp_path / "run")
    assert f"student is a link (to {tmp_path / 'shared'}); the run replaces its student/" in error
