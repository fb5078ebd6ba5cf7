"""``lightning-kd evaluate``: perplexity and bits per byte of saved models on text files, their
answers to held-out prompts judged by a teacher, or lm-eval's tasks.

    lightning-kd evaluate --files heldout.jsonl -- smollm2 runs/kd/student runs/ce/student
    lightning-kd evaluate --prompts prompts.jsonl --teacher smollm2 -- runs/kd/student
    lightning-kd evaluate --lm-eval kd_heldout --teacher smollm2 -- runs/kd/student

Each model (a ``save_pretrained`` directory, a Hugging Face id, ``smollm2`` or ``gemma3_270m`` for
a packaged teacher, or a ``.gguf`` file such as an export's) scores the same text: the files are
read as ``data.files`` reads them, each document tokenized with the model's own tokenizer (after
the BOS it adds, else an EOS; closed by an EOS) and scored whole, in windows of ``--block-size``
tokens. Bits per byte (the NLL in bits over the text's UTF-8 bytes) compares every model;
perplexity only models of the same tokenizer (the ``tokenizer`` column;
``evaluation/perplexity.py``). ``--prompts`` judges answers instead: each model's greedy
completions of chat prompts, scored by ``--teacher`` (its NLL of them, ROUGE-L to its own, the
model's perplexity on its own). ``--lm-eval`` runs lm-eval's tasks (its names, comma-separated; the
package's held-out ``kd_heldout``; those of ``--lm-eval-include`` directories) on each model,
``--teacher`` first for the ratio (``pip install 'lightning-kd[eval]'``). Prints a markdown table
and, with ``--out``, writes it as JSON. An option that has no effect in the mode chosen
(``--block-size`` with ``--prompts``, ``--seed`` without ``--samples``, ...) is refused, not
ignored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from lightning_kd.cli.formatting import HelpFormatter
from lightning_kd.utils import starting
from lightning_kd.utils.refusal import refuse


class Parser(argparse.ArgumentParser):
    """argparse's, saying why the models went missing where ``--files`` took them."""

    given: tuple[str, ...] = ()
    """The arguments being parsed: only where --files is among them can it have taken the
    models (with none given, the hint misled)."""

    def parse_args(self, args=None, namespace=None):
        self.given = tuple(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if "required: models" in message and "--files" in self.given:
            message += (
                " (--files takes every path after it: give the models first, or put -- before "
                "them: lightning-kd evaluate --files a.txt -- runs/kd/student)"
            )
        super().error(message)


MODELS = "model directories, HF ids, smollm2, gemma3_270m or .gguf files"
MODES = ("--files", "--prompts", "--lm-eval")
USED_WITH = {
    "--teacher": ("--prompts", "--lm-eval"),
    "--max-new-tokens": ("--prompts",),
    "--samples": ("--prompts",),
    "--text-field": ("--files",),
    "--block-size": ("--files",),
    "--lm-eval-include": ("--lm-eval",),
    "--lm-eval-limit": ("--lm-eval",),
    "--device": ("--lm-eval",),
}
"""The options that act in some modes alone (``--batch-size`` and ``--out`` act in every one)."""
SAMPLING = ("--temperature", "--seed")
"""The options of ``--samples`` alone: greedy answers draw nothing at random."""
HINTS = {"--teacher": " (list it among the models to score it with --files)"}
DEFAULTS = {
    "max_new_tokens": 256,
    "temperature": 1.0,
    "seed": 0,
    "text_field": "text",
    "block_size": 256,
    "lm_eval_include": [],
}
"""The options' defaults, filled in once they are checked: the parser leaves them ``None``, so
that one given where it has no effect is told apart from one left out."""


def parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="lightning-kd evaluate",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("models", nargs="+", help=MODELS)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--files", nargs="+", help="text as data.files takes it: perplexity, bits per byte"
    )
    source.add_argument("--prompts", type=Path, help="prompt rows: answers judged by --teacher")
    source.add_argument("--lm-eval", metavar="TASKS", help="lm-eval tasks, comma-separated")
    judge = "with --prompts: the judge; with --lm-eval: scored too, for the ratio (e.g. smollm2)"
    parser.add_argument("--teacher", help=judge)
    add_lm_eval_options(parser)
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run a model's own code (a custom architecture's config.json auto_map), as "
        "teacher.trust_remote_code does for train; read it first",
    )
    add_answer_options(parser)
    parser.add_argument(
        "--text-field",
        help=f"with --files: the key of .jsonl rows' text (default: {DEFAULTS['text_field']})",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        help=f"with --files: the longest window scored (default: {DEFAULTS['block_size']})",
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="with every mode: the rows scored at once"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="write the rows as JSON to this file (its missing directories are created)",
    )
    return parser


def add_lm_eval_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``--lm-eval``: tasks of your own, a limit, the device."""
    parser.add_argument(
        "--lm-eval-include",
        action="append",
        metavar="DIR",
        help="with --lm-eval: a directory of task YAMLs of your own (repeatable)",
    )
    parser.add_argument(
        "--lm-eval-limit",
        type=int,
        metavar="N",
        help="with --lm-eval: the first N examples of each task only (a glance)",
    )
    parser.add_argument("--device", help="with --lm-eval: where the models run (cpu, cuda)")


def add_answer_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``--prompts``' answers: their length, and their sampling."""
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        help=f"with --prompts: the answers' length (default: {DEFAULTS['max_new_tokens']})",
    )
    parser.add_argument(
        "--samples", type=int, help="with --prompts: also K sampled completions per prompt"
    )
    sampled = "with --samples: the sampled completions' {} (default: {})"
    parser.add_argument(
        "--temperature", type=float, help=sampled.format("temperature", DEFAULTS["temperature"])
    )
    parser.add_argument("--seed", type=int, help=sampled.format("seed", DEFAULTS["seed"]))


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Score the models ``argv`` names; returns the table's rows."""
    options = parser()
    args = options.parse_args(argv)
    if args.prompts is not None and args.teacher is None:
        options.error("--prompts needs --teacher: the model that judges the answers (e.g. smollm2)")
    refuse(unused_option_errors(args))
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    # Imported once the arguments parse: `--help` and a mistyped option answer at once, not
    # after torch, transformers and Lightning have loaded (seconds).
    from lightning_kd.launch.evaluate import evaluate

    starting.end()  # imported: a Ctrl+C is a KeyboardInterrupt again (utils/starting.py)
    return evaluate(args)


def unused_option_errors(args: argparse.Namespace) -> list[str]:
    """Each option given that has no effect in the mode chosen (``--files``, ``--prompts``,
    ``--lm-eval``), or without ``--samples``: it was ignored without a word."""
    mode = next(mode for mode in MODES if getattr(args, dest(mode)) is not None)
    given = [
        option for option in (*USED_WITH, *SAMPLING) if getattr(args, dest(option)) is not None
    ]
    errors = [
        f"{option} has no effect with {mode}: it goes with {' or '.join(USED_WITH[option])}; "
        f"leave it out{HINTS.get(option, '')}"
        for option in given
        if mode not in USED_WITH.get(option, (mode,))
    ]
    if args.samples is None:  # with --samples but without --prompts: --samples is named
        errors += [
            f"{option} has no effect without --samples: greedy answers draw nothing at random; "
            "add --samples K (with --prompts) or leave it out"
            for option in given
            if option in SAMPLING
        ]
    return errors


def dest(option: str) -> str:
    """The attribute argparse stores ``option`` under (``--max-new-tokens``: max_new_tokens)."""
    return option.removeprefix("--").replace("-", "_")
