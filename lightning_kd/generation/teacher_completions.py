"""The teacher's completions for sequence-level KD (the library half of ``lightning-kd generate``).

    lightning-kd generate generate.prompts=prompts.jsonl hydra.run.dir=gen
    lightning-kd train data=chat 'data.files=[gen/completions.jsonl]'      # train on them
    lightning-kd generate experiment=instruct generate.prompts=train_split \
        hydra.run.dir=runs/instruct_teacher          # then experiment=instruct_seqkd

Sequence-level KD (Kim & Rush, 2016) trains the student on the teacher's own outputs. This writes
them: each prompt row (``prompt`` as a string or messages, or ``messages`` whose trailing assistant
turn, if any, is dropped and answered anew) is rendered with the chat template and the generation
prompt, completed by the teacher (greedy, or sampled with ``generate.temperature`` and
``generate.top_p``; ``generate.max_new_tokens``; batches of ``generate.batch_size``, left-padded,
with the KV cache), and written as a chat row, ``{"messages": [...prompt, {"role": "assistant",
"content": completion}], "prompt_line": n}``, that ``data=chat`` reads back.

``generate.prompts=train_split`` (or ``val_split``) takes the prompts of that split of the config's
``data=chat`` conversations, split as a run splits them: sequence-level KD then trains on the
teacher's answers to the training prompts alone (``data.teacher_answers``), and the held-out
prompts stay held out.

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
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.data.chat_tokens import prompt_ids, template_text
from lightning_kd.data.conversations import ChatFields, as_messages, checked_messages, prompt_of
from lightning_kd.data.reading import read_records
from lightning_kd.generation.completions_record import (
    check_record,
    completions_lock,
    settings_record,
)
from lightning_kd.generation.decoding import generate_in_eval, left_padded
from lightning_kd.utils.refusal import refuse
from lightning_kd.utils.stopping import STOP

OUTPUT_NAME = "completions.jsonl"
SPLITS = {"train_split": "train", "val_split": "val"}
"""``generate.prompts`` values naming a split of the run's ``data=chat`` conversations."""


