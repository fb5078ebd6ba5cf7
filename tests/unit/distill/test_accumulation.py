"""Feature matching in training: the lifecycle under accumulation and checkpointing, and exact
gradient accumulation (the issue's seed scenario)."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader

from lightning_kd.distill.accumulation import Window
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.losses import IGNORE_INDEX
from lightning_kd.losses.logits import LossSums
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from lightning_kd.training.module import DistillationModule
from lightning_kd.training.optim import decay_groups
from tests.conftest import TINY_GPT2, TINY_LLAMA, checkpoints_activations, make_trainer


def padded_batches(count: int, seed: int = 0, rows: int = 3, length: int = 16) -> list[dict]:
    """Micro-batches of right-padded rows with different token counts and masked prompts."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(0, 256, (rows, length), generator=generator)
        lengths = torch.randint(4, length + 1, (rows,), generator=generator)
        attention = (torch.arange(length)[None, :] < lengths[:, None]).long()
        labels = ids.masked_fill(attention == 0, IGNORE_INDEX)
        labels[0, :2] = IGNORE_INDEX  # a masked prompt
        batches.append({"input_ids": ids, "attention_mask": attention, "labels": labels})
    return batches


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the gradient it applies at every step."""

    def __init__(self, params, lr: float = 1e-2) -> None:
        super().__init__(params, lr=lr)
        self.applied: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                closure()  # backward + Lightning's on_before_optimizer_step (our rescale)
        self.applied.append([p.grad.clone() for g in self.param_groups for p in g["params"]])
        return super().step()


def make(
    dtype: str = "float64",
    checkpointing: bool = False,
    config: dict = TINY_LLAMA,
    optimizer=RecordingSGD,
    **distill,
) -> DistillationModule:
    return DistillationModule(
        teacher=TeacherSpec(path=None, config=dict(config), dtype=dtype),
        # Every student weight trains, embeddings too, and the chunk math runs eagerly: these
        # tests check exactness on all gradients (compiled = eager is test_chunked's).
        student=StudentSpec(
            num_layers=2,
            dtype=dtype,
            activation_checkpointing=checkpointing,
            freeze_embeddings=False,
        ),
        distill=DistillConfig(**({"compile": False} | distill)),
        optimizer=optimizer,
        tokenizer=byte_tokenizer(),
    )


def fit(module: DistillationModule, batches: list[dict], accumulate: int, **trainer) -> list:
    options = {
        "max_epochs": 1,
        "max_steps": -1,
        "accumulate_grad_batches": accumulate,
        "limit_val_batches": 0,
        "log_every_n_steps": 1,
    }
    make_trainer(**(options | trainer)).fit(module, DataLoader(batches, batch_size=None))
    return getattr(module.trainer.optimizers[0], "applied", None)


def reference_gradients(module: DistillationModule, batches: list[dict], accumulate: int) -> list:
    """One optimizer step per window, on the token mean of the window's micro-batches."""
    module.configure_model()
    optimizer = RecordingSGD(
        decay_groups(module.distiller.trainable_parameters())
    )  # same order as fit
    windows = [batches[i : i + accumulate] for i in range(0, len(batches), accumulate)]
    losses = []
    for window in windows:
        optimizer.zero_grad()
        parts = [module.distiller(batch) for batch in window]
        tokens = sum(sums.tokens for _, sums in parts)
        loss = sum(objective for objective, _ in parts) / tokens
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return optimizer.applied, losses


FEATURES = [
    {"student": "transformer.h.0", "teacher": "transformer.h.0", "loss": "cosine"},
    {
        "student": "transformer.h.1.mlp",
        "teacher": "transformer.h.3.mlp",
        "loss": "mse",
        "weight": 0.5,
    },
]


@pytest.mark.parametrize("count", [16, 14])  # 14 = 4 + 4 + 4 + a partial window of 2
def test_accumulated_gradients_equal_one_batch_of_the_window(count: int) -> None:
    batches = padded_batches(count)
    distill = {"kd_weight": 0.6, "ce_weight": 0.4, "features": FEATURES, "chunk_size": 5}
    torch.manual_seed(0)
    applied = fit(make(config=TINY_GPT2, **distill), batches, accumulate=4, gradient_clip_val=None)
    torch.manual_seed(0)
    module = make(config=TINY_GPT2, **distill)
    expected, _ = reference_gradients(module, batches, accumulate=4)
    assert len(applied) == len(expected) == -(-count // 4)
    for step, (got, want) in enumerate(zip(applied, expected, strict=True)):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-14, msg=f"step {step}")


def test_logged_loss_is_the_window_token_mean() -> None:
    batches = padded_batches(6)
    distill = {"kd_weight": 0.5, "ce_weight": 0.5, "chunk_size": 4}
    module = make(config=TINY_GPT2, **distill)
    fit(module, batches, accumulate=3)
    _, losses = reference_gradients(make(config=TINY_GPT2, **distill), batches, accumulate=3)
    logged = module.trainer.callback_metrics["train/loss"]
    torch.testing.assert_close(logged.double(), losses[-1], rtol=1e-6, atol=1e-6)


def test_the_logged_loss_leaves_out_the_ce_it_did_not_train() -> None:
    """A sampled completion's CE is reported (train/ce) but not trained (on-policy KD): the
    logged train/loss added it back, 2.89 logged for 0.88 per token optimised."""
    objective = DistillConfig(kd_weight=0.5, ce_weight=0.5).logit_objective()
    window = Window()
    teacher = LossSums(kd=torch.tensor(4.0), ce=torch.tensor(10.0), tokens=torch.tensor(2))
    sampled = LossSums(kd=torch.tensor(2.0), ce=torch.tensor(30.0), tokens=torch.tensor(2))
    sampled.ce_trained = False
    window.add(teacher)
    window.add(sampled)
    means = Window.means(window.reduced(), objective)
    assert float(means["loss"]) == 0.5 * 6.0 / 4 + 0.5 * 10.0 / 4  # what the two objectives summed
    assert float(means["ce"]) == 40.0 / 4 and "ce_trained" not in means


def test_the_span_term_is_summed_apart_by_the_config_not_by_the_batches() -> None:
    """train/span: the span term inside kd. A micro-batch with none (a domain no teacher of
    another tokenizer teaches) adds 0, so every rank sums the same terms for the reduce."""
    objective = DistillConfig().logit_objective()
    window = Window(span=True)
    spanned = LossSums(kd=torch.tensor(4.0), ce=torch.tensor(10.0), tokens=torch.tensor(2))
    spanned.span = torch.tensor(1.5)
    window.add(spanned)
    window.add(LossSums(kd=torch.tensor(2.0), ce=torch.tensor(6.0), tokens=torch.tensor(2)))
    means = Window.means(window.reduced(), objective)
    assert float(means["span"]) == 1.5 / 4 and float(means["kd"]) == 6.0 / 4
    plain = Window()  # no span term in the config: none reported, whatever the sums hold
    plain.add(spanned)
    assert "span" not in Window.means(plain.reduced(), objective)


class LifecycleProbe(Callback):
    """After every training batch: no capture is armed and none holds a tensor."""

    def __init__(self) -> None:
        self.checked = 0

    def on_train_batch_end(self, trainer, module, *args) -> None:
        for capture in module.distiller.captures.values():
            assert not capture.armed and capture.records == {}
        self.checked += 1


@pytest.mark.parametrize("accumulate", [1, 4, 16])
def test_seed_scenario_no_warnings_and_features_change_gradients(accumulate: int) -> None:
    batches = padded_batches(16)
    probe = LifecycleProbe()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        module = make(dtype="float32", features="uniform", kd_weight=0.5, ce_weight=0.5)
        with_features = fit(module, batches, accumulate, callbacks=[probe])
    capture_warnings = [
        str(w.message)
        for w in caught
        if "captur" in str(w.message).lower() or "hook" in str(w.message).lower()
    ]
    assert capture_warnings == []
    assert probe.checked == 16
    assert module.trainer.callback_metrics["train/features"] > 0

    torch.manual_seed(0)
    without = fit(make(dtype="float32", kd_weight=0.5, ce_weight=0.5), batches, accumulate)
    first_with, first_without = with_features[0], without[0]
    assert any(not torch.allclose(a, b) for a, b in zip(first_with, first_without, strict=True))


def test_checkpointing_records_once_and_matches_gradients() -> None:
    """Hooks inside checkpointed layers fire again in backward; captures still record once."""
    batches = padded_batches(4)
    features = [
        {"student": "model.layers.0.self_attn", "teacher": "model.layers.0.self_attn"},
        {"student": "model.layers.1.mlp", "teacher": "model.layers.3.mlp"},
    ]
    distill = {"kd_weight": 0.5, "ce_weight": 0.5, "features": features}
    fired = []

    class CountFires(Callback):
        def on_fit_start(self, trainer, module) -> None:
            for path in ("model.layers.0.self_attn", "model.layers.1.mlp"):
                module.student.get_submodule(path).register_forward_hook(
                    lambda *args, path=path: fired.append(path)
                )

    torch.manual_seed(0)
    plain = fit(make(**distill), batches, accumulate=2)
    torch.manual_seed(0)
    checkpointed_module = make(checkpointing=True, **distill)
    checkpointed = fit(checkpointed_module, batches, accumulate=2, callbacks=[CountFires()])
    assert checkpoints_activations(checkpointed_module.student)
    # 4 armed forwards; recompute in backward fires again (self_attn at least), unrecorded.
    assert fired.count("model.layers.0.self_attn") > 4
    for got, want in zip(checkpointed, plain, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13)


def live_tensors() -> int:
    gc.collect()
    # isinstance on every live object touches deprecated module attributes, which warn.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


def test_no_tensor_growth_over_200_steps() -> None:
    batches = padded_batches(200, rows=2, length=8)
    counts = []

    class Count(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if batch_idx in (20, 199):
                counts.append(live_tensors())

    module = make(
        dtype="float32",
        optimizer=torch.optim.AdamW,
        features="uniform",
        kd_weight=0.5,
        ce_weight=0.5,
    )
    fit(module, batches, accumulate=1, callbacks=[Count(), LifecycleProbe()])
    assert counts[1] <= counts[0], counts


def test_a_pair_whose_module_never_runs_is_an_error() -> None:
    """The chunked loss never calls lm_head; a pair on it fails loudly instead of training on."""
    features = [{"student": "lm_head", "teacher": "lm_head"}]
    module = make(dtype="float32", features=features)
    with pytest.raises(Exception, match=r"\['lm_head'\] did not run"):
        fit(module, padded_batches(2), accumulate=1)
