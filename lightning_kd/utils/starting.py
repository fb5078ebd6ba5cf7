"""Ctrl+C or SIGTERM while a command starts: one line and the shell's exit status.

A command spends its first seconds importing torch, Lightning and transformers. Python's default
SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is, inside the import of a C
extension too, which then fails its initialisation ("ImportError: initialization failed"), and
the interpreter aborts while finalising it: a chained traceback of a hundred lines, "Fatal
Python error" and exit 134, for the commonest Ctrl+C there is (a wrong override noticed). Until
the command installs its own stop request (``utils/stopping.py``, before it writes anything) or
returns, a signal ends the process at once, with the line the command prints for a Ctrl+C and
128 + the signal number. Nothing is written before then: nothing needs cleaning up.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_replaced: dict[int, object] = {}
_said = ""


def begin(said: str) -> None:
    """Stop at once on SIGINT/SIGTERM, printing ``said`` and the signal (``lightning-kd train``),
    until :func:`end`. Only the main thread can set handlers: elsewhere (a command called from a
    thread) nothing changes."""
    global _said
    if threading.current_thread() is not threading.main_thread() or _replaced:
        return
    _said = said
    _replaced.update({number: signal.signal(number, _stop) for number in SIGNALS})


def end() -> None:
    """Put back the handlers :func:`begin` replaced (the command's own take over)."""
    for number, handler in _replaced.items():
        signal.signal(number, handler)
    _replaced.clear()


def _stop(signum: int, frame: FrameType | None) -> None:
    how = "Ctrl+C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    print(f"\n{_said}: stopped by {how} while starting, before any work", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + signum)  # no unwinding through a half-imported extension