@dataclass
class GenerateSpec:
    """The ``generate`` config group: what ``lightning-kd generate`` writes."""

    prompts: str | None = None
    """A .jsonl of prompt rows (``prompt``, or ``messages``), or ``train_split`` / ``val_split``:
    the prompts of that split of the config's ``data=chat`` conversations; required."""
    max_new_tokens: int = 256
    """Tokens generated at most per completion (fewer where the teacher ends its turn)."""
    do_sample: bool = False
    """Sample (with ``temperature`` and ``top_p``) instead of greedy decoding."""
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 8
    """Prompts per ``generate`` call."""
    chat_template: str | None = None
    """A Jinja template (string or file) for a tokenizer without one."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError(
                f"generate.max_new_tokens={self.max_new_tokens}, generate.batch_size="
                f"{self.batch_size}: each must be at least 1"
            )
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"generate.temperature={self.temperature} must be positive and generate.top_p="
                f"{self.top_p} in (0, 1]"
            )


def prompt_messages(record: dict, where: str, fields: ChatFields) -> list[dict[str, str]]:
    """The conversation a row asks the teacher to continue (a trailing answer dropped)."""
    if fields.prompt in record:
        messages = as_messages(record[fields.prompt], "user", where)
    elif fields.messages in record:
        messages = record[fields.messages]
    else:
        raise ValueError(
            f"{where} has neither {fields.prompt!r} nor {fields.messages!r}: a prompt row holds "
            "the prompt (a string or messages) under one of them"
        )
    messages = prompt_of(checked_messages(messages, where))
    if not messages:
        raise ValueError(f"{where}: nothing but assistant turns; there is no prompt to answer")
    return messages


def read_prompts(path: Path, fields: ChatFields) -> list[tuple[int, list[dict]]]:
    """``(line, prompt messages)`` of every row of ``path``."""
    if not path.is_file():
        raise FileNotFoundError(f"generate.prompts={str(path)!r} is not a file")
    return [
        (number, prompt_messages(record, f"{path}:{number}", fields))
        for number, record in read_records(path)
    ]


def completed_rows(out: Path, prompts: list[tuple[int, list[dict]]]) -> int:
    """Rows of ``out`` already complete (a torn last line cut off), checked against ``prompts``."""
    if not out.is_file():
        return 0
    data = out.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(out, "r+b") as handle:  # a row half-written when the last run stopped
            handle.truncate(len(whole))
    rows = [json.loads(line) for line in whole.decode("utf-8").splitlines()]
    for index, row in enumerate(rows):
        line, messages = prompts[index] if index < len(prompts) else (None, None)
        if row.get("prompt_line") != line or row["messages"][:-1] != messages:
            raise ValueError(
                f"{out} row {index + 1} answers another prompt than {line and f'line {line}'} of "
                "generate.prompts: write into a new hydra.run.dir, or set overwrite=true"
            )
    return len(rows)


def complete(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[dict]],
    spec: GenerateSpec,
    seed: int,
) -> list[str]:
    """The teacher's completions of ``prompts`` (one batch, left-padded, sampled from ``seed``)."""
    left = left_padded(prompt_ids(tokenizer, prompts), tokenizer.pad_token_id, teacher.device)
    torch.manual_seed(seed)
    sampling = {"temperature": spec.temperature, "top_p": spec.top_p} if spec.do_sample else {}
    new = generate_in_eval(
        teacher,
        left,
        max_new_tokens=spec.max_new_tokens,
        do_sample=spec.do_sample,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    return tokenizer.batch_decode(new, skip_special_tokens=True)


def write_completions(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[tuple[int | str, list[dict]]],
    spec: GenerateSpec,
    out: Path,
    seed: int,
    overwrite: bool = False,
    teacher_source: dict[str, Any] | None = None,
) -> Path:
    """Write (or finish writing) ``out`` with the teacher's answers to ``prompts`` (``(where,
    messages)`` pairs), batch ``i`` sampled from ``seed + i``; ``teacher_source`` says where the
    teacher was loaded from (its ``path``, ``gguf_file``), recorded with the settings
    (``completions_record.py``). A resume with other settings, or while another process writes
    ``out``, is refused."""
    out.parent.mkdir(parents=True, exist_ok=True)
    record = settings_record(teacher, tokenizer, asdict(spec), seed, teacher_source or {})
    with completions_lock(out):
        if overwrite and out.exists():
            out.unlink()
        check_record(out, record)
        done = completed_rows(out, prompts)
        append_completions(teacher, tokenizer, prompts, spec, out, seed, done)
    return out


def append_completions(
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[tuple[int | str, list[dict]]],
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
            for offset, ((line, messages), answer) in enumerate(zip(batch, answers, strict=True)):
                if start + offset < done:
                    continue  # written before the run stopped, mid-batch
                answered = [*messages, {"role": "assistant", "content": answer}]
                handle.write(json.dumps({"messages": answered, "prompt_line": line}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(len(batch) - max(0, done - start))


def use_chat_template(tokenizer: PreTrainedTokenizerBase, spec: GenerateSpec) -> None:
    """Give ``tokenizer`` ``generate.chat_template`` if set; refuse one without a template."""
    if spec.chat_template is not None:
        tokenizer.chat_template = template_text(spec.chat_template, "generate.chat_template")
    if tokenizer.chat_template is None:
        # Refused, not raised: the tokenizer loads in a second, and this is the user's to set.
        refuse(
            [
                "generate.chat_template=null: the teacher's tokenizer has no chat template to "
                "render the prompts with; set generate.chat_template to a file holding a Jinja "
                "template or the template itself, e.g. generate.chat_template=template.jinja"
            ]
        )
