"""SIGINT/SIGTERM as a request to stop at the next clean point (utils/stopping.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from lightning_kd.utils.stopping import STOP, Interrupted, StopRequest, stopping_while_blocked
from tests.conftest import ROOT


def test_the_first_signal_is_recorded_and_a_second_ctrl_c_stops_at_once() -> None:
    before = signal.getsignal(signal.SIGTERM)
    request = StopRequest()
    with request.installed():
        request.check("anywhere")  # nothing asked yet
        os.kill(os.getpid(), signal.SIGTERM)
        assert request.requested and request.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a repeat changes nothing
        with pytest.raises(Interrupted, match=r"SIGTERM received: stopped in the repair \(kept\)"):
            request.check("in the repair", detail="kept")
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before, "the handlers are put back"
    assert not request.requested, "the request ends with the outermost install"


def test_a_signal_past_every_clean_point_is_said_and_changes_nothing(capsys) -> None:
    """Past a run's final validation, rank 0 said "stopping at the next clean point", then
    finished with exit 0 (probe 35); a scheduler's SIGTERM was told to press Ctrl+C."""
    request = StopRequest()
    with request.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        assert "(SIGKILL to stop at once)" in capsys.readouterr().err
    with request.installed():
        request.finishing = "it finishes its export and summary first"
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt mid-export
        err = capsys.readouterr().err
        assert err.count("received: it finishes its export and summary first") == 2
        # Kept for a later stage's clean point (lm_eval.tasks, between models)
        with pytest.raises(Interrupted, match="SIGTERM received: stopped during lm_eval"):
            request.check("during lm_eval.tasks")
    assert request.finishing is None, "the next command starts afresh"


def test_a_collective_decides_for_all_ranks() -> None:
    request = StopRequest()
    with request.installed():
        # another rank was signalled: this one stops too, at the same point
        with pytest.raises(Interrupted) as error:
            request.check("in training", agreed=lambda asked: True)
        assert error.value.exit_code == 128 + signal.SIGTERM


def test_nested_installs_take_the_handlers_back_from_whoever_wrapped_them() -> None:
    """Lightning's fit wraps the SIGTERM handler it finds; training installs it again and, when
    done, gives Lightning's back, which Lightning then replaces with the outer one."""
    with STOP.installed():
        outer = signal.getsignal(signal.SIGTERM)

        def lightnings(signum, frame) -> None:  # stands in for Lightning's wrapper
            pass

        signal.signal(signal.SIGTERM, lightnings)
        with STOP.installed():
            assert signal.getsignal(signal.SIGTERM) == outer
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) is lightnings
        assert STOP.signum == signal.SIGINT, "the request outlives the inner install"
        signal.signal(signal.SIGTERM, outer)
    assert not isinstance(getattr(signal.getsignal(signal.SIGTERM), "__self__", None), StopRequest)


BLOCKED_IN_CPP = """
import datetime, torch.distributed as dist
from lightning_kd.utils.stopping import STOP, stopping_while_blocked
with STOP.installed(), stopping_while_blocked(lambda: True, lambda signum: f"stopped on {signum}"):
    print("waiting", flush=True)
    # Rank 0's store waiting for a second process that never comes: a wait inside C++, where
    # no Python handler runs (STOP's alone would hear nothing for the minute).
    dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=60))
print("the wait returned", flush=True)
"""


def signalled_once_ready(
    process: subprocess.Popen, ready: Callable[[str], bool], signum: int, timeout: float = 30
) -> tuple[str, str]:
    """Read ``process``'s stdout until a line is ``ready``, give it a second to block, send it
    ``signum``; what it printed then (stdout read before the line is dropped)."""
    try:
        lines = []
        while not ready(line := process.stdout.readline()):
            assert line, "".join(lines)  # the process ended before it was ready
            lines.append(line)
        time.sleep(1)  # into the wait
        process.send_signal(signum)
        return process.communicate(timeout=timeout)
    finally:
        process.kill()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_blocked_in_cpp_ends_the_process_at_once(signum: int) -> None:
    waiting = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_IN_CPP],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = signalled_once_ready(waiting, lambda line: line == "waiting\n", signum)
    assert waiting.returncode == 128 + signum, err
    assert f"stopped on {int(signum)}" in err and "the wait returned" not in out


def test_a_signal_outside_the_blocked_part_is_left_to_the_stop_request() -> None:
    def said(signum: int) -> str:
        raise AssertionError("not blocked: the watcher must leave the signal alone")

    request = StopRequest()
    with request.installed(), stopping_while_blocked(lambda: False, said):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the watcher thread reads the signal's byte too
        assert request.signum == signal.SIGTERM, "recorded for the next clean point"
    assert signal.set_wakeup_fd(-1) == -1, "the wakeup fd is put back"


def test_lightnings_own_sigterm_exit_is_a_stop_with_its_exit_code() -> None:
    """A SIGTERM while fit sets up reaches Lightning's handler, whose SIGTERMException is a
    SystemExit of status 0: a preempted job exited 0, read as finished (probe 23)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightning_kd.utils.stopping import as_interrupted

    lightning = SIGTERMException()
    stop = as_interrupted(lightning)
    assert isinstance(stop, Interrupted) and stop.exit_code == 143
    assert str(stop) == "SIGTERM received: stopped as training started"
    assert stop.__cause__ is lightning
    other = ValueError("x")
    assert as_interrupted(other) is other


def test_a_worker_process_leaves_the_stop_to_the_run_and_a_second_ctrl_c_is_told_as_one(
    capsys,
) -> None:
    """With data.num_workers=2 the notice was printed three times (each forked worker ran the
    handler), and a second Ctrl+C, which Lightning turns into exit(1), was reported as
    "training stopped: SystemExit: 1" (probe 23)."""
    from lightning_kd.utils.stopping import as_interrupted

    request = StopRequest()
    with request.installed():
        request._pid = -1  # as in a process forked after the install
        request._handle(signal.SIGINT, None)
        assert not request.requested and capsys.readouterr().err == ""
    with STOP.installed():
        STOP._handle(signal.SIGINT, None)
        second = as_interrupted(SystemExit(1))
        assert isinstance(second, KeyboardInterrupt)
        assert as_interrupted(SystemExit(2)).code == 2  # another exit: as it is
