"""Data that cannot be read as given: refusals (``utils/refusal.py``) that name the file, the row
or the setting, and the fix, so a command prints them alone and exits 2, though they are found
while the data is read, after the config's checks."""

from __future__ import annotations

import json
from typing import Any

from lightning_kd.utils.refusal import Refused


class DataError(Refused):
    """Data, or a data setting, that cannot give examples as given."""


class MissingData(DataError, FileNotFoundError):
    """A data file or pattern that is not there (still a ``FileNotFoundError``)."""


def described(value: Any) -> str:
    """``value`` said by its type and start (``int 7``, ``dict {"nested": 1}``), for a refusal
    that names what a row holds in place of text."""
    return f"{type(value).__name__} {json.dumps(value, default=str)[:40]}"


def json_problem(err: json.JSONDecodeError) -> str:
    """What is wrong with a line, and where (``Invalid control character at column 15``): the
    decoder's ``msg`` alone ended in a dangling "at"."""
    where = "column" if err.msg.endswith(" at") else "at column"
    return f"{err.msg} {where} {err.colno}"
