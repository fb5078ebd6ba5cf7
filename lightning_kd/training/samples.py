"""What the student writes, next to the teacher, as training goes: ``+callbacks=samples``.

Every ``every`` optimizer steps (and after the last), the first ``prompts`` validation examples'
prompts — a chat row's turns before its first answer, a text block's first ``text_prompt`` tokens —
are completed greedily by the student and by the teacher (up to ``max_new_tokens``, eval mode, no
graph, outside the step's capture arming), and appended to ``RUN_DIR/samples.csv`` (step, prompt,
student, teacher). A teacher with another tokenizer reads its own tokens of each prompt, as in a
step, and its tokenizer spells its answer. The run's summary (``launch/train.py``) adds the last
step's rows to ``summary.md``. Rank 0 alone generates: no collective runs inside ``generate`` of
the unwrapped models.

A teacher read from its cache (``distill.teacher_cache``) is not run: its column says so, and
so does the run before its first step (the column was left empty, as if it had answered
nothing; probe 55). A resume drops the rows after its checkpoint's step (written again), and a
prompt with ``max_new_tokens`` beyond a model's positions is refused before the first step. A
stop request (SIGTERM, Ctrl+C) ends the completions at the next token, unwritten: the run then
stops as it does after any step.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor, nn
from transformers import StoppingCriteriaList

from lightning_kd.generation.decoding import (
    generate_in_eval,
    left_padded,
    prompt_tokens,
    stop_ids,
    text_stop,
    until_stop,
)
from lightning_kd.generation.stop_request import StopRequested
from lightning_kd.models.batch_positions import max_positions
from lightning_kd.models.positions import room_error
from lightning_kd.utils.atomic import replaced_whole
from lightning_kd.utils.refusal import Refused
from lightning_kd.utils.stopping import STOP

SAMPLES_NAME = "samples.csv"
FIELDS = ("step", "prompt", "student", "teacher")
NOT_RUN = "[not run: the teacher is read from its cache]"
"""The teacher's column where a run reads its cache: its empty cells read as empty answers."""
CACHED_NOTE = (
    "callbacks.samples: the teacher is read from its cache (distill.teacher_cache), not run: "
    "samples.csv has the student's completions alone; distill.teacher_cache=null runs the "
    "teacher online and writes its completions too"
)


