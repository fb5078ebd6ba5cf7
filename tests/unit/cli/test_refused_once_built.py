"""Values refused only once the models are built (a module path, a layer order, a LoRA target,
a split of the data): exit 2 with the message alone, as every refusal, where each was a
ValueError or CaptureError traceback with exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli.test_refused_values import assert_refused

FEATURES = "distill.features=[{student: model.layers.9, teacher: model.layers.1}]"

ONCE_BUILT = {
    "a feature module the student lacks": (
        ["train", FEATURES],
        "the student (LlamaForCausalLM) has no module 'model.layers.9'; nearest valid paths",
    ),
    "spans over layers out of teacher order": (
        ["train", "student.layers=[3,1]"],
        "distill.features=spans needs student layers copied in teacher order; [3, 1] is not",
    ),
    "a LoRA target of no module": (
        ["train", "student.lora={r: 4, target_modules: [qproj]}"],
        "student.lora.target_modules: 'qproj' matches no module of the student",
    ),
    "val_split of text data": (
        ["generate", "generate.prompts=val_split"],
        "with data=text use generate.prompts=train_split",
    ),
}


@pytest.mark.parametrize("case", ONCE_BUILT)
def test_a_value_refused_once_the_models_are_built_exits_2(case, tmp_path: Path, capsys) -> None:
    (command, override), named = ONCE_BUILT[case]
    argv = [command, "debug=smoke", override, f"hydra.run.dir={tmp_path / 'run'}"]
    assert_refused(argv, [named], capsys)
