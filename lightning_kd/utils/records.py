"""JSON records the package writes beside its outputs (a cache's ``meta.json``, a generation's
``completions.meta.json``), read back. One that is damaged — cut short by a crash, zero-filled,
edited by hand — is refused naming the file and the fix; it was a ``JSONDecodeError`` traceback
that named no file (probe 59)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_kd.utils.refusal import Refused, first_line


class DamagedRecord(Refused):
    """A record that is no JSON object: unreadable, cut short, or of another shape."""


def read_record(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in ``path``; refused, naming it and ``fix``, where it cannot be read."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: JSON's and UTF-8's errors
        raise DamagedRecord(f"{path} cannot be read ({first_line(error)}): {fix}") from None
    if not isinstance(record, dict):
        raise DamagedRecord(f"{path} holds a {type(record).__name__}, not a record: {fix}")
    return record
