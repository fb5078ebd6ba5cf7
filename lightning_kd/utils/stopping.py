"""SIGINT and SIGTERM as a request to stop at the next clean point, in every stage of a run.

A run has stages of different units of work: converting the teacher, writing the teacher cache,
ranking layers, the block-wise repair, validating, training (an optimizer step), exporting. The
first SIGINT or SIGTERM does not kill the process mid-unit: the handler records it, and each stage
asks :func:`StopRequest.check` at its own boundaries (after a cache batch, a repair step, a
validation batch, an optimizer step), which raises :class:`Interrupted` naming the stage. What a
stage had finished stays (cache shards, checkpoints); the launcher turns :class:`Interrupted` into
the shell's exit code, 128 + the signal number, and prints how to resume. A second SIGINT stops at
once (``KeyboardInterrupt``), as a user pressing Ctrl+C twice expects.

One handler pair serves the whole process (:data:`STOP`): the launch installs it before the first
stage, so no stage runs under Python's default handlers (which exit 1 on Ctrl+C and die silently
on SIGTERM) or under Lightning's (whose SIGTERM ends ``fit`` with exit 0 and saves nothing; it
registers its own only where none is installed).

A main thread blocked inside C++ (torch's store, while a run's processes join) runs no Python
handler until the call returns: there, :func:`stopping_while_blocked` ends the process at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_kd.utils import starting

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """A stage stopped at a clean point because the process was asked to stop."""

    def __init__(self, signum: int, stage: str, detail: str = "") -> None:
        self.signum, self.stage = signum, stage
        self.reported = False  # set once the user has been told what is kept and how to go on
        name = signal.Signals(signum).name
        super().__init__(f"{name} received: stopped {stage}" + (f" ({detail})" if detail else ""))

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 130 for SIGINT, 143 for
        SIGTERM."""
        return 128 + self.signum


def as_interrupted(error: BaseException) -> BaseException:
    """Lightning's ``SIGTERMException`` as the :class:`Interrupted` it is (and its ``exit(1)``
    on a second Ctrl+C as the ``KeyboardInterrupt`` it is), ``error`` otherwise.
    Lightning's own SIGTERM handler holds the signal while ``fit`` sets up (the run's takes over
    at the first step), and its exception is a ``SystemExit`` of status 0: a preempted job was
    read as finished by its scheduler, and not requeued."""
    if isinstance(error, SIGTERMException):
        stop: BaseException = Interrupted(signal.SIGTERM, "as training started")
    elif isinstance(error, SystemExit) and error.code == 1 and STOP.signum == signal.SIGINT:
        stop = KeyboardInterrupt()  # a second Ctrl+C, which Lightning turns into exit(1)
    else:
        return error
    stop.__cause__ = error
    return stop


class StopRequest:
    """SIGINT/SIGTERM handlers that record a request to stop instead of stopping."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.finishing: str | None = None
        """Set once the command is past its last stage that a stop leaves resumable (a run's
        final validation, agreed by its ranks): what it still does. A signal then is said as
        that, not as a stop (rank 0 said "stopping", then finished and exited 0); it is still
        recorded for a later stage's clean points (lm_eval.tasks, between models)."""
        self._replaced: list[dict[int, object]] = []  # per install: the handlers it replaced
        self._pid = os.getpid()  # the process that installed the handlers

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """The handlers for the block. Nested installs keep the request and put the handlers
        back in place: Lightning's ``fit`` wraps any SIGTERM handler it finds with its own, whose
        notice ends training with exit 0 and no checkpoint, so training installs them again."""
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    def install(self) -> None:
        if not self._replaced:  # the outermost install starts a new request
            self.signum, self.finishing = None, None
            starting.end()  # the command is under way: its stops are this request's
        self._replaced.append({signum: signal.signal(signum, self._handle) for signum in SIGNALS})
        self._pid = os.getpid()

    def uninstall(self) -> None:
        """Put back the handlers the latest :meth:`install` replaced; the outermost ends the
        request (a later stage outside any install runs as if none had come)."""
        if self._replaced:
            for signum, handler in self._replaced.pop().items():
                signal.signal(signum, handler)
        if not self._replaced:
            self.signum, self.finishing = None, None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a DataLoader worker forked with it: the run stops them
            return
        name = signal.Signals(signum).name
        if self.finishing is not None:  # kept for a stage after it that has clean points
            self.signum = self.signum or signum
            print(f"\n{name} received: {self.finishing}", file=sys.stderr, flush=True)
            return
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl+C: stop now, what was saved stays
            return  # a repeated SIGTERM changes nothing: the stop is under way
        self.signum = signum
        again = "Ctrl+C again" if signum == signal.SIGINT else "SIGKILL"  # a scheduler's SIGTERM
        print(
            f"\n{name} received: stopping at the next clean point and keeping what can be "
            f"resumed ({again} to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def check(
        self, stage: str, agreed: Callable[[bool], bool] | None = None, detail: str = ""
    ) -> None:
        """Raise :class:`Interrupted` for ``stage`` (e.g. "during the validation"; ``detail``
        says what is kept) if a stop was asked for. ``agreed`` turns this process's answer into
        all ranks' (a collective every rank must call at the same point); without it, the answer
        is this process's."""
        asked = self.requested
        if agreed is not None:
            asked = agreed(asked)
        if asked:
            raise Interrupted(self.signum or signal.SIGTERM, stage, detail)


STOP = StopRequest()
"""The process's one stop request."""


@contextmanager
def stopping_at_once(stage: str) -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` at once inside the block: for work with no
    clean point inside it (one file written whole or not at all), whose cleanup runs as the
    exception unwinds. Python's defaults print a traceback (SIGINT) or die leaving the partial
    file (SIGTERM)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum, stage)

    replaced = {number: signal.signal(number, stop) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in replaced.items():
            signal.signal(number, handler)


@contextmanager
def stopping_while_blocked(
    blocked: Callable[[], bool],
    said: Callable[[int], str],
    before_exit: Callable[[int], None] = lambda signum: None,
) -> Iterator[None]:
    """SIGINT and SIGTERM end the process at once, exiting 128 + the signal number after
    printing ``said(signum)``, whenever they come while ``blocked()``: for a main thread that
    may wait inside C++ (torch's store, joining a process group), where no Python handler runs
    until the wait returns, so the handlers above never would. Outside ``blocked()`` a signal
    is left to the handlers in place (:data:`STOP`'s clean point).

    The handlers' C half writes each signal's number to the wakeup fd even while the main thread
    is blocked; a watcher thread reads it. Outside the main thread (where no wakeup fd can be
    set) the block runs unwatched. ``before_exit(signum)`` runs first: the processes this one
    started are handed the signal (an orphan would wait on for a store that is gone)."""
    read, write = os.pipe()
    os.set_blocking(write, False)  # the C handler must never block on a full pipe
    try:
        replaced = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read), os.close(write)
        yield
        return

    def watch() -> None:
        while numbers := os.read(read, 64):
            for signum in numbers:
                if signum in SIGNALS and blocked():
                    sys.stdout.flush()  # os._exit drops what a buffer still holds
                    print(f"\n{said(signum)}", file=sys.stderr, flush=True)
                    before_exit(signum)
                    os._exit(128 + signum)  # nothing to save: the block holds no clean point

    watcher = threading.Thread(target=watch, name="stop-while-blocked", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(replaced)
        os.close(write)  # the watcher reads the end of the pipe and returns
        watcher.join()
        os.close(read)
