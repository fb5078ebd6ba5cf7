"""The package reads top to bottom: each subpackage imports only from itself and the ones above it
in :data:`LAYERS` (function-local imports included), so there is no import cycle between them; the
package root holds only the public entry points; the public API imports from short paths."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lightning_kd"
LAYERS = (
    "utils",  # crash-safe writes, Lightning's private API fenced
    "losses",  # pure tensor functions
    "models",  # teacher and student, captures, precision
    "data",  # files, corpus, tokenising, loaders
    "generation",  # decoding outside the step's graph
    "evaluation",  # measuring saved models
    "export",  # saved models in other formats (GGUF)
    "cache",  # the teacher cache
    "distill",  # the step as plain PyTorch
    "training",  # the Lightning layer
    "launch",  # config → objects; the commands' library halves
    "bench",  # the benchmark and the soak
    "cli",  # the commands' command-line halves
)
ROOT_MODULES = {"__init__.py", "__main__.py"}
"""The package root: the public API (lazy) and ``python -m lightning_kd``."""


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(path: Path) -> list[tuple[int, list[str]]]:
    """``(line, modules)`` of every ``lightning_kd`` import statement in ``path``, at any depth:
    the module imported, then each name of a ``from`` import that may be a submodule of it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if names[0].split(".")[0] == "lightning_kd":
            found.append((node.lineno, names))
    return found


def upward_imports(package: Path = PACKAGE, layers: tuple[str, ...] = LAYERS) -> list[str]:
    """``file:line -> module`` for each import of a layer below the importer's, or of the root."""
    wrong = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if len(parts) == 1:
            continue  # the root's entry points may import anything, lazily
        own = layers.index(parts[0])
        for line, (module, *_) in imports(path):
            target = layer_of(module)
            if target is None or layers.index(target) > own:
                wrong.append(f"{path.relative_to(package.parent)}:{line} -> {module}")
    return wrong


def test_every_subpackage_is_a_layer_and_the_root_holds_only_entry_points() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS)
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules == ROOT_MODULES


def test_imports_only_point_down_the_layers() -> None:
    wrong = upward_imports()
    assert not wrong, "imports of a higher layer (move the code down, or the import up):\n" + (
        "\n".join(wrong)
    )


def test_the_check_names_an_upward_import(tmp_path: Path) -> None:
    package = tmp_path / "lightning_kd"
    for name, source in {
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from lightning_kd.high.b import g\n",
        "high/__init__.py": "",
        "high/b.py": "from lightning_kd.low.a import f\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    assert upward_imports(package, ("low", "high")) == [
        "lightning_kd/low/a.py:2 -> lightning_kd.high.b"
    ]


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """Every cycle of the module import graph (imports at any depth; importing a submodule
    imports its package first, so that edge counts too)."""
    modules = {module_name(path, package): path for path in package.rglob("*.py")}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for _, targets in imports(path):
            for target in targets:
                parts = target.split(".")
                for end in range(1, len(parts) + 1):  # a.b.c loads a, a.b, a.b.c
                    prefix = ".".join(parts[:end])
                    if prefix in modules and prefix != name and not name.startswith(prefix + "."):
                        graph[name].add(prefix)
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_there_is_no_import_cycle() -> None:
    cycles = import_cycles()
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_finds_one(tmp_path: Path) -> None:
    package = tmp_path / "lightning_kd"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low/__init__.py").write_text("")
    (package / "low/a.py").write_text("def f():\n    from lightning_kd.low import b\n")
    (package / "low/b.py").write_text("import lightning_kd.low.a\n")
    cycle = ["lightning_kd.low.a", "lightning_kd.low.b", "lightning_kd.low.a"]
    assert import_cycles(package) == [cycle]


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    code = (
        "import importlib, pkgutil, lightning_kd as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'lightning_kd.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_public_api_imports_from_the_package_root() -> None:
    import lightning_kd

    for name in lightning_kd.__all__:
        assert getattr(lightning_kd, name) is not None
    assert set(lightning_kd.__all__) <= set(dir(lightning_kd))  # loaded on first use, yet listed
    assert importlib.import_module("lightning_kd.losses").get_divergence("forward_kl")
