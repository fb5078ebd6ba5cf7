"""The library half of ``lightning-kd evaluate``: its inputs checked before any model loads,
then the scores of ``--files``, ``--prompts`` or ``--lm-eval``, printed and written to ``--out``.

Everything that can be known before the weights load is checked in one refusal: each number and
sequence length against each model's positions, each model (a run that has not saved its student
named with the command that finishes it), what ``--files`` or ``--prompts`` hold, ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoConfig

from lightning_kd.evaluation.harness import (
    Harness,
    device_errors,
    score_models,
    task_errors,
    task_names,
)
from lightning_kd.evaluation.harness import markdown as harness_markdown
from lightning_kd.evaluation.judge import judge_prompts, read_prompt_file
from lightning_kd.evaluation.perplexity import documents_of, score_documents
from lightning_kd.evaluation.prompts import Sampling
from lightning_kd.evaluation.prompts import markdown as prompts_markdown
from lightning_kd.evaluation.saved_models import load_tokenizer, model_location
from lightning_kd.evaluation.score_table import markdown
from lightning_kd.launch.entry import Length, check_entry
from lightning_kd.launch.paths import out_file_errors
from lightning_kd.launch.unfinished import unfinished_run_error
from lightning_kd.models.positions import saved_positions
from lightning_kd.models.unreadable import own_code_type, saved_model_errors
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.refusal import first_line


def evaluate(args: argparse.Namespace) -> list[dict]:
    """What the command line ``args`` asks for (parsed by ``cli/evaluate.py``); its rows."""
    if args.lm_eval is not None:
        return lm_eval(args)
    read = check(args)
    if args.prompts is not None:
        return prompts(args, read)
    trust = args.trust_remote_code
    rows = score_documents(args.models, read, args.block_size, args.batch_size, trust)
    print("\n" + markdown(rows))
    if args.out is not None:
        write_rows(args.out, {"files": args.files, "block_size": args.block_size, "rows": rows})
    return rows


def check(args: argparse.Namespace) -> list:
    """Every number the evaluation uses, its sequence length (``--block-size`` for text,
    ``--max-new-tokens`` after each prompt) against each model's positions, each model, what
    ``--files`` or ``--prompts`` hold, and ``--out`` (a file path, not a directory), before any
    model loads; returns the documents or prompts it read."""
    if args.prompts is None:
        key, tokens, names = "--block-size", args.block_size, args.models
        numbers = {"--batch-size": args.batch_size, key: tokens}
    else:
        key, tokens = "--max-new-tokens", args.max_new_tokens
        names = [*args.models, args.teacher]
        numbers = {"--batch-size": args.batch_size, key: tokens}
        if args.samples is not None:  # left out: greedy answers only
            numbers |= {"--samples": args.samples, "--temperature": args.temperature}
            numbers["--seed"] = args.seed
    keys = {name: "model" for name in args.models} | (
        {} if args.prompts is None else {args.teacher: "--teacher"}
    )
    limits = {
        name: lambda name=name: saved_positions(
            model_location(name, keys[name]), args.trust_remote_code
        )
        for name in names
        # An empty one, a run that has not saved its student, or one of code of its own
        # without --trust-remote-code, is named alone (model_errors).
        if name.strip()
        and unfinished_run_error(Path(name), keys[name]) is None
        and (args.trust_remote_code or not runs_own_code(name))
    }
    read, read_errors = read_inputs(args)
    judge = None if args.prompts is None else args.teacher
    extra = out_file_errors("--out", args.out, ours=is_record) + read_errors
    extra += model_errors(args.models, judge, args.trust_remote_code)  # where they are saved
    if judge is not None and not extra:
        extra += judge_tokenizer_errors(args.models, judge, args.trust_remote_code)
    lengths = [Length(key, tokens, limits)]
    check_entry(command="evaluate", options=numbers, lengths=lengths, extra=extra)
    return read


def read_inputs(args: argparse.Namespace) -> tuple[list, list[str]]:
    """The prompt rows of ``--prompts``, or the documents of ``--files`` (each a .txt/.jsonl
    file, each pattern matching one, each record holding ``--text-field``'s text, some text in
    all), read once, and why they cannot be."""
    try:
        if args.prompts is not None:
            return read_prompt_file(args.prompts), []
        return documents_of(args.files, args.text_field), []
    except (OSError, ValueError) as error:
        return [], [str(error)]


def is_record(path: Path) -> bool:
    """Whether ``path`` holds what :func:`write_rows` writes (an earlier ``--out``, which a new
    one may replace): a JSON object with its ``rows``."""
    try:
        found = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and "rows" in found


def write_rows(out: Path, record: dict) -> None:
    """``record`` as JSON at ``out``, its directory created if missing, written whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, json.dumps(record, indent=2).encode())


def prompts(args: argparse.Namespace, rows_read: list[list[dict]]) -> list[dict]:
    """``--prompts`` (``rows_read``: its prompts): each model's greedy answers judged by
    ``--teacher``."""
    sampling = None
    if args.samples is not None:
        sampling = Sampling(args.samples, args.temperature, args.seed)
    rows = judge_prompts(
        args.models,
        args.teacher,
        rows_read,
        args.max_new_tokens,
        args.batch_size,
        sampling,
        args.trust_remote_code,
    )
    print("\n" + prompts_markdown(rows))
    if args.out is not None:
        write_rows(args.out, prompts_settings(args) | {"rows": rows})
    return rows


