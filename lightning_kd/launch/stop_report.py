"""What a run stopped in training tells its user: why, what is kept, and the command that
resumes it from its latest checkpoint — or, with none, starts it again."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from lightning_kd.data.errors import DataError
from lightning_kd.launch.cluster_jobs import job_rerun
from lightning_kd.launch.config import config_options, task_overrides
from lightning_kd.launch.config_paths import config_file_paths
from lightning_kd.launch.nodes import launcher
from lightning_kd.launch.sweep_resume import sweep_note
from lightning_kd.training.checkpoints import LAST_NAME, REPAIR_NAME
from lightning_kd.training.finite import NonFiniteError
from lightning_kd.training.peers import PeerLost
from lightning_kd.training.rerun import restart_command, restart_extra, resume_command
from lightning_kd.utils.disk import full_disk_message
from lightning_kd.utils.stopping import Interrupted

APPLIED_ONCE = ("resume_reset_optimizer=", "resume_mismatch=")
"""Settings of a resume that its own checkpoints then hold: kept in a later resume command, the
optimizer was reset again at the stop's step (the student differed from an uninterrupted run)."""


def stop_report(
    error: BaseException,
    callback: object,
    output_dir: Path,
    command: Sequence[str],
    lr: float | None = None,
    rank: int = 0,
) -> str:
    """What a stopped run tells its user: why, what is kept, and the command that resumes it
    from its latest checkpoint — or, with none, starts it again without losing the teacher
    cache. A run that diverged at learning rate ``lr`` is given a tenth of it. Process
    ``rank`` tells it (process 0 but where another was lost, ``training/peers.py``). A job of
    a sweep run here names the jobs after it and the sweep's command (``sweep_resume.py``)."""
    report = run_report(error, callback, output_dir, command, lr, rank)
    return report + sweep_note(command)


def run_report(
    error: BaseException,
    callback: object,
    output_dir: Path,
    command: Sequence[str],
    lr: float | None,
    rank: int,
) -> str:
    """:func:`stop_report` of the run alone."""
    why, resume_with = told(error)
    overrides = []
    if HydraConfig.initialized():  # --config-dir DIR: the run's experiment may live there
        hydra = HydraConfig.get()
        overrides, command = task_overrides(hydra), [*command, *config_options(hydra)]
        overrides += config_file_paths(output_dir, overrides)  # an experiment's own (probe 52)
    diverged = isinstance(error, NonFiniteError) and error.lower_rate
    diverged = diverged and isinstance(lr, int | float) and lr > 0
    last = Path(getattr(callback, "path", output_dir / "checkpoints" / LAST_NAME))
    if getattr(callback, "wrote_own", False):  # applied already: a second reset is another run
        overrides = [o for o in overrides if not o.startswith(APPLIED_ONCE)]
    if isinstance(error, DataError):  # a row the stream reached: fixed, the data is edited
        overrides = [*without(overrides, "resume_mismatch"), "resume_mismatch=warn"]
        resume_with = DATA_FIXED
    if last.is_file() or rank != 0:  # process 0 writes the checkpoints: unseen, maybe there
        saved = getattr(callback, "saved_step", None)
        at = f" (optimizer step {saved})" if saved is not None else ""
        if diverged:  # a resume alone keeps the checkpoint's optimizer, and its rate
            overrides = lower_rate(overrides, lr, "resume_reset_optimizer=true")
            resume_with = f"Resume with {RATE} and a fresh optimizer"
        resume = job_rerun(command, overrides, output_dir, "ckpt_path=last")
        resume = resume or resume_command(command, overrides, output_dir)
        if not last.is_file():  # seen late on a network filesystem, or never written
            restart = started_again(command, overrides, output_dir)
            return unseen_checkpoint(why, resume_with, last, resume, restart)
        return f"\n{why}\nThe latest checkpoint is {last}{at}. {resume_with}{where()}:\n  {resume}"
    if (repair := last.with_name(REPAIR_NAME)).is_file() and not diverged:
        return repair_kept(why, resume_with, repair, command, overrides, output_dir)
    again = "Start again with"
    if diverged:
        overrides, again = lower_rate(overrides, lr), f"Start again with {RATE}, with"
    restart = started_again(command, overrides, output_dir)
    return (
        f"\n{why}\nNo checkpoint was written: there is nothing to resume from. {again}"
        f"{where()}:\n  {restart}"
    )


