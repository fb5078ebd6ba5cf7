"""The package as users install it: a wheel built from this tree, installed alone (not editable)
into a folder of its own, and every command run from an empty directory on the smoke configs
(``bench --quick``, minutes of child processes, in the slow tier).

The wheel must carry the configs and the ``lightning-kd`` command: a checkout's ``conf/`` and
``run.py`` are nowhere on the path. Its dependencies are those of the environment running the
tests (installing torch and Lightning afresh would only test pip)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.data.test_chat import CHATML

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "lightning_kd", "conf", "docs")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The environment of a shell in which only the wheel provides ``lightning_kd``."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:  # a copy: building writes build/ and egg-info beside the sources
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (work / "dist").glob("lightning_kd-*.whl")
    site = work / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    return {
        **os.environ,
        "PYTHONPATH": str(site),
        "PATH": f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }


def shell(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_installed_package_is_the_wheel_with_its_configs(installed, tmp_path: Path) -> None:
    where = shell(
        [sys.executable, "-c", "import lightning_kd.launch.config as c; print(c.CONF_DIR)"],
        tmp_path,
        installed,
    )
    conf = Path(where.stdout.strip())
    assert (
        conf.parts[-2:] == ("lightning_kd", "conf")
        and Path(installed["PYTHONPATH"]) in conf.parents
    )
    # Every config, those of nested groups (hydra/launcher/) included.
    shipped = {p.relative_to(conf).as_posix() for p in conf.rglob("*.yaml")}
    assert shipped == {p.relative_to(ROOT / "conf").as_posix() for p in ROOT.glob("conf/**/*.yaml")}
    # The lm-eval tasks: their YAML, rows and loader.
    tasks = conf.parent / "evaluation" / "tasks"
    checkout = ROOT / "lightning_kd" / "evaluation" / "tasks"
    assert {p.relative_to(tasks) for p in tasks.rglob("*.*") if "__pycache__" not in p.parts} == {
        p.relative_to(checkout) for p in checkout.rglob("*.*") if "__pycache__" not in p.parts
    }
    assert shutil.which("lightning-kd", path=installed["PATH"]).startswith(installed["PYTHONPATH"])
    # The docs' pages, which messages and --help point to: a wheel user has no checkout (probe 41).
    docs = conf.parent / "docs"
    assert {p.name for p in docs.glob("*.md")} == {p.name for p in (ROOT / "docs").glob("*.md")}
    usage = shell(["lightning-kd", "--help"], tmp_path, installed).stdout
    assert f"The docs (Markdown pages): {docs}" in usage


@pytest.fixture(scope="module")
def trained(installed, tmp_path_factory) -> Path:
    """``lightning-kd train debug=smoke`` from an empty directory: the directory."""
    here = tmp_path_factory.mktemp("empty")
    shell(["lightning-kd", "train", "debug=smoke", "hydra.run.dir=x"], here, installed)
    return here


def test_train_exports_a_student(trained: Path) -> None:
    assert (trained / "x" / "student" / "config.json").is_file()
    assert json.loads((trained / "x" / "summary.json").read_text())["steps"] == 6


@pytest.mark.slow  # four commands from the wheel, each a process: the train one stays default
def test_cache_generate_evaluate_and_importance_run(installed, trained, tmp_path: Path) -> None:
    smoke = ["debug=smoke"]
    shell(["lightning-kd", "cache", *smoke, "hydra.run.dir=c"], tmp_path, installed)
    assert (tmp_path / "c" / "index.json").is_file()

    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "Say hello."}) + "\n")
    (tmp_path / "chatml.jinja").write_text(CHATML)
    generate = ["generate.prompts=p.jsonl", "generate.chat_template=chatml.jinja"]
    generate += ["generate.max_new_tokens=4", "hydra.run.dir=g"]
    shell(["lightning-kd", "generate", *smoke, *generate], tmp_path, installed)
    assert len((tmp_path / "g" / "completions.jsonl").read_text().splitlines()) == 1

    (tmp_path / "heldout.txt").write_text("How vexingly quick daft zebras jump! " * 40)
    student = trained / "x" / "student"
    evaluate = ["--files", "heldout.txt", "--block-size", "32", "--", str(student)]
    scored = shell(["lightning-kd", "evaluate", *evaluate], tmp_path, installed)
    assert "| model | perplexity |" in scored.stdout

    ranked = shell(["lightning-kd", "importance", *smoke], tmp_path, installed)
    assert "student.layers=[" in ranked.stdout


@pytest.mark.slow  # a fresh process importing lm-eval; the wheel's task files are checked above
def test_the_shipped_lm_eval_tasks_run_from_the_wheel(installed, trained, tmp_path) -> None:
    student = trained / "x" / "student"
    harness = ["--lm-eval", "kd_heldout", "--lm-eval-limit", "2", "--", str(student)]
    scored = shell(["lightning-kd", "evaluate", *harness], tmp_path, installed)
    assert f"| kd_heldout_prose | bits_per_byte | {student} |" in scored.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


@pytest.mark.slow  # two minutes of child processes; each scenario also runs in-process (test_bench)
def test_the_quick_benchmark_runs_on_the_default_objective(installed, trained, tmp_path) -> None:
    """``bench --quick`` composes the default config (its feature matching, repair settings and
    cache scenarios: free_floor once failed on them) with the trained tiny student as teacher;
    without torch.compile, whose build would be most of the test's time."""
    student = trained / "x" / "student"
    bench = ["--quick", "--no-compile", "--teacher", str(student), "--student-layers", "1"]
    shell(["lightning-kd", "bench", *bench, "--out", "b"], tmp_path, installed)
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert report["scenarios"]["free_floor"]["step_s"] > 0
    assert report["scenarios"]["lightning_kd"]["step_s"] > 0
