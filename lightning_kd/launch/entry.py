"""One validation for every command, run before any model loads.

``train``, ``cache``, ``generate`` and ``importance`` read the composed config; ``evaluate``,
``bench`` and ``soak`` read options of their own; each runs its models at some sequence length.
``export`` brings only its cross-checks (the saved model, the output path).
:func:`check_entry` checks all of it at once — the config by ``checks.py``'s rules, the options by
:data:`OPTIONS` (the same rules: each message names the option, its value, the allowed range and
an example), the length against each model's position limit read from its config alone — and
raises one :class:`~lightning_kd.utils.refusal.Refused` listing every problem, which the commands
print and exit 2 with. A zero block size found here is one line; found by the run, it was a
``ZeroDivisionError`` after the models loaded.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.model_paths import model_path_errors
from lightning_kd.launch.rules import Number, lookup, value_errors
from lightning_kd.launch.teacher_list import config_entries
from lightning_kd.models.loading import TeacherSpec
from lightning_kd.models.packaged import PackageMissing
from lightning_kd.models.positions import position_error, student_positions, teacher_positions
from lightning_kd.utils.refusal import refuse

OPTIONS: dict[str, dict[str, Number]] = {
    "evaluate": {
        "--block-size": Number(low=2, integer=True, example="256"),
        "--batch-size": Number(low=1, integer=True, example="8"),
        "--max-new-tokens": Number(low=1, integer=True, example="256"),
        "--samples": Number(low=1, integer=True, example="4"),
        "--temperature": Number(low=0, low_open=True, example="1.0"),
        "--seed": Number(integer=True, example="0"),
        "--lm-eval-limit": Number(low=1, integer=True, example="100"),
    },
    "bench": {
        "--student-layers": Number(low=1, integer=True, example="6"),
        "--batch": Number(low=1, integer=True, example="4"),
        # Two at least: the sampling scenarios complete each row's second half from its first.
        "--seq": Number(low=2, integer=True, example="256"),
        "--warmup": Number(low=0, integer=True, example="2"),
        "--repeats": Number(low=1, integer=True, example="5"),
        "--loss-repeats": Number(low=1, integer=True, example="3"),
    },
    "soak": {
        # Two steps at least: the baseline (after a step, --warmup >= 1) must precede the end.
        "--steps": Number(low=2, integer=True, example="1000"),
        # At step 0 nothing has run: every buffer the first step allocates read as a leak.
        "--warmup": Number(low=1, integer=True, example="100"),
    },
}
"""Each argparse command's numeric options (by the flag a user types) and what they allow."""


UNREADABLE = (ValueError, OSError, ModuleNotFoundError)
"""Why a model's positions cannot be read: a bad spec, a missing or unreadable model, a package
its settings need (``teacher.quantize`` without torchao)."""


@dataclass(frozen=True)
class Length:
    """A sequence length a command runs models at, and the models that must cover it."""

    key: str
    """The config key or option that sets it (``data.block_size``, ``--block-size``)."""
    tokens: Any
    """Its value (checked as a number first: a bad one is not compared with anything)."""
    models: Mapping[str, Callable[[], int | None]]
    """Whose (``the teacher``, ``runs/kd/student``) → its position limit, read without weights."""

    def errors(self) -> list[str]:
        """One message per model whose positions ``tokens`` goes beyond, or that cannot say."""
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            return []
        errors = []
        for whose, read in self.models.items():
            try:
                limit = read()
            except (*UNREADABLE, InstantiationException) as error:
                # Hydra wraps the spec's own error in one of its own: the cause is the message.
                cause = error.__cause__ if isinstance(error, InstantiationException) else error
                if not isinstance(cause, UNREADABLE):
                    raise
                if not isinstance(cause, PackageMissing):  # check_entry names it, by key
                    errors.append(str(cause))  # reported with the rest, not in their place
                continue
            if error := position_error(self.key, self.tokens, limit, whose):
                errors.append(error)
        return errors


