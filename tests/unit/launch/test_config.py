"""One source for defaults: the composed config is the dataclasses' defaults, and every entry point
composes it the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra.utils import instantiate

from lightning_kd.data.text import TextDataModule
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.launch.config import (
    CONF_DIR,
    GROUP_TARGETS,
    VARIANT_TARGETS,
    compose_config,
    defaults_node,
)
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer


def test_the_cli_defaults_are_the_dataclass_defaults() -> None:
    cfg = compose_config()
    # The documented choices of the default run (conf/distill/default.yaml): it matches hidden
    # states and repairs the student block-wise first; a DistillConfig built from Python is
    # logits only unless asked.
    run_choice = DistillConfig(features="spans", feature_weight=3.0, blockwise_passes=5)
    assert instantiate(cfg.distill, _convert_="all") == run_choice
    assert instantiate(cfg.student, _convert_="all") == StudentSpec()
    assert instantiate(cfg.teacher, _convert_="all") == TeacherSpec()
    data = instantiate(cfg.data, tokenizer=byte_tokenizer(), _convert_="all")
    for key, default in defaults_node(TextDataModule).items():
        # files: resolved paths; seed: ${seed}; max_train_examples: the default run's subset of
        # the embedded corpus (null for a user's files, see test_data_module_defaults_follow_files)
        if key not in ("_target_", "files", "seed", "max_train_examples"):
            assert getattr(data, key) == default, key
    assert cfg.data.seed == cfg.seed


def test_data_module_defaults_follow_files() -> None:
    """The default run's subset applies to the embedded corpus only, never to a user's files."""
    assert compose_config().data.max_train_examples == 180
    assert compose_config(["data.files=[mine.txt]"]).data.max_train_examples is None
    assert compose_config(["data.max_train_examples=null"]).data.max_train_examples is None
    mine = ["data.files=[mine.txt]", "data.max_train_examples=50"]
    assert compose_config(mine).data.max_train_examples == 50


@pytest.mark.parametrize("group", sorted(GROUP_TARGETS))
def test_no_group_file_restates_a_default(group: str) -> None:
    """A YAML value equal to the code's default is a second copy that would drift: group files
    hold only what differs (a teacher's path, a tiny config). Each is judged against the node it
    builds on: ``data/chat.yaml`` against ``ChatDataModule``'s defaults, which it restated."""
    bases = {"base": defaults_node(GROUP_TARGETS[group])}
    for (variant_group, name), target in VARIANT_TARGETS.items():
        if variant_group == group:
            bases[name] = bases["base"] | defaults_node(target)
    for path in sorted(Path(CONF_DIR, group).glob("*.yaml")):
        node = yaml.safe_load(path.read_text()) or {}
        found = [name for name in node.get("defaults", []) if name in bases]
        assert len(found) == 1, f"{path.name} must build on one of {sorted(bases)}"
        defaults = bases[found[0]]
        restated = [
            key for key, value in node.items() if key in defaults and defaults[key] == value
        ]
        assert not restated, f"conf/{group}/{path.name} restates defaults {restated}"


@pytest.mark.parametrize("teacher", ["tiny_llama", "tiny_gpt2"])
def test_the_smoke_teachers_end_of_text_is_its_tokenizers(teacher) -> None:
    """tiny_llama held LlamaConfig's bos 1 and eos 2 (two bytes): its generation stopped at "#"."""
    from lightning_kd.models.loading import TeacherSpec, byte_tokenizer, load_teacher

    cfg = compose_config([f"teacher={teacher}"])
    spec = TeacherSpec(path=None, config=dict(cfg.teacher.config))
    model = load_teacher(spec, "32-true")
    eos = byte_tokenizer().eos_token_id
    assert model.config.eos_token_id == model.generation_config.eos_token_id == eos
    assert getattr(model.config, "pad_token_id", None) != eos, "its embedding would be frozen"


def test_from_python_a_missing_config_dir_or_option_is_refused_as_the_command_refuses_it(
    tmp_path,
) -> None:
    """compose_config composed without a config dir that does not exist (Hydra skips it) and
    raised Hydra's MissingConfigException for an unknown option (probe 40)."""
    from lightning_kd.launch.config import compose_config
    from lightning_kd.utils.refusal import Refused

    with pytest.raises(Refused, match=r"config_dirs: \['.*/mine'\] are no directories"):
        compose_config([], config_dirs=[tmp_path / "mine"])
    # The command's own line, with the nearest option and no internal "base" (probe 41).
    with pytest.raises(Refused) as refused:
        compose_config(["teacher=smolm2"])
    said = str(refused.value)
    assert said.startswith("teacher=smolm2: the config group teacher has no option 'smolm2'; ")
    assert "did you mean teacher=smollm2?" in said and "base" not in said
    (tmp_path / "own" / "teacher").mkdir(parents=True)
    (tmp_path / "own" / "teacher" / "mine.yaml").write_text("path: smollm2\n")
    with pytest.raises(Refused, match=r"did you mean teacher=mine\?"):
        compose_config(["teacher=mines"], config_dirs=[tmp_path / "own"])
