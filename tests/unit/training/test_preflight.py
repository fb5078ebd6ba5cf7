"""What used to fail at step 1 is refused before the first batch, naming the key and the fix."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.preflight import Preflight
from lightning_kd.utils.refusal import Refused
from tests.conftest import make_datamodule, make_module, make_trainer


def fit(teacher, corpus: Path, block_size: int = 32, student=None, **distill) -> None:
    trainer = make_trainer(max_steps=1, callbacks=[Preflight()])
    module = make_module(teacher, student, **distill)
    trainer.fit(module, make_datamodule([corpus], block_size=block_size))


def test_a_feature_module_the_step_never_runs_is_refused(tiny_teacher, corpus: Path) -> None:
    head = [{"student": "lm_head", "teacher": "model.layers.3"}]
    with pytest.raises(ValueError, match=r"student module 'lm_head' never runs in the training"):
        fit(tiny_teacher, corpus, features=head)
    fit(tiny_teacher, corpus, features=head, chunked=False)  # the full-logit step runs the head


def test_a_projector_sized_from_a_wrong_guess_is_refused(tiny_teacher, corpus: Path) -> None:
    # The MLP's activation is 64 wide; read off the structure, it looks 32 wide (the residual).
    inner = [{"student": "model.layers.0.mlp.act_fn", "teacher": "model.layers.0"}]
    with pytest.raises(ValueError, match=r"output 64 and 32 wide .* built for 32 -> 32"):
        fit(tiny_teacher, corpus, features=inner)


def test_a_block_longer_than_the_positions_is_refused(tiny_teacher, corpus: Path) -> None:
    with pytest.raises(ValueError, match=r"data.block_size=200 is longer than the teacher's 128"):
        fit(tiny_teacher, corpus, block_size=200)


def test_an_encoder_teacher_without_features_is_refused_up_front() -> None:
    cfg = compose_config(["experiment=minilm", "distill.features=null"], output_dir="/x")
    assert any(
        e.startswith("teacher.task=encoder with distill.features unset") for e in config_errors(cfg)
    )


def test_a_causal_lm_whose_attention_reads_both_ways_is_refused(corpus: Path) -> None:
    """A BERT built as a causal LM from Python (past the launch's config check): its logits see
    the tokens they predict, and the run trained to exit 0 with distill.chunked=false."""
    bert = {
        "model_type": "bert",
        "vocab_size": 257,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
    }
    teacher = TeacherSpec(path=None, config=bert, dtype="float32")
    with pytest.raises(Refused, match=r"the teacher \(BertLMHeadModel\) is not causal"):
        fit(teacher, corpus, chunked=False)


def test_a_feature_pair_no_trained_parameter_feeds_is_said(tiny_teacher, corpus: Path) -> None:
    """Its term was a constant computed each step for nothing, said nowhere (found in the
    validation's inference mode too, where nothing requires grad)."""
    pairs = [
        {"student": "model.layers.0", "teacher": "model.layers.1"},
        {"student": "model.layers.1", "teacher": "model.layers.3"},
    ]
    frozen = {"freeze_layers": 1, "freeze_embeddings": True}
    with pytest.warns(UserWarning, match=r"side of model.layers.0 -> model.layers.1 \("):
        fit(tiny_teacher, corpus, student=frozen, features=pairs)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="distill.features: no trained parameter")
        fit(tiny_teacher, corpus, features=pairs)


def test_an_on_policy_warm_up_as_long_as_the_run_is_said(tiny_teacher, corpus: Path) -> None:
    """No step sampled, the student was the one distill.on_policy=0 trains, and the run said
    on-policy KD scored the student's own completions (probe 55); a run by epochs, whose steps
    are known only once its data is, ran without a word (re-check 57)."""
    from lightning.pytorch import Callback

    from lightning_kd.distill.on_policy import OnPolicy

    class WarmedUp(Callback):  # a sampler that never samples: its warm-up outlasts the run
        def __init__(self, warmup: int) -> None:
            self.warmup = warmup

        def on_fit_start(self, trainer, module) -> None:
            module.distiller.on_policy = OnPolicy(0.5, 4, 1.0, 0, (), 0, warmup=self.warmup)

    def fit_with_warmup(warmup: int, **trainer) -> None:
        callbacks = [WarmedUp(warmup), Preflight()]
        datamodule = make_datamodule([corpus], block_size=32)
        make_trainer(callbacks=callbacks, **trainer).fit(make_module(tiny_teacher), datamodule)

    by_epochs = {"max_steps": -1, "max_epochs": 1, "limit_train_batches": 3}
    with pytest.warns(UserWarning, match=r"on_policy_warmup=3 is not below the run's 3 steps"):
        fit_with_warmup(3, **by_epochs)
    with pytest.warns(UserWarning, match=r"on_policy_warmup=9 is not below trainer.max_steps=2: "):
        fit_with_warmup(9, max_steps=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="distill.on_policy_warmup")
        fit_with_warmup(2, **by_epochs)  # step 2 samples


@pytest.mark.parametrize("role", ["student", "teacher"])
def test_weights_of_nan_are_named_not_called_an_encoder(tiny_teacher, corpus: Path, role) -> None:
    """The causality check compared NaN with NaN: a damaged file was "not causal", or a
    RuntimeError about a negative tolerance (probe 59)."""
    from lightning.pytorch import Callback

    class Damaged(Callback):
        def on_fit_start(self, trainer, module) -> None:
            model = getattr(module.distiller, role)
            with torch.no_grad():
                model.model.layers[1].self_attn.v_proj.weight[0, :5] = float("nan")

    module = make_module(tiny_teacher)
    trainer = make_trainer(max_steps=1, callbacks=[Damaged(), Preflight()])
    weights = rf"^the {role} \(LlamaForCausalLM\) has weights that are NaN or infinite: "
    with pytest.raises(Refused, match=weights + r"model.layers.1.self_attn.v_proj.weight \(5\)"):
        trainer.fit(module, make_datamodule([corpus], block_size=32))
