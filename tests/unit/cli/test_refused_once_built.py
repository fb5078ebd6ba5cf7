"""Values refused only once the models are built (a module path, a layer order, a LoRA target,
a split of the data): exit 2 with the message alone, as every refusal, where each was a
ValueError or CaptureError traceback with exit 1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.cli.test_refused_values import assert_refused

FEATURES = "distill.features=[{student: model.layers.9, teacher: model.layers.1}]"

ONCE_BUILT = {
    "a feature module the student lacks": (
        ["train", FEATURES],
        "the student (LlamaForCausalLM) has no module 'model.layers.9'; nearest valid paths",
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


def test_a_refusal_after_the_run_wrote_its_logs_says_to_rerun_with_overwrite(
    tmp_path: Path, capsys
) -> None:
    """A bad streamed row found by the validation before training: its logs/ made the fixed
    rerun into the same directory refused ("already holds a run's outputs"), with no word of
    that in the first message. A directory that held outputs before (a resume) gets no such
    advice: overwrite=true would drop them."""
    from hydra.core.hydra_config import HydraConfig

    from lightning_kd.cli.hydra_command import run_hydra
    from lightning_kd.utils.refusal import Refused

    def refused_after_logging(cfg) -> None:
        logs = Path(HydraConfig.get().runtime.output_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "metrics.csv").write_text("step\n")
        raise Refused("row 300: content is null")

    def refused_in(run: Path) -> str:
        with pytest.raises(SystemExit) as exit_:
            run_hydra(refused_after_logging, ["debug=smoke", f"hydra.run.dir={run}"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("\nlightning-kd: row 300: content is null")  # its own line
        return err

    fresh = tmp_path / "fresh"
    assert (
        f"{fresh} now holds this attempt's logs: once fixed, run the same command with "
        "overwrite=true" in refused_in(fresh)
    )
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    (resumed / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's")
    os.utime(resumed / "checkpoints", (0, 0))
    assert "overwrite" not in refused_in(resumed)  # (its checkpoint: a resume of that run)
