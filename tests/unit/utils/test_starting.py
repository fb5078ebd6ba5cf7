"""Ctrl+C or SIGTERM while a command starts (utils/starting.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from lightning_kd.cli import main
from lightning_kd.utils import starting
from lightning_kd.utils.stopping import StopRequest

# A signal in the middle of the imports: the process stops at once, one line, no traceback.
SCRIPT = """
import os, signal, sys, time
from lightning_kd.utils import starting
starting.begin("lightning-kd train")
os.kill(os.getpid(), signal.{name})
time.sleep(30)
sys.exit(0)
"""


@pytest.mark.parametrize(
    ("name", "code", "how"), [("SIGINT", 130, "Ctrl+C (SIGINT)"), ("SIGTERM", 143, "SIGTERM")]
)
def test_a_signal_while_a_command_starts_stops_it_in_one_line(name, code, how) -> None:
    """Ctrl+C while Lightning imported was a chained ImportError traceback, then "Fatal Python
    error" and exit 134 (probe 33)."""
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(name=name)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == code
    assert (
        ran.stderr.strip()
        == f"lightning-kd train: stopped by {how} while starting, before any work"
    )


def test_the_commands_own_stop_request_takes_over_and_the_handlers_are_put_back() -> None:
    before = {number: signal.getsignal(number) for number in starting.SIGNALS}
    starting.begin("lightning-kd cache")
    assert signal.getsignal(signal.SIGINT) is starting._stop
    request = StopRequest()
    with request.installed():
        assert signal.getsignal(signal.SIGINT) == request._handle
    assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]  # a KeyboardInterrupt again
    starting.finish()
    assert {number: signal.getsignal(number) for number in starting.SIGNALS} == before


@pytest.mark.parametrize(
    ("command", "work"),
    [
        (["export", "{tmp}", "--gguf", "f16"], "lightning_kd.launch.export.export_directory"),
        (["importance", "debug=smoke"], "lightning_kd.launch.importance.run"),
    ],
    ids=["export", "importance"],
)
def test_sigterm_in_a_command_without_stages_is_said_in_one_line(
    tmp_path, capsys, monkeypatch, command, work
):
    """`evaluate` ended by SIGTERM exited 143 without a word (probe 33); `importance`, stopped
    minutes into its scoring, said it was stopped "while starting, before any work" (probe 41)."""
    import os

    def terminated(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("SIGTERM did not stop the command")

    monkeypatch.setattr(work, terminated)
    before = {number: signal.getsignal(number) for number in starting.SIGNALS}
    assert main([word.format(tmp=tmp_path) for word in command]) == 143
    assert capsys.readouterr().err.strip() == f"lightning-kd {command[0]}: stopped by SIGTERM"
    assert {number: signal.getsignal(number) for number in starting.SIGNALS} == before


def test_a_command_that_returns_leaves_the_handlers_as_they_were(tmp_path, capsys) -> None:
    before = {number: signal.getsignal(number) for number in starting.SIGNALS}
    assert main(["export", str(tmp_path / "absent"), "--gguf", "f16"]) == 2  # refused, imported
    assert {number: signal.getsignal(number) for number in starting.SIGNALS} == before
