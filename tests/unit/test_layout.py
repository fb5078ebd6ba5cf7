"""The package stays readable in small pieces: no module over 300 lines, no function over 50
(STYLE.md's measures; split by concern when one grows past them)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def sources() -> list[Path]:
    return [*sorted((ROOT / "lightning_kd").rglob("*.py")), ROOT / "run.py"]


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """Every function and method with its qualified name (``Class.method``, ``outer.inner``)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                found.append((name, node))
            found += functions(node, f"{name}.")
        else:
            found += functions(node, prefix)
    return found


def offenders(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line name (N lines)`` for the module and each function over its limit."""
    text = path.read_text()
    where = path.relative_to(root).as_posix()
    found = []
    if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
        found.append(f"{where}:1 <module> ({lines} lines)")
    for name, node in functions(ast.parse(text, filename=where)):
        # From the def line (decorators aside) to the last line of the body, docstring included.
        if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
            found.append(f"{where}:{node.lineno} {name} ({lines} lines)")
    return found


def test_no_module_or_function_is_too_long() -> None:
    found = [line for path in sources() for line in offenders(path)]
    assert not found, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function "
        "(split by concern):\n" + "\n".join(found)
    )


def test_the_check_names_each_offender(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(50))
    short = "def short():\n    return 1\n"
    source = f"class Box:\n    def fill(self):\n{body.replace('    ', '        ')}\n\n{short}"
    (tmp_path / "pkg.py").write_text(source + "\n" * 300)
    assert offenders(tmp_path / "pkg.py", root=tmp_path) == [
        f"pkg.py:1 <module> ({len(source.splitlines()) + 300} lines)",
        "pkg.py:2 Box.fill (51 lines)",
    ]
