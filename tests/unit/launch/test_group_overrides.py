"""A ``group=option`` naming no option of its group, refused before Hydra composes
(``launch/group_overrides.py``): it was Hydra's "Could not find" with its search path, exit 1."""

from __future__ import annotations

from pathlib import Path

from lightning_kd.cli import main
from lightning_kd.launch.config import CONF_DIR, stored_nodes
from lightning_kd.launch.group_overrides import group_option_errors


def errors(*argv: str, dirs: tuple[Path, ...] = ()) -> list[str]:
    return group_option_errors(list(argv), [CONF_DIR, *dirs], stored_nodes())


def test_a_misspelt_option_is_named_with_the_nearest_and_the_groups_options() -> None:
    assert errors("teacher=tiny_lama") == [
        "teacher=tiny_lama: the config group teacher has no option 'tiny_lama'; did you mean "
        "teacher=tiny_llama? (its options: gemma3_270m, minilm, smollm2, tiny_gpt2, tiny_llama)"
    ]
    (appended,) = errors("+callbacks=[early_stopping,device_stat]")
    assert "no option 'device_stat'; did you mean +callbacks=device_stats?" in appended
    (swept,) = errors("debug=smoke,smok")  # a -m sweep's options, each
    assert "no option 'smok'" in swept


def test_real_options_and_what_hydra_resolves_itself_pass(tmp_path: Path) -> None:
    fine = [
        "teacher=tiny_llama",
        "teacher=base",
        "data=chat_base",  # registered in code, as base is: composes (probe 27)
        "+callbacks=early_stopping",
        "logger=[csv,mlflow]",
        "strategy=null",
        "hydra/launcher=basic",
        "teacher.path=x",
        "~logger",
        "experiment=choice(ce_only,two_teachers)",
        "debug=${oc.env:X}",
    ]
    assert errors(*fine) == []
    own = tmp_path / "teacher"  # a --config-dir's own option counts
    own.mkdir()
    (own / "mine.yaml").write_text("path: null\n")
    assert errors("teacher=mine", dirs=(tmp_path,)) == []
    assert errors("teacher=mine") != []


def test_train_refuses_it_with_exit_2_and_one_line(capsys) -> None:
    try:
        main(["train", "teacher=tiny_lama"])
    except SystemExit as leaving:
        assert leaving.code == 2
    err = capsys.readouterr().err
    assert "did you mean teacher=tiny_llama?" in err
    assert "Traceback" not in err and "search path" not in err
