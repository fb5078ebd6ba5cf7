"""student.layers=importance: layer scores against direct computations, the choice they make,
calibration on the training split only, and the run that records, reports and resumes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from lightning_kd.cli.importance import main
from lightning_kd.launch import importance
from lightning_kd.launch.config import CONF_DIR, register_defaults
from lightning_kd.launch.importance import calibration_batches, choose_layers, rank_for_student
from lightning_kd.models.layer_scores import greedy_removal, rank_layers, teacher_pass, top_layers
from lightning_kd.models.loading import StudentSpec, TeacherSpec, load_teacher
from lightning_kd.models.student import build_student, student_from_teacher
from tests.conftest import make_datamodule
from tests.integration.test_cli import command_here


@pytest.fixture
def teacher(tiny_teacher: TeacherSpec):
    return load_teacher(tiny_teacher)


@pytest.fixture
def batches() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 257, (2, 3, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids[0])
    mask[1, 10:] = 0  # padding is scored nowhere
    return [{"input_ids": block, "attention_mask": mask} for block in ids]


def test_block_influence_is_one_minus_cosine_of_each_layers_input_and_output(
    teacher, batches
) -> None:
    influence, _ = teacher_pass(teacher, batches)
    values, count = torch.zeros(4), 0
    for batch in batches:
        hidden = teacher(**batch, output_hidden_states=True).hidden_states
        mask = batch["attention_mask"].bool()
        # hidden_states[4] is after the final RMSNorm, whose unit weight leaves the cosine as is.
        for i in range(4):
            values[i] += (1 - F.cosine_similarity(hidden[i], hidden[i + 1], dim=-1))[mask].sum()
        count += int(mask.sum())
    torch.testing.assert_close(torch.tensor(influence, dtype=torch.float32), values / count)


def test_skip_kl_is_the_kl_of_the_teacher_built_without_that_layer(teacher, batches) -> None:
    ranking = rank_for_student(teacher, StudentSpec(layers="importance", num_layers=2), batches)
    for i in range(4):
        pruned = student_from_teacher(teacher, [j for j in range(4) if j != i]).eval()
        total, count = 0.0, 0
        for batch in batches:
            mask = batch["attention_mask"].bool()
            target = teacher(**batch).logits.log_softmax(-1)[mask]
            logp = pruned(**batch).logits.log_softmax(-1)[mask]
            total += F.kl_div(logp, target, log_target=True, reduction="sum").item()
            count += int(mask.sum())
        assert ranking.scores["skip_kl"][i] == pytest.approx(total / count, rel=1e-4)
    assert ranking.tokens == count


def test_first_and_last_are_kept_unless_keep_ends_is_off() -> None:
    scores = [0.1, 0.9, 0.5, 0.8, 0.2]
    assert sorted(top_layers(scores, 3, keep_ends=True)[:3]) == [0, 1, 4]
    assert sorted(top_layers(scores, 3, keep_ends=False)[:3]) == [1, 2, 3]
    assert top_layers(scores, 1, keep_ends=True)[:1] == [1]  # one layer cannot keep both ends


def test_greedy_removes_the_layer_whose_loss_hurts_least_and_never_a_fixed_one() -> None:
    cost = [5.0, 1.0, 3.0, 2.0, 0.5]
    calls = []

    def removal_kl(remaining: list[int]) -> float:
        calls.append(remaining)
        return sum(c for i, c in enumerate(cost) if i not in remaining)

    scores = greedy_removal(2, 5, removal_kl, fixed=(4,))
    assert scores == [None, 1.0, 6.0, 3.0, None]  # 1 went first (KL 1), then 3 (1+2), then 2
    assert all(4 in remaining for remaining in calls)


def test_the_bar_counts_every_pass_greedy_removal_makes(teacher, batches, capsys) -> None:
    """1 teacher pass, 4 without one layer, then greedy from 4 layers to 2 with the ends fixed:
    2 trials, then 1."""
    rank_layers(teacher, batches, 2, "greedy_kl", progress=True)
    assert "| 8/8 [" in capsys.readouterr().err


def test_calibration_reads_only_training_blocks(corpus: Path) -> None:
    datamodule = make_datamodule([corpus])
    batches = calibration_batches(datamodule, 3)
    val = {tuple(example.tolist()) for example in datamodule.val_examples}
    for batch, example in zip(batches, datamodule.train_examples, strict=False):
        assert torch.equal(batch["input_ids"][0], example)
        assert tuple(example.tolist()) not in val
    with pytest.raises(ValueError, match=r"calibration_blocks=999 but the training split has"):
        calibration_batches(datamodule, 999)


def test_bad_importance_settings_name_the_value_and_the_fix(teacher, batches) -> None:
    spec = StudentSpec(layers="importance", num_layers=9)
    with pytest.raises(ValueError, match=r"num_layers=9 is larger than the teacher's 4 layers; "):
        rank_for_student(teacher, spec, batches)
    with pytest.raises(ValueError, match=r"choose 1\.\.4"):
        rank_for_student(teacher, spec, batches)
    with pytest.raises(ValueError, match=r"student.layers='importanc'; give teacher layer"):
        StudentSpec(layers="importanc")
    with pytest.raises(ValueError, match=r"student.importance='cka'; choose one of"):
        StudentSpec(layers="importance", importance="cka")
    with pytest.raises(ValueError, match=r"keeps student.num_layers layers; set it"):
        StudentSpec(layers="importance", num_layers=None)
    with pytest.raises(ValueError, match=r"must be resolved to layer indices"):
        build_student(StudentSpec(layers="importance"), teacher, "causal_lm")


def test_the_command_prints_the_table_without_training(capsys) -> None:
    main(["debug=smoke", "student.num_layers=3", "student.calibration_blocks=2"])
    out, err = capsys.readouterr()
    assert "| layer | block_influence | skip_kl | rank | kept |" in out
    assert "kept by skip_kl (3 layers, 128 calibration tokens" in out
    assert "student.layers=[0," in out and ",3]" in out
    # Minutes of a CPU's time for a real teacher, which said nothing (probe 41): a bar counts
    # the teacher's pass and one pass per layer left out.
    assert "scoring layers: 100%" in err and "| 5/5 [" in err


def test_keeping_every_teacher_layer_skips_the_ranking(tmp_path: Path, capsys, monkeypatch) -> None:
    def never(cfg):
        raise AssertionError("ranked although every layer is kept")

    monkeypatch.setattr(importance, "score_config", never)
    register_defaults()
    overrides = ["debug=smoke", "student.layers=importance", f"output_dir={tmp_path}"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, "student.num_layers=4"])
    assert choose_layers(cfg) == ([0, 1, 2, 3], None)
    assert "student.num_layers=4 keeps every teacher layer" in capsys.readouterr().out
    assert not (tmp_path / "importance.json").exists()


@pytest.mark.integration  # runs the command line (in this process)
def test_a_run_records_the_scores_reports_them_and_resumes_with_the_same_layers(
    tmp_path: Path, capsys
) -> None:
    run_dir = tmp_path / "run"
    common = ["debug=smoke", "student.layers=importance", "student.num_layers=3"]
    result = command_here(capsys, "run", *common, "trainer.max_steps=3", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((run_dir / "importance.json").read_text())
    assert saved["by"] == "skip_kl" and len(saved["scores"]["block_influence"]) == 4
    kept = saved["kept"]
    assert len(kept) == 3 and kept[0] == 0 and kept[-1] == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["importance"]["kept"] == kept
    assert summary["importance"]["scores"] == saved["scores"]
    markdown = (run_dir / "summary.md").read_text()
    assert f"| student layers (by skip_kl) |  | {', '.join(map(str, kept))} |" in markdown
    assert "| layer | block_influence | skip_kl | rank | kept |" in markdown

    # Whatever a new scoring would pick, the resume rebuilds the checkpoint's student.
    resumed = command_here(
        capsys,
        "run",
        *common,
        "student.importance=block_influence",
        "trainer.max_steps=6",
        "resume_reset_optimizer=true",  # a longer run is a new schedule, applied on purpose
        "ckpt_path=last",
        f"hydra.run.dir={run_dir}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "student layers by" not in resumed.stdout  # nothing scored again
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["importance"]["kept"] == kept
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["student"]["layers"] == kept