def prompts_settings(args: argparse.Namespace) -> dict:
    """What ``--prompts``' numbers depend on, recorded beside them in ``--out``: the judge, the
    answers' cap (``tokens``, ``ended``), and the sampling (greedy where ``samples`` is null;
    the draws of a batch come from one random stream, so its size changes them)."""
    settings = {
        "prompts": str(args.prompts),
        "teacher": args.teacher,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "samples": args.samples,
    }
    if args.samples is not None:
        settings |= {"temperature": args.temperature, "seed": args.seed}
    return settings


def lm_eval(args: argparse.Namespace) -> list[dict]:
    """``--lm-eval``: lm-eval's tasks on each model (the teacher's row first, for the ratio)."""
    harness = Harness(
        tasks=task_names(args.lm_eval),
        include=tuple(args.lm_eval_include),
        batch_size=args.batch_size,
        device=args.device or "cpu",
        limit=args.lm_eval_limit,
        trust_remote_code=args.trust_remote_code,
    )
    numbers = {"--batch-size": args.batch_size}
    if args.lm_eval_limit is not None:  # left out: every example
        numbers["--lm-eval-limit"] = args.lm_eval_limit
    check_entry(
        command="evaluate",
        options=numbers,
        extra=out_file_errors("--out", args.out, ours=is_record)
        + model_errors(args.models, args.teacher, args.trust_remote_code)
        + hub_model_errors(
            [*args.models, *([args.teacher] if args.teacher else [])], args.trust_remote_code
        )
        + task_errors(harness.tasks, harness.include, "--lm-eval", "--lm-eval-include")
        + device_errors(harness.device, "--device"),
    )
    rows = score_models(args.models, harness, args.teacher)
    print("\n" + harness_markdown(rows))
    if args.out is not None:
        write_rows(args.out, {"lm_eval": list(harness.tasks), "rows": rows})
    return rows


def model_errors(models: list[str], teacher: str | None, trust: bool = False) -> list[str]:
    """Each model (and ``--teacher``) that is neither a directory of a saved model, a Hugging
    Face id nor a packaged teacher, before any loads; or one of code of its own, without
    ``trust`` (``--trust-remote-code``)."""
    judge = [] if teacher is None else [(teacher, "--teacher")]  # "" too: it is refused
    errors = []
    for name, key in [(name, "model") for name in models] + judge:
        if not name.strip():  # Path("") is the working directory: not what was meant
            errors.append(
                f"{key} is empty: name a model (a save_pretrained directory, a "
                "Hugging Face id, smollm2)"
            )
            continue
        unfinished = unfinished_run_error(Path(name), key)
        if unfinished is not None:  # a run stopped before it saved student/
            errors.append(unfinished)
            continue
        try:
            location = Path(model_location(name, key))
        except (OSError, ValueError) as error:
            errors.append(str(error))
            continue
        if location.is_dir():  # a hub id is for from_pretrained to find
            errors += saved_model_errors(location, key, tokenizer=True)
            errors += [] if trust else custom_code_errors(location, key)
    return errors


def runs_own_code(name: str) -> bool:
    """Whether the saved model ``name`` is of code of its own (config.json's ``auto_map``)."""
    try:
        return own_code_type(Path(model_location(name))) is not None
    except (OSError, ValueError):  # no such model: model_errors names it
        return False


def custom_code_errors(directory: Path, key: str) -> list[str]:
    """A saved model of code of its own: transformers' refusal told the user to pass
    ``trust_remote_code=True``, which the command could not (probe 45)."""
    if not runs_own_code(str(directory)):
        return []
    return [
        f"{key} {directory} runs code of its own (its config.json's auto_map): pass "
        "--trust-remote-code to run it, having read it"
    ]


def hub_model_errors(names: list[str], trust: bool = False) -> list[str]:
    """Each model named by a Hugging Face id whose config cannot be had here (no network and
    not in the cache, no such id): lm-eval met it only when it loaded the model, a traceback
    after the teacher's whole pass (``--files`` reads each config for its positions first)."""
    errors = []
    for name in names:
        try:
            location = model_location(name)
        except (OSError, ValueError):
            continue  # model_errors names it
        if not name.strip() or Path(location).is_dir():
            continue
        try:
            AutoConfig.from_pretrained(location, trust_remote_code=trust)
        except (OSError, ValueError) as error:
            errors.append(f"model {name}: {first_line(error)}")
    return errors


def judge_tokenizer_errors(models: list[str], judge: str, trust: bool = False) -> list[str]:
    """A model ``--prompts`` cannot judge: ``--teacher`` scores its answers' tokens, so each
    model must share its tokenizer (found here, before any weights load)."""
    vocabulary = load_tokenizer(judge, trust).get_vocab()
    return [
        f"model {name} has another tokenizer than --teacher {judge}: --prompts scores each "
        "answer's tokens by the teacher; give models of its tokenizer, or compare across "
        "tokenizers with --files (bits per byte)"
        for name in models
        if load_tokenizer(name, trust).get_vocab() != vocabulary
    ]
