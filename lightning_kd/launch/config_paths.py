"""The relative paths a run's config files name, pinned for its printed resume command.

The printed command makes the relative paths of its overrides absolute (``training/rerun.py``),
so that it works from any directory; a path written in a config file of the user's own (the
experiment of ``docs/config.md``, ``data: {files: [chats.jsonl]}``) was read again from the new
directory, and the resume refused: "data.files entry 'chats.jsonl' does not exist" (probe 52).
Each such setting is added to the command as an override of its absolute path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from lightning_kd.launch.config import JOB_RECORD
from lightning_kd.training.rerun import PATH_KEYS, anchored, is_local
from lightning_kd.utils.plain_data import flat


def config_file_paths(output_dir: Path, overrides: Sequence[str]) -> list[str]:
    """``key=<absolute path>`` for each setting of the run's recorded config (its
    ``.hydra/config.yaml``) that names relative local paths existing here, and that no override
    of ``overrides`` sets."""
    try:
        saved = OmegaConf.to_container(OmegaConf.load(output_dir / JOB_RECORD / "config.yaml"))
    except (OSError, ValueError):  # no record (a run stopped before it), or unreadable
        return []
    given = {word.split("=", 1)[0].lstrip("+~") for word in overrides}
    pinned = []
    for key, value in flat(saved).items():
        if key.rsplit(".", 1)[-1] not in PATH_KEYS or key in given:
            continue
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(item, str) for item in items):
            continue
        if any(is_local(item) for item in items):
            listed = f"[{','.join(items)}]" if isinstance(value, list) else items[0]
            pinned.append(anchored(f"{key}={listed}"))
    return pinned
