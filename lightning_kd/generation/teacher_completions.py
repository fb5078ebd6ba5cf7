"""The teacher's completions for sequence-level KD (the library half of ``lightning-kd generate``).

    lightning-kd generate generate.prompts=prompts.jsonl hydra.run.dir=gen
    lightning-kd train data=chat 'data.files=[gen/completions.jsonl]'      # train on them
    lightning-kd generate experiment=instruct generate.prompts=train_split \\
        hydra.run.dir=runs/instruct_teacher          # then experiment=instruct_seqkd
    lightning-kd generate generate.prompts=train_split hydra.run.dir=runs/teacher_text
        # data=text: the teacher continues the training documents (then experiment=seqkd_text)

Sequence-level KD (Kim & Rush, 2016) trains the student on the teacher's own outputs. This writes
them: each prompt row (``prompt`` as a string or messages, or ``messages`` whose trailing assistant
turn, if any, is dropped and answered anew) is rendered with the chat template and the generation
prompt, completed by the teacher (greedy, or sampled with ``generate.temperature`` and
``generate.top_p``; ``generate.max_new_tokens``; batches of ``generate.batch_size``, left-padded,
with the KV cache), and written as a chat row, ``{"messages": [...prompt, {"role": "assistant",
"content": completion}], "prompt_line": n}``, that ``data=chat`` reads back (an answer cut off at
``generate.max_new_tokens`` is marked ``"finished": false``: ``completion_rows.py``).

``generate.prompts=train_split`` (or ``val_split``) takes the prompts of that split of the config's
``data=chat`` conversations, split as a run splits them: sequence-level KD then trains on the
teacher's answers to the training prompts alone (``data.teacher_answers``), and the held-out
prompts stay held out. On ``data=text`` (the default), ``train_split`` takes the start of every
training document instead, and each row is text, ``{"text": prefix + continuation,
"prompt_line": "file:line"}`` (``text_continuations.py``). The split is the one a run with the
same data *and student* settings makes (the student's tokenizer cuts its blocks).
``generate.max_prompts`` keeps the first prompts alone (a text split's documents come in a seeded
order, so that is a sample of them).

Resumable: rows are appended and flushed a batch at a time, and a rerun into the same directory
continues after the last complete row (a half-written last row is dropped), checking that the rows
there answer the same prompts. Each batch samples from ``seed + batch index``, so a resumed file
equals an uninterrupted one. A resume with other decoding settings, seed or teacher is refused,
and so is a second writer while one runs (``completions_record.py``): one file, one generation.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteriaList

from lightning_kd.data.chat_formats import from_sharegpt
from lightning_kd.data.chat_tokens import (
    prompt_ids,
    turn_end_id,
)
from lightning_kd.data.conversations import (
    ChatFields,
    as_messages,
    checked_messages,
    checked_prompt,
    shaped_messages,
)
from lightning_kd.data.errors import DataError, MissingData
from lightning_kd.data.reading import read_records
from lightning_kd.generation.completion_rows import Prompt, answer_row, completed_rows
from lightning_kd.generation.completions_record import (
    SPLIT_TOKENIZER,
    check_record,
    completions_lock,
    mark_progress,
    settings_record,
)
from lightning_kd.generation.decoding import generate_in_eval, left_padded, text_stop
from lightning_kd.generation.stop_request import StopRequested
from lightning_kd.generation.text_continuations import continuations, end_tokens, text_prompt_ids
from lightning_kd.models.digests import vocab_digest
from lightning_kd.utils.stopping import STOP

OUTPUT_NAME = "completions.jsonl"
SPLITS = {"train_split": "train", "val_split": "val"}
"""``generate.prompts`` values naming a split of the run's data (``data=text``: ``train_split``)."""


