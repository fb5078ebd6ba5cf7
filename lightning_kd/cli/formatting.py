"""How the argparse commands print their help: the module docstring as written, less reST's
literal marks, and each option's default after its help (``--batch-size`` said neither what it
was nor its 8)."""

from __future__ import annotations

import argparse

UNSAID = (None, [], ())
"""Defaults that say nothing (an option left out): no ``(default: None)``."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description kept as written; ``(default: X)`` after the help of each option that
    takes a value and has one by default (a flag's ``True`` for ``--no-compile`` misread). The
    double backquotes of reST's literals are dropped, as ``hydra_help`` drops them: the
    docstrings are written for the docs site, and read as plain text in a terminal."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return super()._fill_text(text.replace("``", ""), width, indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default in UNSAID or action.default is argparse.SUPPRESS:
            return action.help  # a flag's help says what it does; its default is "not given"
        return super()._get_help_string(action)
