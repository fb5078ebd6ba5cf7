"""A non-finite loss stops training before its step; nothing non-finite is saved or reported."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from lightning_kd.training.finite import NonFiniteError, check_finite_loss, strict_json
from tests.conftest import make_datamodule, make_module, make_trainer


def test_strict_json_writes_null_for_nan_and_infinity() -> None:
    summary = {"after": {"val/ppl": math.nan, "val/kl": 0.5}, "x": [math.inf, 1.0], "n": 3}
    text = json.dumps(strict_json(summary), allow_nan=False)
    assert json.loads(text) == {"after": {"val/ppl": None, "val/kl": 0.5}, "x": [None, 1.0], "n": 3}


def test_the_loss_check_names_the_step_and_every_part() -> None:
    check_finite_loss(3, {"loss": torch.tensor(1.0), "kd": 0.5})
    with pytest.raises(NonFiniteError, match=r"optimizer step 7 \(loss=nan, kd=nan, ce=inf\)"):
        check_finite_loss(7, {"loss": math.nan, "kd": torch.tensor(math.nan), "ce": math.inf})


def test_an_infinite_kd_term_alone_names_the_divergence_not_the_rate() -> None:
    """Reverse KL (and JSD at beta 1) is +inf where the teacher rules a token out (a logit of
    -inf) that the student does not: lowering the learning rate, the general advice, would
    change nothing."""
    with pytest.raises(NonFiniteError, match=r"KD term alone is infinite at optimizer step 2") as e:
        check_finite_loss(2, {"loss": math.inf, "kd": torch.tensor(math.inf), "ce": 3.0})
    assert "distill.divergence=forward_kl" in str(e.value) and "optimizer.lr" not in str(e.value)


def test_a_nan_kd_term_beside_a_finite_ce_names_the_teacher_not_the_rate() -> None:
    """A teacher's NaN (kd=nan, ce finite) was told to lower optimizer.lr, and the stop report
    printed a resume with a tenth of it and a fresh optimizer, which cannot help (probe 47)."""
    with pytest.raises(NonFiniteError, match=r"KD term alone is NaN at optimizer step 5") as e:
        check_finite_loss(5, {"loss": math.nan, "kd": math.nan, "ce": 2.5, "features": 0.1})
    assert "teacher's distribution holds a NaN" in str(e.value) and not e.value.lower_rate
    with pytest.raises(NonFiniteError) as student:  # the student's own CE NaN too: its rate
        check_finite_loss(5, {"loss": math.nan, "kd": math.nan, "ce": math.nan})
    assert student.value.lower_rate and "Lower optimizer.lr" in str(student.value)


def test_a_diverging_run_stops_before_the_step_that_would_apply_nan(
    tiny_teacher, corpus: Path, tmp_path: Path
) -> None:
    module = make_module(tiny_teacher)
    module.optimizer_factory = lambda params: torch.optim.SGD(params, lr=1e30)
    trainer = make_trainer(tmp_path, max_steps=20)
    with pytest.raises(NonFiniteError, match=r"not finite at optimizer step (\d+)") as error:
        trainer.fit(module, make_datamodule([corpus]))
    step = int(re.search(r"step (\d+)", str(error.value)).group(1))
    assert trainer.global_step == step - 1, "the step with the non-finite loss was not applied"


def test_a_non_finite_final_validation_is_not_a_finished_run() -> None:
    """Early stopping on a NaN validation ended with exit 0, the student exported, after-ppl
    nan (probe 47)."""
    from lightning_kd.training.finite import check_finite_validation

    check_finite_validation({"val/ppl": 233.3, "val/loss": 5.45, "val/kl": 0.2}, 15)
    check_finite_validation({}, 15)  # FSDP's skipped final validation: nothing to judge
    with pytest.raises(
        NonFiniteError, match=r"not finite at optimizer step 5 \(val/ppl=nan\)"
    ) as e:
        check_finite_validation({"val/ppl": math.nan, "val/teacher_ppl": 14.5}, 5)
    assert "it is not exported" in str(e.value) and not e.value.lower_rate
