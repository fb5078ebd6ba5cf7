"""Where one process's stream stands (``data.streaming``'s module doc): saved in checkpoints."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lightning_kd.data.packing import Mark

CURSOR = "stream_cursor"
"""The key a streamed training batch carries its position under, until training takes it."""


@dataclass(frozen=True)
class Cursor:
    """Where one process's stream stands (see the module doc); saved in each checkpoint."""

    passes: int = 0
    """Passes over the share completed."""
    window: int = 0
    """Windows of this pass started before the current one."""
    mark: Mark = field(default_factory=Mark)
    """Before the row the current window starts in."""
    offset: int = 0
    """Tokens of that row packed into the previous window."""
    batches: int = 0
    """Batches of the current window trained on."""
    opened: list | None = None
    """With ``data.domains``: each domain's open block (``OpenBlocks.as_list``), which
    ``offset`` then stands in for."""

    def as_dict(self) -> dict[str, Any]:
        """Plain values (what a checkpoint read with ``weights_only=True`` can hold)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Cursor:
        return cls(**(values | {"mark": Mark(**values["mark"])}))
