"""Every override the docs show composes: the `lightning-kd train|cache|generate ...` (and
`python run.py ...`) commands of the README and of every docs/ page, run.py's docstring, and the
overrides written in the comments of conf/ (each composed with the config it sits in selected,
e.g. strategy=fsdp for a comment in conf/strategy/fsdp.yaml). A command that adds a directory of
the user's own (`--config-dir my_conf experiment=mine`) names configs this repository does not
hold, so it is left out.

Composing is the bar: it catches a key that does not exist, a group option that does not, and a
value Hydra cannot parse. Whether the run then works (a GPU strategy, a file) is for other tests.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from lightning_kd.launch.config import register_defaults
from tests.conftest import ROOT

CONF = ROOT / "conf"
GROUPS = {path.name for path in CONF.iterdir() if path.is_dir()}
PRIMARY = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
DEFAULT_GROUPS = {key for entry in PRIMARY["defaults"] if isinstance(entry, dict) for key in entry}
"""Groups the primary config selects (an option of another group is added with +group=...)."""
ROOTS = GROUPS | set(PRIMARY) - {"defaults"} | {"hydra"}
"""First key of anything a comment may override: a group, a top-level key, Hydra's own."""

# A word=... whose key is a dotted name, optionally +, ++ or ~ prefixed (not inside a path or
# another word).
OVERRIDE_KEY = re.compile(r"(?<![\w./$-])((?:\+\+|\+|~)?[A-Za-z_]\w*(?:\.\w+)*)=(?=\S)")
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")  # <name>, <HF id or dir>: stands for a value
FLAGS_WITH_VALUE = {"--cfg", "-c", "--info", "--package", "-p", "--config-name", "-cn"}
USER_CONFIG = {"--config-dir", "-cd"}
"""A user's own config directory: its options are not in this repository's conf/."""
COMPOSING = (["lightning-kd"], ["python", "-m", "lightning_kd"])
"""Command prefixes whose ``train``, ``cache`` or ``generate`` compose the run's config."""
VERBS = ("train", "cache", "generate")
FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--resolve"}


@dataclass
class Example:
    """Overrides one doc line shows, composed together."""

    where: str
    """file:line of the line."""
    overrides: list[str]
    context: list[str] = field(default_factory=list)
    """Overrides the line assumes (its own config selected)."""
    multirun: bool = False


def command_overrides(words: list[str], where: str) -> tuple[list[str], bool]:
    """The overrides of one `python run.py WORDS` command, and whether it is a sweep (-m)."""
    overrides, multirun, skip = [], False, False
    for word in words:
        if skip:
            skip = False
        elif word in FLAGS_WITH_VALUE:
            skip = True
        elif word in FLAGS:
            multirun = multirun or word in ("-m", "--multirun")
        elif word == "...":  # "and so on" in prose
            continue
        elif word.lstrip("+~").startswith("hydra."):
            continue  # where the run goes: Hydra's own, not the job's config
        elif ("=" not in word and not word.startswith("~")) or word.startswith("-"):
            raise ValueError(f"{where}: {word!r} in a lightning-kd train command is no override")
        else:
            overrides.append(word)
    return overrides, multirun


def composing_command(words: list[str], at: int) -> int | None:
    """Where the overrides start if ``words[at:]`` begins a command that composes the config."""
    if words[at : at + 2] == ["python", "run.py"]:
        return at + 2
    for prefix in COMPOSING:
        end = at + len(prefix)
        if words[at:end] == prefix and end < len(words) and words[end] in VERBS:
            return end + 1
    return None


def commands_in(text: str, first_line: int, path: str) -> list[Example]:
    """Every composing command (`lightning-kd train ...`, `python run.py ...`, ...) in ``text``
    (continuations, &&, ;, # comments)."""
    examples = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        start, line = index, lines[index]
        while line.endswith("\\") and index + 1 < len(lines):
            index += 1
            line = line[:-1] + " " + lines[index]
        index += 1
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = list(lexer)
        for at in range(len(words)):
            first = composing_command(words, at)
            if first is None:
                continue
            end = next((i for i in range(first, len(words)) if words[i] in (";", "&&", "|")), None)
            if USER_CONFIG & set(words[first:end]):
                continue
            where = f"{path}:{first_line + start}"
            overrides, multirun = command_overrides(words[first:end], where)
            examples.append(Example(where, overrides, multirun=multirun))
    return examples


