"""A key the config does not have is refused with the key it was likely meant to be."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_kd.launch.config import CONF_DIR, compose_config
from lightning_kd.launch.keys import override_key_errors, unknown_setting_errors


def test_a_command_line_of_known_keys_passes() -> None:
    argv = ["debug=smoke", "trainer.max_steps=3", "experiment=two_teachers", "teachers.1.weight=1"]
    assert override_key_errors(argv) == []


def test_each_mistyped_key_is_named_with_its_nearest_neighbour() -> None:
    typed = ["trainer.maxsteps=3", "distil.kd_weight=1", "teachers.1.wieght=1"]
    errors = override_key_errors(["experiment=two_teachers", *typed])
    assert errors == [
        "trainer.maxsteps=3: the config has no key trainer.maxsteps; "
        "did you mean trainer.max_steps?",
        "distil.kd_weight=1: the config has no key distil.kd_weight; "
        "did you mean distill.kd_weight?",
        "teachers.1.wieght=1: the config has no key teachers.1.wieght; "
        "did you mean teachers.1.weight?",
    ]


def test_a_key_near_nothing_points_to_the_printed_config_not_to_a_parent() -> None:
    (error,) = override_key_errors(["trainer.foo=1"])
    assert error.startswith("trainer.foo=1: the config has no key trainer.foo; ")
    assert "lightning-kd train --cfg job prints the keys" in error
    assert "did you mean" not in error  # not "did you mean trainer?"


def test_a_setting_added_that_its_object_does_not_take_is_named(tmp_path: Path) -> None:
    errors = override_key_errors(["+distill.kdweight=0.3", "+distill.zzz=1"])
    assert errors == [
        "distill.kdweight: DistillConfig takes no setting 'kdweight'; "
        "did you mean distill.kd_weight?",
        "distill.zzz: DistillConfig takes no setting 'zzz'; "
        "remove it (lightning-kd train --cfg job prints the distill keys)",
    ]
    # The same check on a composed config (a notebook's, or a key in the user's own YAML).
    cfg = compose_config(["+student.num_layer=2"])
    assert unknown_setting_errors(cfg) == [
        "student.num_layer: StudentSpec takes no setting 'num_layer'; "
        "did you mean student.num_layers?"
    ]
    assert unknown_setting_errors(compose_config(["debug=smoke"])) == []


def test_the_users_config_directory_is_searched_and_a_missing_one_refused(tmp_path: Path) -> None:
    mine = tmp_path / "conf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "mine.yaml").write_text("# @package _global_\nmy_note: hello\n")
    assert override_key_errors(["--config-dir", str(mine), "experiment=mine", "my_note=x"]) == []
    assert override_key_errors([f"--config-dir={mine}", "my_nite=x"]) == [
        "my_nite=x: the config has no key my_nite; lightning-kd train --cfg job prints the keys "
        "it has (a key it leaves out that the object built takes is added with +my_nite=x)"
    ]
    missing = tmp_path / "nowhere"
    assert override_key_errors(["--config-dir", str(missing), "trainer.max_steps=1"]) == [
        f"--config-dir {missing}: no such directory"
    ]


def test_an_experiment_file_without_its_package_line_is_named(tmp_path: Path) -> None:
    """Its settings landed under experiment.*, unread: the run trained on the defaults."""
    mine = tmp_path / "conf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "bare.yaml").write_text("trainer:\n  max_steps: 3\n")
    (error,) = override_key_errors(["--config-dir", str(mine), "experiment=bare"])
    assert error.startswith("the experiment option's settings landed under experiment ")
    assert "(experiment.trainer), where nothing reads them" in error
    assert "make '# @package _global_' its file's first line" in error


def test_an_experiment_file_that_overrides_a_group_without_its_package_line_is_named(
    tmp_path: Path,
) -> None:
    """Hydra's "Could not override 'data@experiment.data'. Did you mean to override data?"
    named neither the file nor the fix, and exited 1 with a traceback."""
    mine = tmp_path / "conf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "bare.yaml").write_text("defaults:\n  - override /data: chat\n")
    assert override_key_errors(["--config-dir", str(mine), "experiment=bare"]) == [
        "the experiment option overrides /data in its defaults list, and its file lacks "
        "'# @package _global_': the override lands under experiment (data@experiment.data), "
        "which Hydra refuses; make '# @package _global_' its file's first line, as in the "
        f"shipped {CONF_DIR / 'experiment'}/*.yaml"  # where the package is installed
    ]


def test_an_experiment_that_overrides_debug_is_told_debug_comes_after_it(tmp_path: Path) -> None:
    """``override /debug: smoke`` in an experiment: Hydra's "Could not override 'debug'. Did
    you mean to override debug?", exit 1 (probe 37). The defaults list composes debug last."""
    mine = tmp_path / "conf"
    (mine / "experiment").mkdir(parents=True)
    text = "# @package _global_\ndefaults:\n  - override /debug: smoke\n"
    (mine / "experiment" / "mine.yaml").write_text(text)
    assert override_key_errors(["--config-dir", str(mine), "experiment=mine"]) == [
        "experiment/mine overrides /debug in its defaults list, which the shipped config.yaml "
        "composes after experiment (so that debug=... applies over any experiment): an "
        "experiment cannot set it; drop that line and give debug=... on the command line, or "
        "copy the debug settings you need into experiment/mine.yaml"
    ]


