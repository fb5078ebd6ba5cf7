"""``lightning-kd export`` and ``evaluate`` answer ``--help`` and a mistyped option before
torch, transformers and Lightning load (they took 6 to 8 s to print their help on a 2-core CPU);
so do ``train``, ``cache`` and ``generate`` their ``--help``, before Hydra too (Hydra's composed
the whole config first: about 7 s)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from lightning_kd.cli import main

HEAVY = ("torch", "transformers", "lightning", "hydra")

PROBE = """
import json, sys
from lightning_kd.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
print(json.dumps([status, sorted(m for m in {heavy!r} if m in sys.modules)]))
"""


def loaded_after(argv: list[str]) -> tuple[int, list[str], str]:
    """The exit status of ``lightning-kd argv`` in a new interpreter, the heavy packages it
    imported, and what it printed."""
    code = PROBE.format(heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False
    )
    status, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return status, loaded, done.stdout + done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--help"],
        ["evaluate", "--help"],
        ["train", "--help"],
        ["cache", "-h"],
        ["generate", "debug=smoke", "--help"],
        ["importance", "--help"],
        ["export", "runs/kd/student", "--gguf", "q4_k"],
        ["evaluate", "--prompts", "p.jsonl", "--", "runs/kd/student"],
    ],
    ids=[
        "export help",
        "evaluate help",
        "train help",
        "cache help",
        "generate help",
        "importance help",
        "export bad type",
        "evaluate prompts without teacher",
    ],
)
def test_help_and_bad_options_load_no_framework(argv) -> None:
    status, loaded, printed = loaded_after(argv)
    assert loaded == [], printed
    if "--help" in argv or "-h" in argv:
        assert status == 0 and f"lightning-kd {argv[0]}" in printed
    else:
        assert status == 2 and ("invalid choice: 'q4_k'" in printed or "needs --teacher" in printed)


def test_the_hydra_commands_help_lists_the_groups_hydra_composes_from() -> None:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lightning_kd.cli.hydra_help import hydra_help
    from lightning_kd.launch.config import CONF_DIR, VARIANT_TARGETS, register_defaults
    from lightning_kd.launch.config_dir import group_options

    register_defaults()
    listed = group_options(CONF_DIR)
    assert {"teacher", "experiment", "strategy", "hydra/launcher"} <= set(listed)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for group, options in listed.items():
            known = set(loader.get_group_options(group))
            if group.startswith("hydra/"):  # Hydra's own options too (basic, its plugins')
                assert set(options) <= known, group
            else:  # all but the package's defaults nodes, which no override picks
                bases = {"base"} | {name for (g, name) in VARIANT_TARGETS if g == group}
                assert set(options) == known - bases, group
    shown = hydra_help("train", "lightning-kd train: a run.")
    assert re.search(r"^  teacher: +gemma3_270m, minilm, smollm2, tiny_gpt2", shown, re.M)
    assert "hydra/job_logging" not in shown, "the package's own logging group is no choice"
    # Installed from a wheel there is no conf/ beside the user: the help says where it is.
    assert shown.rstrip().endswith(f"the shipped configs (conf/ in this help): {CONF_DIR}")


def test_the_help_lists_the_groups_of_your_own_config_directory_too(tmp_path) -> None:
    from lightning_kd.cli.hydra_help import hydra_help

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "lr.yaml").write_text("{}\n")
    for argv in (["--config-dir", str(tmp_path)], [f"--config-dir={tmp_path}"]):
        shown = hydra_help("train", "a run", [*argv, "--help"])
        assert re.search(r"^  experiment: +ce_only, cross_tokenizer, instruct, .*mine", shown, re.M)
        assert re.search(r"^  sweeps: +lr$", shown, re.M)


def test_ctrl_c_in_a_plain_command_exits_130_with_one_line(monkeypatch, capsys) -> None:
    """``evaluate`` (a command without Hydra) printed a KeyboardInterrupt traceback and exited
    1, where train, cache and generate exit 130 with a line (probe 23)."""
    import lightning_kd.cli.evaluate as evaluate
    from lightning_kd.cli import main

    def interrupted(argv) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "main", interrupted)
    assert main(["evaluate", "run"]) == 130
    assert capsys.readouterr().err == "\nlightning-kd evaluate: stopped by Ctrl+C (SIGINT)\n"


@pytest.mark.parametrize("command", ["evaluate", "bench", "soak", "export"])
def test_an_options_default_is_said_only_where_it_is_a_value(command, capsys) -> None:
    """``(default: None)`` followed eight of evaluate's options (``--teacher ... (smollm2)
    (default: None)``), and ``--no-compile`` read ``(default: True)`` (probe 30)."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "(default: None)" not in out and "(default: [])" not in out
    assert "(default: True)" not in out and "(default: False)" not in out
    if command == "evaluate":
        assert "rows scored at once (default: 8)" in out


@pytest.mark.parametrize("command", ["evaluate", "bench", "soak", "export"])
def test_the_help_prints_no_rest_markup(command, capsys) -> None:
    """The docstrings the help prints are written for the docs site: ``evaluate --help`` showed
    reST's double backquotes in a terminal (probe 34)."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "lightning-kd " + command in out


def test_a_terminal_that_cannot_encode_the_output_gets_escapes() -> None:
    """Under PYTHONIOENCODING=ascii the summary's ‖ ended a finished run with a
    UnicodeEncodeError, exit 1 (probe 48)."""
    import os
    import subprocess
    import sys

    code = "from lightning_kd.cli import lossy_streams; lossy_streams(); print('KL(t ‖ s)')"
    env = os.environ | {"PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "KL(t \\u2016 s)\n", done.stderr


def test_hydras_own_help_is_printed_whatever_overrides_the_line_holds(capsys) -> None:
    """Hydra composes --hydra-help without the primary config: every override failed, with the
    advice to add it with + (probe 52)."""
    try:
        status = main(["train", "debug=smoke", "seed=1", "--hydra-help"])
    except SystemExit as stop:
        status = stop.code
    printed = capsys.readouterr()
    assert status in (0, None), printed.err
    assert "Hydra (" in printed.out and "Traceback" not in printed.err
