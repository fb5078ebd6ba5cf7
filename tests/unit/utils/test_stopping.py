"""SIGINT/SIGTERM as a request to stop at the next clean point (utils/stopping.py)."""

from __future__ import annotations

import os
import signal

import pytest

from lightning_kd.utils.stopping import STOP, Interrupted, StopRequest


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