class CompletionSamples(L.Callback):
    """Greedy completions of a few held-out prompts by both models, every ``every`` steps."""

    def __init__(
        self, every: int = 50, prompts: int = 3, max_new_tokens: int = 48, text_prompt: int = 32
    ) -> None:
        if every < 1 or prompts < 1 or max_new_tokens < 1 or text_prompt < 1:
            raise ValueError("callbacks.samples: every, prompts, max_new_tokens, text_prompt >= 1")
        self.every, self.count = every, prompts
        self.max_new_tokens, self.text_prompt = max_new_tokens, text_prompt
        self.last_step = -1

    def on_train_start(self, trainer, module) -> None:
        """Before the first step: each prompt has room for ``max_new_tokens`` in both models,
        and a resume's ``samples.csv`` keeps the rows of the steps before its checkpoint."""
        if not trainer.is_global_zero:
            return
        prompts = self.prompts(trainer.datamodule)
        distiller = module.distiller
        readings = {
            "student": prompts,
            "teacher": teacher_reading(distiller, prompts, module.tokenizer)[0],
        }
        for role, read in readings.items():
            model = getattr(distiller, role)
            limit = max_positions(model.config) if model is not None else None
            lengths = [len(prompt) for prompt in read]
            key = "callbacks.samples.max_new_tokens"
            if error := room_error(key, self.max_new_tokens, lengths, limit, f"the {role}"):
                raise Refused(error)
        drop_rows_after(Path(trainer.default_root_dir) / SAMPLES_NAME, trainer.global_step)
        if distiller.teacher is None:
            print(CACHED_NOTE)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step != self.last_step and step % self.every == 0 and step > 0:
            self.write(trainer, module, step)

    def on_train_end(self, trainer, module) -> None:
        if trainer.global_step != self.last_step:
            self.write(trainer, module, trainer.global_step)

    def write(self, trainer, module, step: int) -> None:
        self.last_step = step
        if not trainer.is_global_zero:
            return
        prompts = self.prompts(trainer.datamodule)
        distiller, tokenizer = module.distiller, module.tokenizer
        student = self.complete(distiller.student, prompts, tokenizer)
        teacher = (
            self.complete(distiller.teacher, *teacher_reading(distiller, prompts, tokenizer))
            if distiller.teacher is not None
            else [NOT_RUN] * len(prompts)
        )
        if STOP.requested:  # cut short: the run stops after this step, and a resume writes them
            return
        path = Path(trainer.default_root_dir) / SAMPLES_NAME
        new = not path.exists()
        with open(path, "a", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(FIELDS)
            for prompt, mine, theirs in zip(prompts, student, teacher, strict=True):
                writer.writerow([step, tokenizer.decode(prompt), mine, theirs])

    def prompts(self, datamodule) -> list[Tensor]:
        """The first validation examples' prompts (chat: before the first answer)."""
        batch = datamodule.collate(list(datamodule.val_examples[: self.count]))
        try:
            return prompt_tokens(batch)
        except ValueError:  # text blocks are scored from their first token: cut a prefix
            return [row[: self.text_prompt] for row in batch["input_ids"]]

    def complete(self, model: nn.Module, prompts: list[Tensor], tokenizer) -> list[str]:
        """``model``'s greedy completions of ``prompts``, decoded (its mode restored)."""
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        device = next(model.parameters()).device
        left = left_padded([p.to(device) for p in prompts], pad, device)
        options = {"max_new_tokens": self.max_new_tokens, "do_sample": False, "pad_token_id": pad}
        options["stopping_criteria"] = StoppingCriteriaList([StopRequested()])
        stops = stop_ids(model, tokenizer)  # a chat answer's end of turn too
        in_text = text_stop(tokenizer)  # plain's: the newline before its next "User:"
        options |= in_text.options() if in_text is not None else {}
        new = generate_in_eval(model, left, eos_token_id=list(stops) or None, **options)
        answers = [until_stop(row, stops) for row in new]
        if in_text is not None:
            answers = [in_text.cut(answer) for answer in answers]
        return tokenizer.batch_decode(answers, skip_special_tokens=True)


def teacher_reading(distiller, prompts: list[Tensor], tokenizer) -> tuple[list[Tensor], Any]:
    """``prompts`` as the teacher reads them, and the tokenizer that spells its answers: the
    student's, or for a teacher with another tokenizer, its re-tokenisation of each prompt, as
    in a step (its BOS, its ids for the text; they were the student's ids, read as its own)."""
    if distiller.cross is None:
        return prompts, tokenizer
    aligner = distiller.cross.aligner
    rows = [aligner.view(prompt.cpu().unsqueeze(0)).input_ids[0] for prompt in prompts]
    return rows, aligner.teacher_tokenizer


def drop_rows_after(path: Path, step: int) -> None:
    """Remove the rows of ``path`` written after ``step``: a resume from ``step`` writes them
    again (a fresh run, at step 0, finds no file: ``overwrite=true`` removes it)."""
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    kept = [row for row in rows if int(row["step"]) <= step]
    if len(kept) == len(rows):
        return
    with replaced_whole(path) as temp, open(temp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        writer.writerows(kept)


def samples_markdown(run_dir: Path) -> str:
    """The last step's rows of ``run_dir/samples.csv`` as a markdown table ("" without one)."""
    path = run_dir / SAMPLES_NAME
    if not path.is_file():
        return ""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    last = [row for row in rows if row["step"] == rows[-1]["step"]] if rows else []

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ⏎ ").strip()[:200]

    lines = [f"Completions at step {rows[-1]['step']} (greedy; `{SAMPLES_NAME}` has every step):"]
    lines += ["", "| prompt | student | teacher |", "|---|---|---|"]
    lines += [
        f"| {cell(r['prompt'])} | {cell(r['student'])} | {cell(r['teacher'])} |" for r in last
    ]
    return "\n".join(lines) if last else ""