def teacher_length(cfg: Mapping, key: str) -> Length:
    """``cfg``'s value at ``key`` against its teacher's positions (``teacher.config``'s, or the
    saved model's ``config.json``), and each ``teachers`` entry's with a model of its own."""
    models = {
        "the teacher": lambda: teacher_positions(instantiate(cfg["teacher"], _convert_="all"))
    }
    return Length(key, lookup(cfg, key), models | entry_models(cfg))


def student_length(cfg: Mapping, key: str) -> Length:
    """``cfg``'s value at ``key`` against the student's own positions, where it has its own (a
    saved student, another model's layers, ``student.config``'s): refused after the teacher had
    loaded and the trainer was built, not with the rest (probe 52)."""
    models = {
        "the student": lambda: student_positions(instantiate(cfg["student"], _convert_="all"))
    }
    return Length(key, lookup(cfg, key), models)


def entry_models(cfg: Mapping) -> dict[str, Callable[[], int | None]]:
    """Each ``teachers`` entry with a model of its own → its position limit (a block beyond a
    learned-position model's was an IndexError traceback in the first step). Across tokenizers
    the teacher reads the block's text in its own tokens, which the student's count stands
    for here. None where it cannot be read: the entries' and paths' checks name why."""
    entries, _ = config_entries(cfg)  # the problems of the list: named by the config checks
    return {
        f"teachers[{index}] ({entry.name})": functools.partial(entry_positions, entry.spec)
        for index, entry in enumerate(entries)
        if not entry.main
    }


def entry_positions(spec: TeacherSpec) -> int | None:
    """An entry's position limit, or None where its model cannot be read."""
    try:
        return teacher_positions(spec)
    except UNREADABLE:
        return None


def check_entry(
    cfg: Mapping | None = None,
    command: str | None = None,
    options: Mapping[str, Any] | None = None,
    lengths: Sequence[Length] = (),
    extra: Sequence[str] = (),
) -> None:
    """Refuse, all at once, what :func:`entry_errors` finds."""
    refuse(entry_errors(cfg, command, options, lengths, extra))


def entry_errors(
    cfg: Mapping | None = None,
    command: str | None = None,
    options: Mapping[str, Any] | None = None,
    lengths: Sequence[Length] = (),
    extra: Sequence[str] = (),
    paths: Sequence[str] | None = None,
) -> list[str]:
    """Whatever a command would trip on after loading: ``cfg``'s config values and model paths
    (a packaged model's missing packages among them: :class:`Length` leaves those to this
    check; ``paths``: their :func:`model_path_errors`, where the command has them already),
    ``options`` (``command``'s own, by :data:`OPTIONS`), each of ``lengths`` beyond a model's
    positions, and the command's own cross-checks (``extra``)."""
    if paths is None:
        paths = [] if cfg is None else model_path_errors(cfg)
    errors = [] if cfg is None else config_errors(cfg) + list(paths)
    if command is not None:
        errors += value_errors(options or {}, OPTIONS[command])
    errors += [error for error in extra if not named_already(error, errors)]
    if paths:  # the models cannot say their positions either: said once, by the path checks
        return errors  # (a hub id out of reach was transformers' "We couldn't connect" too)
    return errors + [error for length in lengths for error in length.errors()]


def named_already(error: str, named: Sequence[str]) -> bool:
    """Whether ``error`` is one ``named`` says already, by the rule of its value: Hydra's
    wrapping of a group's own failure (``full_key: distill``, a ``TypeError`` of its dataclass)
    on a value of that group (``distill.temperature='hot'``), or a spec's own check of a value
    (``distill.temperature=0; it must be positive``)."""
    if found := re.search(r"full_key: (\S+)", error):
        return any(line.startswith(f"{found.group(1)}.") for line in named)
    return any(line.startswith(f"{key}=") for key in leading_keys(error) for line in named)


def leading_keys(error: str) -> list[str]:
    """The keys a message starts by naming: ``distill.beta=1.5 ...`` names ``distill.beta``,
    ``distill.feature_loss / feature_weight: ...`` both of those keys."""
    if found := re.match(r"([\w.]+)=", error):
        return [found.group(1)]
    if found := re.match(r"([\w.]+) / ([\w]+): ", error):
        parent = found.group(1).rpartition(".")[0]
        return [found.group(1), f"{parent}.{found.group(2)}" if parent else found.group(2)]
    return []
