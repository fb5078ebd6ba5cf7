"""Encoder distillation (BERT-style, no LM head): hidden-state matching and embedding cosine."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.distill.objective import DistillConfig
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from lightning_kd.training.module import DistillationModule
from tests.conftest import make_datamodule, make_trainer

TINY_BERT = {
    "model_type": "bert",
    "vocab_size": 257,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


def test_encoder_distillation_by_hidden_states(corpus) -> None:
    module = DistillationModule(
        teacher=TeacherSpec(path=None, config=dict(TINY_BERT), task="encoder"),
        # A randomly initialised student (a copied one starts almost at the optimum).
        student=StudentSpec(config={"num_hidden_layers": 2}),
        distill=DistillConfig(kd_weight=0.0, ce_weight=0.0, features="uniform", feature_loss="mse"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3),
        tokenizer=byte_tokenizer(),
    )
    dm = make_datamodule([corpus])
    trainer = make_trainer(max_steps=20, limit_val_batches=2)
    before = trainer.validate(module, dm, verbose=False)[0]
    trainer.fit(module, dm)
    after = trainer.validate(module, dm, verbose=False)[0]
    assert [p.teacher for p in module.distiller.layer_pairs] == [
        "encoder.layer.0",
        "encoder.layer.3",
    ]
    assert "val/ppl" not in after
    assert after["val/features"] < before["val/features"]
    assert after["val/embedding_cosine"] > before["val/embedding_cosine"]
    assert 0.0 < after["val/embedding_cosine"] <= 1.0


def test_an_encoders_batch_of_input_ids_alone_is_read_as_every_position_attended() -> None:
    """Its mask and labels are optional (``distill/batches.py``), yet a batch without the mask
    was a KeyError in the step, and one without labels in evaluate (probe 51)."""
    distiller = encoder_distiller()
    ids = torch.randint(1, 257, (2, 8))
    whole = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    objective, sums = distiller({"input_ids": ids})
    want, want_sums = distiller(whole)
    assert float(objective.detach()) == float(want.detach())
    assert int(sums.tokens) == int(want_sums.tokens) == 16
    got = distiller.evaluate({"input_ids": ids})
    assert got.keys() == distiller.evaluate(whole).keys() >= {"features", "embedding_cosine"}
    for name, (total, count) in distiller.evaluate(whole).items():
        assert float(got[name][0]) == float(total) and float(got[name][1]) == float(count)


def test_a_narrower_encoder_student_validates_without_an_embedding_cosine() -> None:
    """Its sentence embeddings are in another space: the cosine to the teacher's was a torch
    error in the first validation (probe 54); its features still train through projectors."""
    distiller = encoder_distiller(hidden_size=24, intermediate_size=48)
    ids = torch.randint(1, 257, (2, 8))
    objective, _ = distiller({"input_ids": ids})
    assert float(objective) > 0 and len(distiller.projectors) == 2
    figures = distiller.evaluate({"input_ids": ids})
    assert "features" in figures and "embedding_cosine" not in figures


def test_an_encoders_sentence_pair_is_read_with_its_segments() -> None:
    """token_type_ids were dropped: a sentence pair was distilled as all segment A (verify 53)."""
    distiller = encoder_distiller()
    ids = torch.randint(1, 257, (2, 8))
    pair = torch.tensor([[0] * 4 + [1] * 4] * 2)
    one, _ = distiller({"input_ids": ids})
    two, _ = distiller({"input_ids": ids, "token_type_ids": pair})
    same, _ = distiller({"input_ids": ids, "token_type_ids": torch.zeros_like(pair)})
    assert float(same.detach()) == float(one.detach()) != float(two.detach())
    with pytest.raises(ValueError, match=r"token_type_ids is list"):
        distiller({"input_ids": ids, "token_type_ids": pair.tolist()})


def encoder_distiller(**student):
    """A 4-layer BERT teacher and a 2-layer one (``student``: other config values), feature
    matching alone, in eval mode."""
    from lightning_kd.distill.distiller import Distiller
    from lightning_kd.models.loading import model_from_config

    torch.manual_seed(0)
    teacher = model_from_config(dict(TINY_BERT), "encoder").eval()
    student = model_from_config({**TINY_BERT, "num_hidden_layers": 2, **student}, "encoder").eval()
    config = DistillConfig(kd_weight=0.0, ce_weight=0.0, features="uniform", feature_loss="mse")
    return Distiller(teacher, student, config, task="encoder").eval()
