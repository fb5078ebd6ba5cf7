"""How long a sequence a model's position embeddings cover, read from its config alone (and that
config, :func:`spec_config`, which the launch's model checks read too).

A sequence past that limit fails deep in the model (GPT-2's learned positions: an embedding
``IndexError``) or, with rotary positions, runs and scores positions the model was never trained
on. Every command compares the lengths it will run at with this limit before any weights load.
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

from lightning_kd.models.batch_positions import POSITION_KEYS, max_positions
from lightning_kd.models.loading import StudentSpec, TeacherSpec
from lightning_kd.models.model_config import config_from
from lightning_kd.models.sources import config_location
from lightning_kd.models.unreadable import readable


def saved_positions(location: str, trust_remote_code: bool = False) -> int | None:
    """The position limit of the model saved at ``location`` (its ``config.json``, no weights);
    a damaged config is named with the fix (``unreadable.py``)."""
    with readable(location, "the model"):
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
    return max_positions(config)


def teacher_positions(spec: TeacherSpec) -> int | None:
    """The position limit of the teacher ``spec`` describes, without building or loading it."""
    config = spec_config(spec)
    return None if config is None else max_positions(config)


def student_positions(student: StudentSpec) -> int | None:
    """The position limit of the student ``student`` describes where it is its own: a saved
    student's, another model's whose layers it copies (``student.source``), or one its
    ``student.config`` sets; None where it is the teacher's (checked as the teacher's)."""
    if student.path is not None:
        return saved_positions(student.path, student.trust_remote_code)
    if student.source is not None:
        return teacher_positions(TeacherSpec(path=student.source))
    overrides = student.config or {}
    return next((overrides[key] for key in POSITION_KEYS if key in overrides), None)


def spec_config(spec: TeacherSpec) -> PretrainedConfig | None:
    """The config of the model ``spec`` describes (its ``config.json``, or ``teacher.config``
    built), no weights; None for a ``teacher.config`` that does not build (the launch's model
    checks name why)."""
    if spec.config is None:
        location, gguf = config_location(spec.path, spec.gguf_file)
        return AutoConfig.from_pretrained(
            location, trust_remote_code=spec.trust_remote_code, **gguf
        )
    return config_from(spec.config, None, "teacher.config")[0]


def position_error(key: str, length: int, limit: int | None, whose: str) -> str | None:
    """The message refusing ``key``'s ``length`` tokens beyond ``whose`` ``limit`` positions
    (None when it fits, or when the model states no limit)."""
    if limit is None or length <= limit:
        return None
    fix = f"{key}={limit} or less"
    if key.endswith("max_new_tokens"):  # after a prompt: "8192 or less" was no way on (probe 36)
        fix = f"{key} below {limit}, leaving room for the prompts"
    return (
        f"{key}={length} is longer than {whose}'s {limit} positions (config "
        f"max_position_embeddings); set {fix}"
    )


def room_error(
    key: str, new_tokens: int, prompt_lengths: list[int], limit: int | None, whose: str
) -> str | None:
    """The message refusing ``key``'s ``new_tokens`` after the longest prompt (of
    ``prompt_lengths`` tokens) beyond ``whose`` ``limit`` positions (None when all fit)."""
    if limit is None or not prompt_lengths:
        return None
    longest = max(prompt_lengths)
    if longest + new_tokens <= limit:
        return None
    over = sum(length + new_tokens > limit for length in prompt_lengths)
    if longest >= limit:  # no new token fits: the prompts, not the key, must change
        full = sum(length >= limit for length in prompt_lengths)
        return (
            f"the longest prompt ({longest} tokens) leaves no room in {whose}'s {limit} "
            f"positions (config max_position_embeddings) for a new token: {full} of "
            f"{len(prompt_lengths)} prompts are {limit} tokens or longer; shorten them or "
            f"leave them out (at most {limit - 1} tokens, fewer by {key})"
        )
    return (
        f"{key}={new_tokens} after the longest prompt ({longest} tokens; {over} of "
        f"{len(prompt_lengths)} prompts run past) is longer than {whose}'s {limit} positions "
        f"(config max_position_embeddings); set {key}={limit - longest} or less, or "
        "shorten the prompts"
    )