def markdown_examples(path) -> list[Example]:
    """Commands in a markdown file's ```bash blocks and in its inline `...` spans."""
    text = path.read_text()
    name = str(path.relative_to(ROOT))
    examples = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        line = text.count("\n", 0, block.start(1)) + 1
        examples += commands_in(block.group(1), line, name)
    # Fenced blocks blanked (line count kept) so that only inline spans remain.
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for span in re.finditer(r"`([^`]+)`", prose):
        if any(prefix in span.group(1) for prefix in ("run.py", "lightning-kd ", "lightning_kd ")):
            line = prose.count("\n", 0, span.start(1)) + 1
            examples += commands_in(span.group(1).replace("\n", " "), line, name)
    return examples


def docs_examples() -> list[Example]:
    """The README's commands and those of every docs/ page."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [example for page in pages for example in markdown_examples(page)]


def run_py_examples() -> list[Example]:
    """The commands in run.py's module docstring."""
    lines = (ROOT / "run.py").read_text().split('"""')[1].split("\n")
    examples = []
    for number, line in enumerate(lines, start=1):
        if line.startswith("python run.py"):
            examples += commands_in(line, number, "run.py")
    return examples


def comment_overrides(comment: str) -> list[str]:
    """The override-looking words of a YAML comment: `a.b=c`, `group=option`, `+a=...`, values
    in brackets or braces kept whole, placeholders (`<name>`) read as a plain value."""
    comment = PLACEHOLDER.sub("x", comment)
    found = []
    for match in OVERRIDE_KEY.finditer(comment):
        key = match.group(1)
        if key.lstrip("+~").split(".")[0] not in ROOTS or key.lstrip("+~").startswith("hydra."):
            continue
        depth, end = 0, match.end()
        while end < len(comment):
            char = comment[end]
            if char in "[{(":
                depth += 1
            elif char in "]})":
                if depth == 0:
                    break
                depth -= 1
            elif char.isspace() and depth == 0:
                break
            end += 1
        value = comment[match.end() : end].rstrip(".,;:`'\"")
        if value:
            found.append(f"{key}={value}")
    return found


def conf_examples() -> list[Example]:
    """Overrides in the comments of every conf/ file, one example per comment line."""
    examples = []
    for path in sorted(CONF.rglob("*.yaml")):
        group = path.parent.relative_to(CONF).as_posix() if path.parent != CONF else None
        # Hydra's own groups (hydra/launcher) and the primary config's are selected, others added.
        selected = group in DEFAULT_GROUPS or str(group).startswith("hydra/")
        selects = [] if group is None else [f"{'' if selected else '+'}{group}={path.stem}"]
        for number, line in enumerate(path.read_text().split("\n"), start=1):
            if "#" not in line:
                continue
            overrides = comment_overrides(line.split("#", 1)[1])
            if not overrides:
                continue
            chosen = {o.split("=")[0].lstrip("+~") for o in overrides}
            context = [s for s in selects if s.split("=")[0].lstrip("+") not in chosen]
            where = f"{path.relative_to(ROOT)}:{number}"
            examples.append(Example(where, overrides, context=context))
    return examples


