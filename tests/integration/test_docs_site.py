"""The documentation as readers get it: a README that fits its role, and a docs site that builds
with every page in the navigation and every link resolving (``mkdocs build --strict``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

README_LINES = 250


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    linked = set(re.findall(r"\]\((docs/[^)#]+)", text))
    assert linked and all((ROOT / page).is_file() for page in linked)


def test_every_docs_page_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        if isinstance(nav, dict):
            return set().union(*(pages(value) for value in nav.values()))
        return set().union(*(pages(item) for item in nav))

    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages(config["nav"]) == on_disk


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_test_the_failure_table_names_exists() -> None:
    """docs/what-can-go-wrong.md says which test shows each fault: each must be a test here."""
    table = (ROOT / "docs" / "what-can-go-wrong.md").read_text()
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", table))
    sources = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    assert len(named) > 50
    assert [name for name in sorted(named) if f"def {name}(" not in sources] == []


def test_the_layout_page_names_every_module_in_its_folders_rows() -> None:
    """docs/architecture.md's "Module by module" had fallen 35 modules behind the package."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page[page.index("## Module by module") : page.index("## Where to start")]
    named: dict[str, set[str]] = {}
    folder = ""
    for row in table.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if not row.startswith("| ") or len(cells) != 3 or cells[0] == "folder":
            continue
        folder = cells[0].strip("`/") or folder
        named.setdefault(folder, set()).update(re.findall(r"`([a-z_0-9]+\.py)`", cells[1]))
    package = ROOT / "lightning_kd"
    modules = {
        (path.parent.name, path.name)
        for path in package.glob("*/*.py")
        if path.name != "__init__.py"
    }
    missing = sorted(f"{d}/{name}" for d, name in modules if name not in named.get(d, set()))
    gone = sorted(
        f"{d}/{name}" for d, names in named.items() for name in names if (d, name) not in modules
    )
    assert not missing and not gone, f"unnamed: {missing}; named but not in the package: {gone}"
