"""What the package prints speaks to its user: no message cites the project's own bookkeeping
("a lower bound: probe 45" reached users, naming a report no page holds; probe 58). Docstrings
and comments may cite it: they speak to the code's readers."""

from __future__ import annotations

import ast
import re

from tests.unit.test_layout import ROOT, sources

INTERNAL = re.compile(r"\b(probe|re-check|stop) \d+\b")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the strings that stand as statements of their own: docstrings, and the
    strings documenting a constant below its assignment. Neither is ever printed."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def cited(path) -> list[str]:
    """``path:line`` and the text of each string, not a docstring, that cites a probe."""
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    where = path.relative_to(ROOT).as_posix()
    return [
        f"{where}:{node.lineno} {node.value[:80]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and INTERNAL.search(node.value)
    ]


def test_no_message_cites_an_internal_report() -> None:
    found = [line for path in sources() for line in cited(path)]
    assert not found, "strings the package prints cite internal reports:\n" + "\n".join(found)