def expand_sweeps(overrides: list[str]) -> list[list[str]]:
    """A -m sweep as one override list per swept value (the other overrides kept as given)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    runs = [[]]
    for override, text in zip(parsed, overrides, strict=True):
        if override.is_sweep_override():
            key = override.get_key_element()
            values = [f"{key}={value}" for value in override.sweep_string_iterator()]
            runs = [[*run, value] for run in runs for value in values]
        else:
            runs = [[*run, text] for run in runs]
    return runs


def compose_error(example: Example) -> str | None:
    """Why ``example`` does not compose (None: it does). Call inside initialize_config_dir."""
    runs = expand_sweeps(example.overrides) if example.multirun else [example.overrides]
    for overrides in runs:
        try:
            compose("config", overrides=[*example.context, *overrides])
        except Exception as err:
            return f"{type(err).__name__}: {err}".split("\n")[0]
    return None


EXAMPLES = docs_examples() + run_py_examples() + conf_examples()


def distinct(examples: list[Example]) -> dict[str, Example]:
    """One example per distinct composition (a third of the docs' commands repeat another's
    overrides: composing each once keeps the check, at a third less of its time), keyed by every
    line that shows it."""
    lines: dict[tuple, list[str]] = {}
    first: dict[tuple, Example] = {}
    for example in examples:
        key = (tuple(example.context), tuple(example.overrides), example.multirun)
        first.setdefault(key, example)
        lines.setdefault(key, []).append(example.where)
    return {", ".join(lines[key]): example for key, example in first.items()}


DISTINCT = distinct(EXAMPLES)


@pytest.fixture(scope="module")
def hydra_conf():
    register_defaults()  # the groups' defaults, as run.py registers them
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


@pytest.mark.parametrize("shown_at", list(DISTINCT), ids=[key.split(",")[0] for key in DISTINCT])
def test_a_documented_override_composes(hydra_conf, shown_at: str) -> None:
    example = DISTINCT[shown_at]
    error = compose_error(example)
    assert error is None, (
        f"{shown_at}: lightning-kd train {' '.join(example.overrides)} "
        f"(with {example.context or 'nothing'} selected) does not compose: {error}"
    )


def test_the_docs_examples_are_found() -> None:
    """The extraction itself: the README's and the docs' commands, the comments, run.py's
    docstring."""
    files = {example.where.split(":")[0] for example in EXAMPLES}
    assert {
        "README.md",
        "docs/config.md",
        "run.py",
        "conf/strategy/fsdp.yaml",
        "conf/student/from_teacher.yaml",
    } <= files
    shown = {override for example in EXAMPLES for override in example.overrides}
    assert {
        "strategy=ddp",
        "student.layers=[0,10,20,29]",
        "trainer.strategy.activation_checkpointing=true",
        "student.config={num_hidden_layers: 4, hidden_size: 288}",
        "logger=tensorboard",
        "+callbacks=early_stopping",
    } <= shown
    assert len([e for e in EXAMPLES if e.where.startswith(("README.md", "docs/"))]) >= 40


def test_an_override_that_does_not_compose_is_reported(hydra_conf) -> None:
    """The bug this test was written for: a comment showing a key Hydra cannot override."""
    bad = Example("conf/strategy/fsdp.yaml:3", ["strategy.activation_checkpointing=true"])
    bad.context = ["strategy=fsdp"]
    assert "Could not override 'strategy.activation_checkpointing'" in compose_error(bad)
    assert compose_error(Example("x:1", ["logger=no_such_logger"])) is not None
    sweep = Example("x:1", ["distill.divergence=forward_kl,nope"], multirun=True)
    assert compose_error(sweep) is None  # values are not checked by composing, keys are
    assert compose_error(Example("x:1", ["distill.divergence=a,b"])) is not None  # sweep sans -m
    assert comment_overrides("e.g. `student.path=<HF id>` (pretrained), fused=true.") == [
        "student.path=x"
    ]
    with pytest.raises(ValueError, match="no override"):
        commands_in("python run.py --cfg job teacher", 1, "x")
    found = commands_in(
        "lightning-kd cache debug=smoke && python -m lightning_kd generate a=1", 1, "x"
    )
    assert [example.overrides for example in found] == [["debug=smoke"], ["a=1"]]
    assert commands_in("lightning-kd evaluate --files a.txt -- m", 1, "x") == []
    assert commands_in("lightning-kd train --config-dir mine experiment=mine", 1, "x") == []