@dataclass
class GenerateSpec:
    """The ``generate`` config group: what ``lightning-kd generate`` writes."""

    prompts: str | None = None
    """A .jsonl of prompt rows (``prompt``, or ``messages``), or ``train_split`` / ``val_split``:
    the prompts of that split of the config's ``data=chat`` conversations, or (``data=text``,
    ``train_split``) the start of each training document; required."""
    prefix_chars: int = 128
    """``data=text`` prompts: each is a training document's first this many characters, cut
    back to the end of a word (characters, so every teacher is given the same prompts)."""
    max_prompts: int | None = None
    """Complete the first this many prompts alone (a text split's in a seeded order); null: all."""
    max_new_tokens: int = 256
    """Tokens generated at most per completion (fewer where the teacher ends its turn)."""
    do_sample: bool = False
    """Sample (with ``temperature`` and ``top_p``) instead of greedy decoding."""
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 8
    """Prompts per ``generate`` call."""
    chat_template: str | None = None
    """Chat prompts: a Jinja template (string or file) for a tokenizer without one, or ``plain``
    (``User: ...`` / ``Assistant:``, for a base model; its answers end at the next ``User:``)."""

    def __post_init__(self) -> None:
        counts = ("max_new_tokens", "batch_size", "prefix_chars", "max_prompts")
        values = {name: getattr(self, name) for name in counts}
        bad = [name for name, value in values.items() if value is not None and value < 1]
        if bad:
            raise ValueError(
                ", ".join(f"generate.{name}={values[name]}" for name in bad)
                + ": must be at least 1 (generate.max_prompts may be null: every prompt)"
            )
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"generate.temperature={self.temperature} must be positive and generate.top_p="
                f"{self.top_p} in (0, 1]"
            )


def prompt_messages(record: dict, where: str, fields: ChatFields) -> list[dict[str, str]]:
    """The conversation a row asks the teacher to continue (a trailing answer dropped)."""
    if fields.prompt in record and fields.messages in record:  # one was ignored without a word
        raise DataError(
            f"{where} has both {fields.prompt!r} and {fields.messages!r}: a prompt row holds "
            "its prompt under one of them (the other would be ignored); remove the other"
        )
    if fields.prompt in record:
        messages = as_messages(record[fields.prompt], "user", where)
    elif fields.messages in record:
        messages = from_sharegpt(record[fields.messages])
    elif (shaped := shaped_messages(record, fields)) is not None:  # as data=chat reads them
        messages = shaped
    else:
        raise DataError(
            f"{where} has neither {fields.prompt!r} nor {fields.messages!r}: a prompt row holds "
            "the prompt (a string or messages) under one of them"
        )
    return checked_prompt(checked_messages(messages, where), where)


def prompts_file_error(path: Path) -> str:
    """Why ``generate.prompts=path`` is refused, when ``path`` is no file."""
    what = "is a directory" if path.is_dir() else "does not exist"
    return (
        f"generate.prompts={str(path)!r} {what}; give a .jsonl file of prompt rows ('prompt' or "
        f"'messages'), or one of {', '.join(SPLITS)} for the run's own data"
    )


def read_prompts(path: Path, fields: ChatFields) -> list[tuple[int, list[dict]]]:
    """``(line, prompt messages)`` of every row of ``path``."""
    if not path.is_file():
        raise MissingData(prompts_file_error(path))
    return [
        (number, prompt_messages(record, f"{path}:{number}", fields))
        for number, record in read_records(path)
    ]


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt]) -> list[torch.Tensor]:
    """What the teacher is asked to continue: each text with the tokenizer's special tokens, or
    each conversation rendered with the chat template and the generation prompt."""
    if prompts and isinstance(prompts[0], str):
        return text_prompt_ids(tokenizer, prompts)
    return prompt_ids(tokenizer, prompts)


