"""Writer locks: a second writer refused with the holder's pid, the lock gone with its holder."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lightning_kd.utils.locks import WriterLocked, hold_shared, in_use_elsewhere, writer_lock
from tests.conftest import ROOT

HOLD = """
import sys, time
from pathlib import Path
from lightning_kd.utils.locks import writer_lock
with writer_lock(Path(sys.argv[1]), "the output", "wait"):
    print("held", flush=True)
    time.sleep(600)
"""


def held_by_another_process(path: Path):
    """A process holding the writer lock ``path`` until it is killed (at the latest when the
    block ends)."""
    return another_process(HOLD, path)


@contextmanager
def another_process(script: str, path: Path) -> Iterator[subprocess.Popen]:
    """A process running ``script`` on ``path``, once it printed "held", until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def free(path: Path) -> bool:
    """Whether another open file description can take ``path``'s lock now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_second_writer_is_refused_until_the_first_is_killed(tmp_path) -> None:
    lock = tmp_path / "out.lock"
    with held_by_another_process(lock) as holder:
        refused = rf"^out is being written by another process \(pid {holder.pid}, .*; wait for it$"
        with pytest.raises(WriterLocked, match=refused), writer_lock(lock, "out", "wait for it"):
            pass
        os.kill(holder.pid, signal.SIGKILL)  # no cleanup: the kernel drops the lock
        holder.wait()
        with writer_lock(lock, "out", "wait for it"):
            assert not free(lock)
    assert free(lock)


def test_the_lock_is_reentrant_in_one_process_and_released_by_the_outermost(tmp_path) -> None:
    lock = tmp_path / "out.lock"
    with writer_lock(lock, "out", "wait"):
        with writer_lock(lock, "out", "wait"):
            assert not free(lock)
        assert not free(lock)
    assert free(lock)


READ = """
import sys, time
from pathlib import Path
from lightning_kd.utils.locks import hold_shared
hold_shared(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def read_by_another_process(path: Path):
    """A process holding ``path`` shared, as a run reading a cache does, until the block ends."""
    return another_process(READ, path)


def test_a_reader_elsewhere_is_found_and_this_process_own_hold_is_not(tmp_path: Path) -> None:
    path = tmp_path / ".readers.lock"
    hold_shared(path)
    assert not in_use_elsewhere(path)  # its own hold let go: it asks because it is done
    with read_by_another_process(path):
        assert in_use_elsewhere(path)
    assert not in_use_elsewhere(path)  # the reader gone (its lock with it)


def wait_for_another(path: Path, what: str) -> None:
    """Take ``path`` through ``waiting_lock`` while another holder has it for 0.3 s."""
    import threading
    import time

    from filelock import FileLock

    from lightning_kd.utils.locks import waiting_lock

    taken = threading.Event()

    def hold() -> None:  # another holder (filelock refuses two of one thread)
        with FileLock(str(path)):
            taken.set()
            time.sleep(0.3)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    with waiting_lock(path, what):
        pass
    holder.join()


def test_a_lock_another_holds_is_waited_for_with_a_word(tmp_path, capsys, monkeypatch) -> None:
    """A run waited minutes on another's conversion or cache write without a word (probe 48);
    a DDP launch's further ranks, all waiting on rank 0's conversion, say nothing."""
    from lightning_kd.utils.locks import waiting_lock

    path = tmp_path / "x.lock"
    wait_for_another(path, "for the conversion of x.gguf")
    assert (
        capsys.readouterr().out
        == f"waiting for the conversion of x.gguf: another process holds {path}\n"
    )
    monkeypatch.setenv("LOCAL_RANK", "1")
    wait_for_another(path, "for the conversion of x.gguf")
    assert capsys.readouterr().out == ""
    monkeypatch.delenv("LOCAL_RANK")
    with waiting_lock(path, "for nothing"):  # free: nothing said
        pass
    assert capsys.readouterr().out == ""


def test_asking_whether_a_writers_lock_is_held_leaves_it_as_it_is(tmp_path) -> None:
    """``in_use_elsewhere`` of a writer's lock (a run directory's) takes nothing: the holder's
    pid stays in the file, and no file is made where there is none."""
    from lightning_kd.utils.locks import take_lock

    path = tmp_path / "lock"
    assert not in_use_elsewhere(path) and not path.exists()
    holder = take_lock(path)
    try:
        assert in_use_elsewhere(path)
    finally:
        os.close(holder)
    assert not in_use_elsewhere(path) and path.read_text() == str(os.getpid())
