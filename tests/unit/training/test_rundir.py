"""Run directories: one run at a time, earlier outputs refused or resumed, logs appended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_kd.training import rundir
from lightning_kd.training.rundir import (
    LAUNCH,
    STARTED,
    RunDirError,
    claim_run_dir,
    is_own_checkpoint,
)


def test_hydra_own_files_do_not_make_a_directory_taken(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "run.log").write_text("")
    with claim_run_dir(tmp_path, resuming=False, overwrite=False):
        (tmp_path / "summary.json").write_text("{}")


def test_earlier_outputs_are_refused_unless_resuming_or_overwriting(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("mine")
    held = rf"{tmp_path} already holds .*\(checkpoints\).*resume that run \(ckpt_path=last\)"
    refused = pytest.raises(RunDirError, match=held)
    with refused, claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass
    with claim_run_dir(tmp_path, resuming=True, overwrite=False):
        assert (tmp_path / "checkpoints").is_dir()
    with claim_run_dir(tmp_path, resuming=False, overwrite=True):
        assert not (tmp_path / "checkpoints").exists()
        assert (tmp_path / "notes.txt").read_text() == "mine", "only a run's own outputs go"
    both = pytest.raises(RunDirError, match="give one of the two")
    with both, claim_run_dir(tmp_path, resuming=True, overwrite=True):
        pass


def test_a_run_refused_before_it_logged_leaves_nothing_that_refuses_the_next(tmp_path) -> None:
    (tmp_path / "logs" / "version_0").mkdir(parents=True)  # created, never written
    with claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")
    # Outputs, but no checkpoint: the advice does not send the user to a resume that fails.
    refused = pytest.raises(
        RunDirError, match="holds a run's outputs \\(logs\\); it saved no checkpoint"
    )
    with refused, claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass


def test_overwrite_removes_the_runs_outputs_and_keeps_what_it_did_not_write(tmp_path) -> None:
    """A cache written into the run directory (`lightning-kd cache hydra.run.dir=RUN/cache`),
    notes: no run's outputs, so a fresh run is not refused for them (it was, told they were a
    run's outputs, with overwrite=true as the fix, which keeps them: probe 30), and
    overwrite=true keeps them."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "index.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    with claim_run_dir(tmp_path, resuming=False, overwrite=False):
        (tmp_path / "summary.json").write_text("{}")
    refused = pytest.raises(RunDirError, match=r"outputs \(summary.json\)")
    with refused, claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass
    with claim_run_dir(tmp_path, resuming=False, overwrite=True):
        assert (tmp_path / "cache" / "index.json").is_file()
        assert (tmp_path / "notes.txt").read_text() == "mine"
        assert not (tmp_path / "summary.json").exists()


def test_a_second_process_is_refused_with_the_holder_pid(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path\n"
        "from lightning_kd.training.rundir import claim_run_dir\n"
        "with claim_run_dir(Path(sys.argv[1]), resuming=True, overwrite=False): pass"
    )
    with claim_run_dir(tmp_path, resuming=False, overwrite=False):
        other = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True
        )
        assert other.returncode != 0
        assert f"{tmp_path} is in use by another run (pid {os.getpid()})" in other.stderr
    # released at the end of the block (and by the kernel when a process dies)
    again = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True)
    assert again.returncode == 0, again.stderr


def test_only_rank_zero_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")  # written by this launch's rank 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    with claim_run_dir(tmp_path, resuming=False, overwrite=False):
        assert not (tmp_path / ".lock").exists()


def test_a_further_rank_refuses_an_earlier_runs_outputs_as_rank_zero_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only rank 0 refused them, and exited: under torchrun rank 1 waited in the process
    group's set-up until torchrun killed it (30 s later), on a second node with a C++
    DistNetworkError naming no cause. Outputs newer than the process are rank 0's own."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")
    os.utime(tmp_path / "logs", (0, 0))  # an earlier run's
    monkeypatch.setenv("LOCAL_RANK", "1")
    refused = pytest.raises(RunDirError, match=r"already holds a run's outputs \(logs\); it saved")
    with refused, claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass
    for resuming, overwrite in ((True, False), (False, True)):  # rank 0 decides these
        with claim_run_dir(tmp_path, resuming=resuming, overwrite=overwrite):
            pass


def test_what_the_launching_rank_wrote_before_starting_the_others_is_their_launchs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``student.layers=importance`` on 2 processes: rank 0 wrote importance.json, then
    Lightning started rank 1 by running the command again, and rank 1 refused it as an earlier
    run's outputs, every time (exit 137). Its parent's start, handed down, is the launch's."""
    (tmp_path / "importance.json").write_text("{}")
    os.utime(tmp_path / "importance.json", (STARTED - 60, STARTED - 60))  # before this process
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(LAUNCH, f"{os.getppid()}:{STARTED - 120!r}")  # started by a rank 0
    with claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass
    monkeypatch.setenv(LAUNCH, f"{os.getppid() + 1}:{STARTED - 120!r}")  # another's: not read
    with pytest.raises(RunDirError), claim_run_dir(tmp_path, resuming=False, overwrite=False):
        pass