def test_a_yes_no_setting_given_a_word_is_refused() -> None:
    """``data.pack=flase`` stayed a string, which is true: packing stayed on, with exit 0."""
    cfg = compose_config(["data.pack=flase", "student.activation_checkpointing=nope"])
    assert unknown_setting_errors(cfg) == [
        "student.activation_checkpointing='nope': give true or false, e.g. "
        "student.activation_checkpointing=true",
        "data.pack='flase': give true or false, e.g. data.pack=true",
    ]
    nullable = compose_config(["student.freeze_embeddings=null", "data.pack=false"])
    assert unknown_setting_errors(nullable) == []


def test_other_flags_and_sweeps_are_left_to_hydra() -> None:
    assert override_key_errors(["-m", "distill.kdweight=1,2"]) == []
    # --cfg job prints the composed config: a key it cannot compose is named, not Hydra's "+".
    (error,) = override_key_errors(["--cfg", "job", "--resolve", "distill.kdweight=1"])
    assert "did you mean distill.kd_weight?" in error
    assert override_key_errors(["teacher=nonexistent", "distill.kdweight=1"]) == []


def test_an_entry_key_the_entry_does_not_set_is_added_with_a_plus() -> None:
    """``teachers.1.cache=DIR`` on an entry written without ``cache``: "did you mean
    teachers.1.path?", when the fix is ``+teachers.1.cache=DIR``."""
    teachers = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, path: smollm2}]"
    assert override_key_errors(["debug=smoke", teachers, "teachers.1.cache=caches/b"]) == [
        "teachers.1.cache=caches/b: this teachers entry does not set cache, which an entry may "
        "have: add it with +teachers.1.cache=caches/b"
    ]


def test_a_group_the_defaults_leave_unset_is_told_to_be_added_with_plus() -> None:
    """It said the config had no key callbacks, "did you mean callbacks?"."""
    (error,) = override_key_errors(["callbacks=early_stopping"])
    assert error.startswith("callbacks=early_stopping: the config chooses no callbacks option")
    assert "add it with +callbacks=early_stopping" in error
    assert override_key_errors(["+callbacks=early_stopping"]) == []


def test_a_key_a_model_config_does_not_list_is_added_with_a_plus() -> None:
    """``teacher.config.rope_theta=5000`` was told "did you mean teacher.config.model_type?" (a
    match of the shared prefix), when the fix is ``+teacher.config.rope_theta=5000``."""
    (error,) = override_key_errors(["teacher=tiny_llama", "teacher.config.rope_theta=5000"])
    assert error == (
        "teacher.config.rope_theta=5000: teacher.config lists only some of the keys it may "
        "take; add one it does not list with +teacher.config.rope_theta=5000 (a key it does "
        "not take is named when the run loads)"
    )
    (typo,) = override_key_errors(["teacher=tiny_llama", "teacher.config.num_hidden_layer=2"])
    assert "did you mean teacher.config.num_hidden_layers? If not, add one" in typo
    (lora,) = override_key_errors(["student.lora.r=4"])
    assert "add one it does not list with +student.lora.r=4" in lora
    assert override_key_errors(["teacher=tiny_llama", "+teacher.config.rope_theta=5000"]) == []


def test_compose_config_refuses_a_mistyped_key_as_the_command_does() -> None:
    """From Python, Hydra's traceback advised "+distill.kdweight=0.3", which ends in a
    TypeError once the group is built (probe 34)."""
    from lightning_kd.utils.refusal import Refused

    with pytest.raises(Refused) as refused:
        compose_config(["debug=smoke", "distill.kdweight=0.3"])
    assert "did you mean distill.kd_weight?" in str(refused.value)
    assert "+distill.kdweight" not in str(refused.value)


def test_a_top_level_key_added_that_nothing_reads_is_named(tmp_path: Path) -> None:
    """+seeed=3 composed, trained with seed 0 and exited 0 (probe 52). A key of one's own that an
    interpolation reads is kept, as is a note in one's own YAML file."""
    assert override_key_errors(["debug=smoke", "+seeed=3", "++zzz_mine=1"]) == [
        "+seeed: the config has no key 'seeed', and nothing reads it; did you mean seed? (a key "
        "of your own is read where an interpolation names it: ${seeed})",
        "+zzz_mine: the config has no key 'zzz_mine', and nothing reads it; nothing reads a key "
        "of its own (a key of your own is read where an interpolation names it: ${zzz_mine})",
    ]
    assert override_key_errors(["+my_lr=0.1", "optimizer.lr=${my_lr}"]) == []
    assert override_key_errors(["+hydra.job.env_set.FOO=1", "+callbacks=early_stopping"]) == []
    assert override_key_errors(["+distil.temperature=2"]) == [  # a node added (verify 53)
        "+distil.temperature: the config has no key 'distil', and nothing reads it; did you mean "
        "distill? (a key of your own is read where an interpolation names it: ${distil})"
    ]


def test_a_config_file_of_ones_own_that_is_not_yaml_is_named(tmp_path: Path) -> None:
    """Hydra's 89-line traceback, exit 1 (probe 52): the file and line, refused with the rest."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "broken.yaml").write_text("distill: [unclosed\n")
    (error,) = override_key_errors(["--config-dir", str(tmp_path), "experiment=broken"])
    assert error.startswith("a config file is not valid YAML (while parsing a flow sequence")
    assert f'in "{tmp_path}/experiment/broken.yaml", line 1, column 10' in error
    assert error.endswith("; fix the file it names")
