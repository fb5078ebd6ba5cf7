"""Ctrl+C or SIGTERM while a command starts, and SIGTERM in a command without stages.

A command spends its first seconds importing torch, Lightning and transformers. Python's default
SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is, inside the import of a C
extension too, which then fails its initialisation ("ImportError: initialization failed"), and
the interpreter aborts while finalising it: a chained traceback of a hundred lines, "Fatal
Python error" and exit 134, for the commonest Ctrl+C there is (a wrong override noticed). Until
the command has imported what it needs (:func:`end`, or its stop request of
``utils/stopping.py``, installed before it writes anything), a signal ends the process at once,
with one line and 128 + the signal number. Nothing is written before then.

After it, SIGINT is Python's ``KeyboardInterrupt`` again and SIGTERM raises :class:`Terminated`,
which the command line says in one line, as it says a Ctrl+C (Python's default for SIGTERM ended
``evaluate`` with exit 143 and not a word). :func:`finish` puts back the handlers found.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_found: dict[int, object] = {}
_said = ""


class Terminated(BaseException):
    """SIGTERM in a command without stages (``evaluate``, ``export``, ``bench``): it stops there,
    as Ctrl+C's ``KeyboardInterrupt`` does."""


def begin(said: str) -> None:
    """Stop at once on SIGINT/SIGTERM, printing ``said`` and the signal (``lightning-kd train``),
    until :func:`end`. Only the main thread can set handlers: elsewhere (a command called from a
    thread) nothing changes."""
    global _said
    if threading.current_thread() is not threading.main_thread() or _found:
        return
    _said = said
    _found.update({number: signal.signal(number, _stop) for number in SIGNALS})


def end() -> None:
    """The command has imported what it needs: Ctrl+C is a ``KeyboardInterrupt`` again, and
    SIGTERM (where Python's default was in place) a :class:`Terminated`."""
    if not _found:
        return
    signal.signal(signal.SIGINT, _found[signal.SIGINT])
    default = _found[signal.SIGTERM] in (signal.SIG_DFL, None)
    signal.signal(signal.SIGTERM, _terminate if default else _found[signal.SIGTERM])


def finish() -> None:
    """Put back the handlers :func:`begin` found (the command has returned)."""
    for number, handler in _found.items():
        signal.signal(number, handler)
    _found.clear()


def _stop(signum: int, frame: FrameType | None) -> None:
    how = "Ctrl+C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    print(f"\n{_said}: stopped by {how} while starting, before any work", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + signum)  # no unwinding through a half-imported extension


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated
