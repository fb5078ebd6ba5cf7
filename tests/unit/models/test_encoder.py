"""Encoder distillation (BERT-style, no LM head): hidden-state matching and embedding cosine."""

from __future__ import annotations

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
