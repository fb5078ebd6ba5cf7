"""Answers to a file of held-out prompts, judged by a teacher: the library half of
``lightning-kd evaluate --prompts FILE --teacher NAME -- MODEL...``."""

from __future__ import annotations

from pathlib import Path

from lightning_kd.data.chat_tokens import prompt_ids
from lightning_kd.data.conversations import ChatFields
from lightning_kd.evaluation.prompts import Sampling, evaluate_prompts
from lightning_kd.evaluation.saved_models import load_model, load_tokenizer, model_location
from lightning_kd.generation.teacher_completions import read_prompts
from lightning_kd.models.positions import room_error, saved_positions
from lightning_kd.utils.refusal import refuse


def judge_prompts(
    models: list[str],
    teacher: str,
    prompts: list[list[dict]],
    max_new_tokens: int,
    batch_size: int,
    sampling: Sampling | None = None,
    trust: bool = False,
) -> list[dict]:
    """Rows of scores for ``teacher`` and each of ``models`` on ``prompts`` (every model must
    share the teacher's tokenizer, which needs a chat template)."""
    tokenizer = load_tokenizer(teacher, trust)
    if tokenizer.chat_template is None:  # the prompts are conversations, put as it was taught
        refuse(
            [
                f"--teacher {teacher}'s tokenizer has no chat template, so the prompts cannot be "
                "put to it as conversations: judge with an instruction-tuned model (smollm2), "
                "or score text with --files"
            ]
        )
    check_room(
        [*models, teacher], [len(ids) for ids in prompt_ids(tokenizer, prompts)], max_new_tokens
    )
    judge = f"the teacher ({teacher})"
    loaded = {name: load_model(name, tokenizer, judge, trust) for name in models}
    teacher_model = load_model(teacher, trust=trust)
    return evaluate_prompts(
        loaded, teacher_model, tokenizer, prompts, max_new_tokens, batch_size, sampling
    )


def check_room(names: list[str], prompt_lengths: list[int], max_new_tokens: int) -> None:
    """Refuse, before any model loads, answers that would run past a model's positions: every
    model answers each prompt, and the teacher scores every answer."""
    errors = [
        room_error("--max-new-tokens", max_new_tokens, prompt_lengths, limit, name)
        for name in names
        if (limit := saved_positions(model_location(name))) is not None
    ]
    refuse([error for error in errors if error is not None])


def read_prompt_file(path: Path) -> list[list[dict]]:
    """The prompts of a file of prompt rows (as ``lightning-kd generate`` reads them)."""
    if not path.is_file():
        raise FileNotFoundError(f"--prompts {path} is not a file; give a .jsonl of prompt rows")
    prompts = [messages for _, messages in read_prompts(path, ChatFields())]
    if not prompts:
        raise ValueError(f"--prompts {path} holds no prompt rows")
    return prompts
