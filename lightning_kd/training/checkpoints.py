"""Checkpoints that survive: written crash-safely, read safely, named where they are bad.

- :class:`SafeCheckpointIO` writes each checkpoint to a temporary file *beside* its target (same
  directory, so the same filesystem), fsyncs it and moves it into place with ``os.replace``: a
  crash at any moment leaves either the previous file or the new one, never a truncated mix. It
  loads only local paths, always with ``weights_only=True`` (a pickle cannot run code), and turns
  an empty, truncated or corrupt file into a :class:`CheckpointError` naming it.
- :func:`resolve_ckpt_path` checks ``ckpt_path`` before anything loads: ``last`` means the run
  directory's latest checkpoint; a URL (``http://``, ``s3://``, any ``scheme://``) is refused.

When checkpoints are written (every N steps, at validation, on interruption) is
``lightning_kd.training.saving``'s concern.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn

from lightning_kd.models.lora import LoraSpec
from lightning_kd.training.checkpoint_files import (
    REPAIR_NAME,
    CheckpointError,
    check_whole,
    load_local,
)
from lightning_kd.training.set_aside import ASIDE
from lightning_kd.utils.atomic import replaced_whole
from lightning_kd.utils.disk import disk_errors

LAST = "last"
"""``ckpt_path`` value meaning "this run directory's latest checkpoint"."""
LAST_NAME = "last.ckpt"

RESUME = (
    "resume with ckpt_path=last (the last checkpoint written whole is kept; a checkpoint is "
    "written beside the one it replaces, so the disk needs room for two)"
)
"""What follows a checkpoint the disk had no room for (``utils/disk.py``)."""
START_AGAIN = (
    "start the run again (overwrite=true): no checkpoint was written whole before this one, "
    "so there is none to resume from"
)
"""What follows the first checkpoint the disk had no room for: ``ckpt_path=last`` is refused."""
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


DEEPSPEED_TAG = "latest"
"""The file naming the latest tag in a DeepSpeed checkpoint directory."""


def no_last_reason(checkpoint_dir: Path) -> str:
    """Why ``ckpt_path=last`` finds no checkpoint in ``checkpoint_dir``, and the way on."""
    run_dir = checkpoint_dir.parent
    if (run_dir / ASIDE).is_dir():  # the earlier run waits there (probe 59)
        return (
            f"; an overwrite=true run in {run_dir} stopped before its first checkpoint, and the "
            f"earlier run's outputs wait in {ASIDE}/: launch there without ckpt_path and without "
            "overwrite=true to put them back, then resume"
        )
    if (run_dir / "logs").is_dir():  # hydra.run.dir named an earlier run's
        return (  # it was told to give hydra.run.dir, which it had (probe 47)
            f"; the run in {run_dir} stopped before its first checkpoint (checkpoint.every): "
            "there is nothing to resume. Start it again there, without ckpt_path and with "
            "overwrite=true (its logs are replaced)"
        )
    return (
        f"; this run directory has no checkpoint yet ({checkpoint_dir}). ckpt_path=last "
        "resumes the run whose directory hydra.run.dir names: give it (hydra.run.dir=DIR "
        "ckpt_path=last), as a run without it gets a new timestamped directory"
    )


def resolve_ckpt_path(ckpt_path: str | None, checkpoint_dir: Path) -> Path | None:
    """The local checkpoint file ``ckpt_path`` names, checked to exist and look whole.

    ``last`` is ``checkpoint_dir/last.ckpt`` (None before it where a stopped repair's
    ``repair.pt`` is there: ``training/repair.py``). Remote paths are refused: Lightning loads them
    through fsspec with ``weights_only=False``, so a crafted file would run code.
    """
    if ckpt_path is None:
        return None
    text = str(ckpt_path)
    if _SCHEME.match(text):
        raise CheckpointError(
            f"ckpt_path={text!r} is a URL; only local checkpoint files are loaded (a remote one "
            "would be unpickled without weights_only). Download it yourself, check where it "
            "comes from, and pass the local path"
        )
    path = checkpoint_dir / LAST_NAME if text == LAST else Path(text).expanduser()
    if text == LAST and not path.exists() and (checkpoint_dir / REPAIR_NAME).is_file():
        return None  # stopped in the block-wise repair: the fit starts, the repair goes on
    if not path.exists():
        where = no_last_reason(checkpoint_dir)
        raise CheckpointError(
            f"ckpt_path={text!r}: no checkpoint file at {path}"
            + (where if text == LAST else "; give the path of a .ckpt file, or ckpt_path=last")
        )
    if path.is_file():
        check_whole(path)
    elif not (path / DEEPSPEED_TAG).is_file():  # DeepSpeed's checkpoints are directories
        inside = sorted(path.glob("*.ckpt")) or sorted(path.glob("*/*.ckpt"))
        example = f"e.g. ckpt_path={inside[0]}" if inside else "or ckpt_path=last"
        raise CheckpointError(
            f"ckpt_path={text!r} is a directory, not a checkpoint (nor a DeepSpeed checkpoint "
            f"directory, which holds a '{DEEPSPEED_TAG}' file); give a .ckpt file, {example}"
        )
    return path


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` so that a crash leaves the previous file or the whole new one."""
    # replaced_whole: a temporary file beside path, os.replace'd onto it (atomic within one
    # filesystem), removed on failure; the disk is judged before it goes (full while it is there).
    then = RESUME if path.is_file() else START_AGAIN
    with replaced_whole(path) as temp, disk_errors(path, then), open(temp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_directory(path.parent)  # make the rename itself durable


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with crash-safe writes and safe, local-only reads."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("SafeCheckpointIO takes no storage_options")
        if _SCHEME.match(str(path)):
            raise CheckpointError(f"checkpoints are written to local paths only, not {path}")
        atomic_torch_save(checkpoint, Path(path))

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if _SCHEME.match(str(path)):
            raise CheckpointError(f"only local checkpoints are loaded, not {path}")
        # weights_only is always True here, whatever the caller asks for: see the module doc.
        return load_local(Path(path), map_location or (lambda storage, loc: storage))


TEACHER_PREFIX = ("distiller.teacher.", "distiller.extra_teachers.", "distiller.repair_source.")
"""Where frozen models' weights sit in a DistillationModule's state dict, never checkpointed: the
teacher, the others of several, and the model a ``student.source`` student's repair reads."""
STUDENT_PREFIX = "distiller.student."


def frozen_student_keys(student: nn.Module) -> frozenset[str]:
    """The module state-dict keys of ``student``'s frozen parameters (a tied one under each of
    its names): what a LoRA student's checkpoint leaves out."""
    named = student.named_parameters(remove_duplicate=False)
    return frozenset(STUDENT_PREFIX + name for name, p in named if not p.requires_grad)


def is_rebuilt(key: str, student_keys: frozenset[str] = frozenset()) -> bool:
    """Whether ``key`` is rebuilt on load rather than read from a checkpoint: the teacher's
    weights (from ``teacher.path``, or ``teacher.config`` and its seed) and ``student_keys`` (a
    LoRA student's frozen base, copied from the teacher or loaded from ``student.path`` again)."""
    return key.startswith(TEACHER_PREFIX) or key in student_keys


def drop_rebuilt(state: dict[str, Any], student_keys: frozenset[str] = frozenset()) -> None:
    """Remove every key :func:`is_rebuilt` names from a module state dict."""
    for key in [k for k in state if is_rebuilt(k, student_keys)]:
        del state[key]


def check_trainable_keys(
    saved: dict[str, Any],
    own: dict[str, Any],
    student_keys: frozenset[str] = frozenset(),
    changes: list[str] = (),
) -> None:
    """Refuse a checkpoint that lacks any weight of ``own`` but those rebuilt on load, naming
    the student settings that differ from the checkpoint's (``changes``) where known."""
    missing = [k for k in own if not is_rebuilt(k, student_keys) and k not in saved]
    which = "; ".join(changes) if changes else "a different student configuration"
    if missing:  # a CheckpointError (exit 2 with its message), not a KeyError traceback
        raise CheckpointError(
            f"checkpoint lacks {len(missing)} student weights (e.g. {missing[:3]}): it was "
            f"saved from another student ({which}). Resume with the checkpoint's student "
            "settings, or start a new run"
        )
    resized = [k for k in own if k in saved and saved[k].shape != own[k].shape]
    # A LoRA adapter's scale (alpha / r) and dropout live in no weight: the same keys and
    # shapes would resume at another scale, the student jumping mid-run.
    lora = [change for change in changes if change.startswith("student.lora")]
    if resized or lora:
        shown = f"{resized[0]}: checkpoint {tuple(saved[resized[0]].shape)}" if resized else ""
        raise CheckpointError(
            f"the checkpoint was saved from another student ({which}{'; ' if shown else ''}"
            f"{shown}). Resume with the checkpoint's student settings, or start a new run"
        )


def spec_changes(saved: Any, hparams: Any) -> list[str]:
    """``student.<key>: checkpoint …, this run …`` for each student setting (the module's
    ``hparams["student"]``) that differs from the checkpoint's ``saved`` one."""
    now = hparams.get("student") if hasattr(hparams, "get") else None
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return []
    found = []
    for key in sorted(set(saved) | set(now)):
        then, value = saved.get(key), now.get(key)
        if key == "lora" and isinstance(then, dict) and isinstance(value, dict):
            found += lora_changes(then, value)
        elif then != value:
            found.append(f"student.{key}: checkpoint {then!r}, this run {value!r}")
    return found


def lora_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``student.lora.<key>: ...`` for each setting of the adapters that differs, a key left out
    read as its default (``{r: 4}`` and ``{r: 4, alpha: 32}`` build the same adapters)."""
    defaults = {field.name: field.default for field in dataclasses.fields(LoraSpec)}

    def resolved(given: dict[str, Any]) -> dict[str, Any]:
        values = defaults | given
        targets = values.get("target_modules")
        return values | (
            {"target_modules": list(targets)} if isinstance(targets, list | tuple) else {}
        )

    then, value = resolved(saved), resolved(now)
    return [
        f"student.lora.{key}: checkpoint {then.get(key)!r}, this run {value.get(key)!r}"
        for key in sorted(set(then) | set(value))
        if then.get(key) != value.get(key)
    ]


def trained_set_error(checkpoint: dict[str, Any], trainer, module, where: str) -> str | None:
    """Why ``checkpoint``'s optimizer state cannot go on for ``module``'s trained parameters
    (None: it can, or it holds none, or ``trainer``'s strategy keeps it by name: FSDP). A
    checkpoint saved before the provenance record named the trained set is judged by its
    optimizer alone: torch's own error was a ``ValueError`` traceback about a group's size."""
    strategy = trainer.strategy  # DeepSpeed restores its optimizer itself
    if not isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
        return None
    if not strategy.lightning_restore_optimizer:
        return None
    trainable = len(list(module.distiller.trainable_parameters()))
    states = checkpoint.get("optimizer_states") or []
    groups = states[0].get("param_groups", []) if states and isinstance(states[0], dict) else []
    saved = sum(len(group.get("params", [])) for group in groups)
    if not groups or saved == trainable:
        return None
    return (
        f"{where}'s optimizer holds the state of {saved} parameter tensors, and this run trains "
        f"{trainable}: the student trains another set of parameters than it did "
        "(student.freeze_layers, student.freeze_embeddings or the feature projectors changed); "
        "resume with the checkpoint's settings, or change the trained set on purpose with "
        "resume_reset_optimizer=true (a fresh optimizer)"
    )