def complete(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    spec: GenerateSpec,
    seed: int,
) -> list[tuple[str, bool]]:
    """The teacher's completions of ``prompts`` (one batch, left-padded, sampled from ``seed``):
    the text each continuation adds, or each conversation's answer; and whether the teacher
    ended it (else ``generate.max_new_tokens`` cut it off)."""
    ids = prompt_tokens(tokenizer, prompts)
    left = left_padded(ids, tokenizer.pad_token_id, teacher.device)
    torch.manual_seed(seed)
    options = {"temperature": spec.temperature, "top_p": spec.top_p} if spec.do_sample else {}
    text, in_text = isinstance(prompts[0], str), None
    if text:  # a continuation ends where the teacher ends the text
        options["eos_token_id"] = end_tokens(teacher, tokenizer)
    elif (turn_end := turn_end_id(tokenizer)) is not None:  # the answer ends with its turn
        options["eos_token_id"] = [*end_tokens(teacher, tokenizer), turn_end]
    elif (in_text := text_stop(tokenizer)) is not None:  # plain's: before its next "User:"
        options |= in_text.options()  # a base model's answer runs on into a turn of its own
    new = generate_in_eval(
        teacher,
        left,
        max_new_tokens=spec.max_new_tokens,
        do_sample=spec.do_sample,
        pad_token_id=tokenizer.pad_token_id,
        stopping_criteria=StoppingCriteriaList([StopRequested()]),
        **options,
    )
    ends = options.get("eos_token_id") or end_tokens(teacher, tokenizer)
    ended = torch.isin(new, torch.tensor(ends, device=new.device)).any(dim=1).tolist()
    if text:
        return list(zip(continuations(tokenizer, ids, new, ends), ended, strict=True))
    decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
    if in_text is not None:  # ended where its text shows it did
        ended = [done or in_text.marker in a for a, done in zip(decoded, ended, strict=True)]
        decoded = [answer.split(in_text.marker)[0] for answer in decoded]
        if in_text.keep < len(in_text.marker):  # plain's: "Assistant: " and "\n" are its own
            decoded = [answer.strip() for answer in decoded]
    return list(zip(decoded, ended, strict=True))


def write_completions(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[tuple[int | str, Prompt]],
    spec: GenerateSpec,
    out: Path,
    seed: int,
    overwrite: bool = False,
    teacher_source: dict[str, Any] | None = None,
    split_tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Write (or finish writing) ``out`` with the teacher's answers to ``prompts`` (``(where,
    messages or text)`` pairs), batch ``i`` sampled from ``seed + i``; ``teacher_source`` says
    where the teacher was loaded from (its ``path``, ``gguf_file``), and ``split_tokenizer``
    what cut the data split the prompts are of, recorded with the settings
    (``completions_record.py``). A resume with other settings, or while another process writes
    ``out``, is refused."""
    out.parent.mkdir(parents=True, exist_ok=True)
    record = settings_record(teacher, tokenizer, asdict(spec), seed, teacher_source or {})
    if split_tokenizer is not None:  # another one cuts other prompts: named, not "another prompt"
        record[SPLIT_TOKENIZER] = vocab_digest(split_tokenizer)
    if prompts and isinstance(prompts[0][1], str):
        # A shorter prefix is a start of the longer one: the rows alone would not tell them apart.
        record["generate.prefix_chars"] = spec.prefix_chars
    with completions_lock(out):
        if overwrite and out.exists():
            out.unlink()
        check_record(out, record)
        done = len(completed_rows(out, prompts))
        mark_progress(out, len(prompts), finished=done == len(prompts))
        if done and done == len(prompts):  # a rerun of a finished generation: said, not silent
            print(
                f"all {done} prompts are answered in {out} already: nothing generated "
                "(overwrite=true generates them anew)",
                flush=True,
            )
        append_completions(teacher, tokenizer, prompts, spec, out, seed, done)
        mark_progress(out, len(prompts), finished=True)
    return out


def append_completions(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[tuple[int | str, Prompt]],
    spec: GenerateSpec,
    out: Path,
    seed: int,
    done: int,
) -> None:
    """Append the answers to ``prompts`` after the first ``done`` to ``out``, a batch at a time
    (a batch begun before the run stopped is generated whole again: same seed, same answers)."""
    starts = range(done - done % spec.batch_size, len(prompts), spec.batch_size)
    with open(out, "a", encoding="utf-8") as handle, tqdm(total=len(prompts), initial=done) as bar:
        for start in starts:
            # Between batches: every row written is whole and fsynced; a rerun appends the rest.
            STOP.check("generating", detail=f"{max(start, done)} of {len(prompts)} answers kept")
            batch = prompts[start : start + spec.batch_size]
            answers = complete(
                teacher, tokenizer, [m for _, m in batch], spec, seed + start // spec.batch_size
            )
            # Cut at the next token by a stop request: unwritten, generated whole again on rerun.
            STOP.check("generating", detail=f"{max(start, done)} of {len(prompts)} answers kept")
            for offset, ((line, prompt), answer) in enumerate(zip(batch, answers, strict=True)):
                if start + offset < done:
                    continue  # written before the run stopped, mid-batch
                handle.write(json.dumps(answer_row(line, prompt, *answer)) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(len(batch) - max(0, done - start))
