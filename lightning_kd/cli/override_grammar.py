"""Overrides Hydra's grammar cannot read: ``data.files=~/notes.txt`` (bash expands a ``~`` after
the ``=`` of a variable's assignment, not of a dotted key's), a path with a non-ASCII letter
(``data.files=/data/café.txt``), a bracket in a value. Hydra refused each with its lexer's
words (``LexerNoViableAltException``), a link and exit 1, naming no fix (probe 46); here each is
refused before Hydra runs, with the value quoted as Hydra reads it as it stands."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from lightning_kd.training.rerun import hydra_text

LEXER = "LexerNoViableAltException: "


def grammar_errors(words: Sequence[str]) -> list[str]:
    """One message per override of ``words`` that Hydra's grammar cannot parse, with what it
    stopped at and the override quoted."""
    parser = OverridesParser.create()
    errors = []
    for word in words:
        try:
            parser.parse_overrides([word])
        except OverrideParseException as error:
            errors.append(
                f"{word}: Hydra's override grammar cannot read {stopped_at(word, str(error))}; "
                f"quote the value: {quoted(word)}"
            )
    return errors


def stopped_at(word: str, message: str) -> str:
    """The character Hydra's lexer stopped at (its caret's, under the override it repeats), or
    its parser's own words (``mismatched input ')' expecting <EOF>``)."""
    first, _, rest = message.partition("\n")
    if first.startswith(LEXER) and "^" in rest:
        column = rest.splitlines()[0].index("^") - len(LEXER)
        if 0 <= column < len(word):
            return f"its {word[column]!r} (character {column + 1})"
    return f"it ({first})"


def quoted(word: str) -> str:
    """``word`` with its value in Hydra's double quotes, each item of a plain ``[a,b]`` list
    on its own, and the whole quoted for the shell."""
    key, _, value = word.partition("=")
    items = value[1:-1]
    if value.startswith("[") and value.endswith("]") and not any(c in items for c in "[]{}'\""):
        value = "[" + ",".join(hydra_text(item.strip()) for item in items.split(",")) + "]"
    else:
        value = hydra_text(value)
    return shlex.quote(f"{key}={value}")
