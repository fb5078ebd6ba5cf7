"""Where the shipped configs are, found without loading anything: ``--help`` lists their groups
before torch, Lightning or Hydra load."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]

CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
"""Hydra's flags adding a directory of the user's own configs (also ``--config-dir=DIR``)."""


def shipped_config_dir() -> Path:
    """The shipped configs: ``lightning_kd/conf`` in an installed wheel (the build maps the
    repository's top-level ``conf/`` there), else the checkout's ``conf/`` (a clone, or an
    editable install)."""
    for candidate in (PACKAGE_DIR / "conf", PACKAGE_DIR.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        f"lightning-kd's configs are missing: neither {PACKAGE_DIR / 'conf'} nor "
        f"{PACKAGE_DIR.parent / 'conf'} holds config.yaml; reinstall the package "
        "(pip install --force-reinstall lightning-kd) or run from a full checkout"
    )


def shipped_docs_dir() -> Path:
    """The docs' pages (Markdown): ``lightning_kd/docs`` in an installed wheel, else the
    checkout's ``docs/``. A wheel user had only "docs/... in lightning-kd's repository", and no
    repository address (probe 41)."""
    for candidate in (PACKAGE_DIR / "docs", PACKAGE_DIR.parent / "docs"):
        if (candidate / "index.md").is_file():
            return candidate
    return Path("docs")  # a copy without them: the repository's


def group_options(conf: Path) -> dict[str, list[str]]:
    """Each config group of ``conf`` (``teacher``, ``hydra/launcher``, ...) and its options: the
    YAML files a ``group=option`` override picks."""
    groups: dict[str, list[str]] = {}
    for option in sorted(conf.rglob("*.yaml")):
        group = option.parent.relative_to(conf).as_posix()
        if group != ".":
            groups.setdefault(group, []).append(option.stem)
    return groups
