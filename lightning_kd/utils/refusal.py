"""Input a command refuses before anything loads, and how every command reports it.

A refusal is the user's to fix, not a fault of the package: the commands print its message alone
(no traceback) and exit 2, as argparse does for a bad option. It stays a ``ValueError`` so that a
notebook or a test calling the library half catches it as one. The refusals found once a run has
looked at what it was given — a run directory in use or holding another run, a checkpoint or
cache that is not this run's, a resume of other settings — are ``Refused`` too (``RunDirError``,
``CheckpointError``, ``CacheError``, ``ProvenanceMismatch``, ``CompletionsMismatch``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REFUSED_EXIT = 2
"""The exit status of a command that refused its input (argparse's, for a bad option)."""


class Refused(ValueError):
    """Input a command refuses: every bad value it was given, each with its key, the allowed
    values and a fix, or what it found that is not the run's."""

    errors: Sequence[str] = ()
    """The messages :func:`refuse` listed (none where the refusal was raised as one text)."""


def refuse(errors: Sequence[str]) -> None:
    """Raise :class:`Refused` listing all of ``errors`` at once (nothing when there are none)."""
    errors = said_once(errors)
    if not errors:
        return
    # Not "out of range": a missing file or a run directory is refused here too.
    head = "a value is" if len(errors) == 1 else f"{len(errors)} values are"
    refused = Refused(f"{head} refused:\n  " + "\n  ".join(errors))
    refused.errors = errors
    raise refused


def messages(refused: Refused) -> list[str]:
    """The messages ``refused`` lists (:func:`refuse`'s), or its whole text: to refuse them with
    others, at once."""
    return list(refused.errors) if refused.errors else [str(refused)]


def is_number(value: object) -> bool:
    """A real number: not a bool (YAML's true/false) nor a string (``alpha: abc``)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def said_once(errors: Sequence[str]) -> list[str]:
    """``errors`` with one problem found by two checks said once: the same message, or a second
    message about the same ``key=value`` (the config's value check and the spec's own)."""
    kept: dict[str, str] = {}
    for error in errors:
        # The key=value a message opens with, whatever follows it (": must be ...", "; it must")
        setting = re.match(r"[\w.+~\[\]-]+=[^\s:;,]+(?=[:;]|$)", error)
        kept.setdefault(setting.group() if setting else error, error)
    return list(kept.values())


def first_line(error: BaseException) -> str:
    """What an error says first (its message's first line; its type's name for none): quoted
    after a line of ours, without the stack trace a C++ error (gloo, NCCL) or a retrying
    download appends."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