def repair_kept(
    why: str, resume_with: str, repair: Path, command, overrides: list[str], output_dir: Path
) -> str:
    """What a run stopped before its first checkpoint says where its block-wise repair kept its
    progress (``repair``): the command goes on from it."""
    resume = job_rerun(command, overrides, output_dir, "ckpt_path=last")
    resume = resume or resume_command(command, overrides, output_dir)
    return (
        f"\n{why}\nNo checkpoint was written yet; the block-wise repair's progress is kept in "
        f"{repair}. {resume_with} (the repair goes on from there){where()}:\n  {resume}"
    )


def started_again(command: Sequence[str], overrides: list[str], output_dir: Path) -> str:
    """The command that starts the run again in ``output_dir``: a cluster job's own
    resubmission where it was one, else the shell's."""
    again = job_rerun(command, overrides, output_dir, *restart_extra(output_dir))
    return again or restart_command(command, overrides, output_dir)


def unseen_checkpoint(why: str, resume_with: str, last: Path, resume: str, restart: str) -> str:
    """What a process other than 0 says where it sees no checkpoint: process 0 writes them, and
    one it wrote may not show here yet; if it wrote none (lost before its first), only the
    command that starts again works (a resume is refused for want of one)."""
    resume_with = f"{resume_with[0].lower()}{resume_with[1:]}"
    return (
        f"\n{why}\nProcess 0 writes the run's checkpoints, as {last}; this process sees none. "
        f"If it wrote one, {resume_with}{where()}:\n  {resume}\nIf it wrote none (lost before "
        f"its first), there is nothing to resume from; start again with:\n  {restart}"
    )


def told(error: BaseException) -> tuple[str, str]:
    """Why the run stopped, and the words that lead its resume command; ``error`` marked as
    told where the command would otherwise say it again."""
    if isinstance(error, Interrupted):
        error.reported = True
        return str(error), "Resume with"
    if isinstance(error, KeyboardInterrupt):
        error.reported = True  # type: ignore[attr-defined]  # told once, with its step
        return "stopped at once (a second SIGINT)", "Resume with"
    # An error may recur where the run resumes (a bad row, a bug): its resume waits for a fix.
    resume_with = "Once its cause is fixed (or has passed), resume with"
    if isinstance(error, PeerLost):
        error.reported = True
        return f"training stopped: {error}", resume_with
    if isinstance(error, OSError) and full_disk_message(error) is not None:
        error.reported = True  # the command said it again, alone (probe 47)
    return f"training stopped: {type(error).__name__}: {error}".split("\n")[0], resume_with


RATE = "a tenth of the learning rate (lower it further if it diverges again)"

DATA_FIXED = (
    "Once the data is fixed, resume with resume_mismatch=warn (the resume checks the data "
    "against the checkpoint's record, which a fix in place changes; the stream goes on from "
    "the row it had reached)"
)
"""How a run stopped by a bad row resumes: a resume of the same command was refused, its data
edited (probe 37)."""


def without(overrides: Sequence[str], key: str) -> list[str]:
    """``overrides`` less the ones that set ``key``."""
    return [word for word in overrides if word.split("=", 1)[0].lstrip("+") != key]


def lower_rate(overrides: Sequence[str], lr: float, *extra: str) -> list[str]:
    """``overrides`` with ``optimizer.lr`` a tenth of ``lr`` (the rate that diverged) and
    ``extra``, replacing what they set before."""
    for key in ["optimizer.lr", *(word.split("=", 1)[0] for word in extra)]:
        overrides = without(overrides, key)
    return [*overrides, f"optimizer.lr={lr / 10:g}", *extra]


def where() -> str:
    """Where the printed command runs: under a launcher, on every node through it again (the
    process sees only its own command, not the launcher's)."""
    found = launcher()
    return "" if found is None else f", on every node, through {found.name} as before"