def test_only_a_checkpoint_inside_the_run_directory_resumes_its_run(tmp_path: Path) -> None:
    run_dir, other = tmp_path / "run", tmp_path / "other"
    (run_dir / "checkpoints").mkdir(parents=True)
    (other / "checkpoints").mkdir(parents=True)
    own, foreign = run_dir / "checkpoints" / "last.ckpt", other / "checkpoints" / "last.ckpt"
    own.write_bytes(b"x")
    foreign.write_bytes(b"x")
    assert is_own_checkpoint(own, run_dir) and not is_own_checkpoint(foreign, run_dir)
    assert not is_own_checkpoint(None, run_dir)
    linked = run_dir / "checkpoints" / "linked.ckpt"
    linked.symlink_to(foreign)  # a link into another run is that run's checkpoint
    assert not is_own_checkpoint(linked, run_dir)


@pytest.mark.parametrize(
    ("environ", "zero"),
    [
        ({}, True),
        ({"LOCAL_RANK": "1", "NODE_RANK": "0"}, False),  # Lightning's launcher, a further rank
        ({"RANK": "0", "GROUP_RANK": "0", "LOCAL_RANK": "0"}, True),  # torchrun's first
        ({"RANK": "2", "GROUP_RANK": "1", "LOCAL_RANK": "0"}, False),  # node 1's first
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, True),  # srun's task 0
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, False),  # one of the others
        ({"SLURM_PROCID": "1", "RANK": "0", "GROUP_RANK": "0"}, True),  # torchrun under srun
        ({"NODE_RANK": "1"}, False),  # the first process of a further node
    ],
)
def test_rank_zero_is_found_under_every_launcher(environ, zero, monkeypatch) -> None:
    """Only rank 0 claims the run directory: under ``srun`` every task once thought it was."""
    for name in (*rundir.RANKS, *rundir.NODES):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert rundir.is_rank_zero() is zero


@pytest.mark.parametrize(
    ("environ", "prefix"),
    [
        ({}, ""),
        ({"LOCAL_RANK": "1"}, "[rank: 1] "),  # Lightning's DDP launcher, one node
        ({"LOCAL_RANK": "1", "NODE_RANK": "2"}, "[node: 2, local rank: 1] "),
        ({"RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "2"}, "[rank: 5] "),  # torchrun
        ({"SLURM_PROCID": "3"}, "[rank: 3] "),  # srun
    ],
)
def test_a_further_process_says_which_it_is(environ, prefix, monkeypatch) -> None:
    """Each process of a run meets a refusal of its input and prints it: the same line came
    twice with nothing to say why (probe 29)."""
    for name in (*rundir.RANKS, *rundir.NODES):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert rundir.rank_prefix() == prefix


def test_a_run_stopped_in_its_repair_is_told_to_resume_not_to_overwrite(tmp_path: Path) -> None:
    """Launched again without ckpt_path, it was told it "saved no checkpoint to resume from",
    and to pass overwrite=true, which removes the repair's kept progress (probe 59)."""
    from lightning_kd.training.rundir import outputs_error

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "repair.pt").write_bytes(b"kept")
    message = outputs_error(tmp_path, ["checkpoints"])
    assert "it stopped in its block-wise repair, whose progress repair.pt keeps: resume that " in (
        message
    )
    assert "(ckpt_path=last; overwrite=true would remove that progress)" in message
    assert "saved no checkpoint" not in message


def test_folders_of_the_users_own_are_not_called_a_runs_outputs(tmp_path: Path) -> None:
    """A directory with a logs/ and a student/ of the user's own notes was said to hold "a
    run's outputs", with overwrite=true advised, which deleted the notes (probe 59)."""
    from lightning_kd.training.rundir import outputs_error

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "notes.txt").write_text("mine")
    message = outputs_error(tmp_path, ["logs"])
    assert "already holds logs, which no lightning-kd run wrote (none of its files is" in message
    assert "resume" not in message and "start afresh" not in message
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")  # a run's
    assert "already holds a run's outputs (logs)" in outputs_error(tmp_path, ["logs"])


def test_a_checkpoint_through_a_linked_checkpoints_directory_is_the_runs_own(tmp_path) -> None:
    """checkpoints/ linked to another disk: ckpt_path=last resolved outside the run directory,
    was taken for another run's checkpoint, and refused with advice to resume the run with
    ckpt_path=last (verify 60)."""
    from lightning_kd.training.rundir import is_own_checkpoint

    (tmp_path / "disk").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(tmp_path / "disk")
    assert is_own_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", tmp_path / "run")
    assert is_own_checkpoint(tmp_path / "disk" / "last.ckpt", tmp_path / "run")  # the same file
    assert not is_own_checkpoint(tmp_path / "other" / "last.ckpt", tmp_path / "run")
