"""The commands: ``lightning-kd <command> [options]`` (also ``python -m lightning_kd <command>``).

Each command is a thin command-line half over a library half in ``lightning_kd.launch`` (or
``lightning_kd.evaluation``, ``lightning_kd.bench``) that a notebook can call directly.
"""

from __future__ import annotations

import difflib
import importlib
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import version

from lightning_kd.launch.config_dir import shipped_docs_dir
from lightning_kd.models.unreadable import UnreadableModel
from lightning_kd.utils import starting
from lightning_kd.utils.disk import full_disk_message
from lightning_kd.utils.refusal import REFUSED_EXIT, Refused

PROG = "lightning-kd"

COMMANDS = {
    "train": "distil a teacher into a student (Hydra overrides: debug=smoke, teacher=..., ...)",
    "cache": "run the teacher once and write its top-k cache (Hydra overrides, as train)",
    "generate": "write the teacher's completions for sequence-level KD (Hydra overrides)",
    "evaluate": "perplexity and bits per byte of saved models, judged answers, lm-eval tasks",
    "importance": "score the teacher's layers and print the student.layers a run would keep",
    "export": "write a saved student as a GGUF file for llama.cpp (f16 or q8_0)",
    "bench": "memory and speed of a KD step against its floor, side by side",
    "soak": "many optimizer steps of the real launch, watching for memory that only grows",
}
"""Each command's module is ``lightning_kd.cli.<name>``, with a ``main(argv)``."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help}" for name, help in COMMANDS.items()]
    lines += ["", f"`{PROG} <command> --help` describes a command's options."]
    lines += [f"The docs (Markdown pages): {shipped_docs_dir()}"]
    return "\n".join(lines)


def lossy_streams() -> None:
    """Print what a terminal cannot encode as escapes: under an ASCII or Latin-1 stdout (a
    job's ``PYTHONIOENCODING=ascii``, ``LC_ALL=C`` without Python's UTF-8 mode) the summary's
    ``‖`` failed a finished run with a ``UnicodeEncodeError``, exit 1, after every output was
    written (probe 48). Files are written as UTF-8 whatever the terminal."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if hasattr(stream, "reconfigure") and encoding != "utf8":
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv[0]`` with the rest of ``argv``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    lossy_streams()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"{PROG} {version('lightning-kd')}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        print(f"{usage()}\n\n{PROG}: unknown command {name!r}{hint}", file=sys.stderr)
        return 2
    starting.begin(f"{PROG} {name}")  # until the command's own stop request takes over
    try:
        # Imported on demand: `lightning-kd evaluate --help` need not load Lightning and Hydra.
        command = importlib.import_module(f"lightning_kd.cli.{name}")
        status = command.main(rest)
    except (Refused, UnreadableModel) as refused:  # the user's input, not a fault: the
        print(f"{PROG} {name}: {refused}", file=sys.stderr)  # message is the whole story
        return REFUSED_EXIT
    except KeyboardInterrupt:  # Ctrl+C: the shell's convention, not a traceback
        print(f"\n{PROG} {name}: stopped by Ctrl+C (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT
    except starting.Terminated:  # SIGTERM where no stage took it (utils/starting.py)
        print(f"\n{PROG} {name}: stopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except OSError as error:  # a full disk, said whole by its message (utils/disk.py)
        if (message := full_disk_message(error)) is None:
            raise
        print(f"{PROG} {name}: {message}", file=sys.stderr)
        return 1
    finally:
        starting.finish()
    return status if isinstance(status, int) else 0
