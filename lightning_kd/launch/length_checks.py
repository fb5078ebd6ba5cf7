"""How long a run trains and when it validates: settings whose values each pass their own rule
(``checks.RULES``) and still make no run together."""

from __future__ import annotations

from collections.abc import Mapping

from lightning_kd.launch.rules import ABSENT, lookup


def run_length_errors(cfg: Mapping) -> list[str]:
    """Every problem of ``cfg``'s run length and validation interval."""
    return end_errors(cfg) + validation_interval_errors(cfg)


UNBOUNDED = (-1, None)
"""``trainer.max_steps``/``max_epochs`` values that set no end."""


def end_errors(cfg: Mapping) -> list[str]:
    """``trainer.max_steps=-1`` trains by epochs, and Lightning's default without
    ``trainer.max_epochs`` is 1,000 of them: a smoke run was at step 5,247 after ten minutes,
    validating every epoch, its cosine schedule stretched over the whole 1,000."""
    steps, epochs = lookup(cfg, "trainer.max_steps"), lookup(cfg, "trainer.max_epochs")
    if steps not in UNBOUNDED or epochs not in UNBOUNDED:
        return []
    never = "1,000 epochs" if epochs is None else "without end"
    return [
        f"trainer.max_steps={steps} and trainer.max_epochs={'null' if epochs is None else epochs} "
        f"set no end to the run (Lightning would train {never}); give trainer.max_steps "
        "(e.g. 140) or trainer.max_epochs (e.g. 1)"
    ]


def validation_interval_errors(cfg: Mapping) -> list[str]:
    """A fraction of an epoch needs epochs: Lightning's own error named a setting, never made,
    that the trainer config sets (``check_val_every_n_epoch=None``: runs count steps)."""
    interval = lookup(cfg, "trainer.val_check_interval")
    by_epoch = lookup(cfg, "trainer.check_val_every_n_epoch") not in (None, ABSENT)
    if not isinstance(interval, float) or by_epoch:
        return []
    return [
        f"trainer.val_check_interval={interval} is a fraction of an epoch, and runs count steps "
        "(trainer.check_val_every_n_epoch=null); give a step count, e.g. "
        "trainer.val_check_interval=50, or train by epochs (trainer.max_steps=-1 "
        "trainer.max_epochs=N: each epoch is then validated, or a fraction of it)"
    ]


def early_stopping_note(cfg: Mapping) -> str | None:
    """Where ``+callbacks=early_stopping`` can never stop the run: its patience needs that many
    validations after the first in training, and ``trainer.max_steps`` over
    ``trainer.val_check_interval`` gives fewer. It ran without a word (probe 47)."""
    patience = lookup(cfg, "callbacks.early_stopping.patience")
    steps, interval = lookup(cfg, "trainer.max_steps"), lookup(cfg, "trainer.val_check_interval")
    numbers = (patience, steps, interval)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
        return None  # not set, or by epochs: Lightning's to count
    checks = steps // interval
    if checks > patience:
        return None
    every = max(1, steps // (patience + 2))
    return (
        f"callbacks.early_stopping (patience={patience}) can never stop this run: it validates "
        f"{checks} time(s) in training (trainer.max_steps={steps}, "
        f"trainer.val_check_interval={interval}), and stopping takes {patience + 1}; validate "
        f"more often (e.g. trainer.val_check_interval={every}) or lower the patience"
    )
