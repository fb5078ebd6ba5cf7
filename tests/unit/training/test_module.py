"""The LightningModule: frozen teacher, optimizer, checkpoints, metrics, chunked vs full."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_kd.data.batches import Unscored
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from lightning_kd.training.checkpoints import CheckpointError
from lightning_kd.training.module import DistillationModule
from tests.conftest import make_datamodule, make_module, make_trainer
from tests.unit.models.test_encoder import TINY_BERT


def teacher_snapshot(module: DistillationModule) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.teacher.state_dict().items()}


def test_teacher_frozen_and_eval_through_fit_and_validate(tiny_teacher, corpus) -> None:
    module, dm = make_module(tiny_teacher), make_datamodule([corpus])
    trainer = make_trainer(max_steps=4, val_check_interval=2, limit_val_batches=2)
    trainer.validate(module, dm, verbose=False)
    before = teacher_snapshot(module)
    trainer.fit(module, dm)
    trainer.validate(module, dm, verbose=False)
    assert not module.teacher.training
    assert all(not m.training for m in module.teacher.modules())
    assert all(p.grad is None and not p.requires_grad for p in module.teacher.parameters())
    for key, value in module.teacher.state_dict().items():
        torch.testing.assert_close(value, before[key], msg=key)
    assert module.student.training


def test_module_train_keeps_teacher_in_eval(tiny_teacher) -> None:
    module = make_module(tiny_teacher)
    module.configure_model()
    module.train()
    assert not module.teacher.training and module.student.training
    module.eval()
    module.train(True)
    assert not any(m.training for m in module.teacher.modules())


def test_configure_model_is_idempotent(tiny_teacher) -> None:
    module = make_module(tiny_teacher)
    module.configure_model()
    student, teacher = module.student, module.teacher
    module.configure_model()
    assert module.student is student and module.teacher is teacher


def test_a_module_built_before_its_data_learns_the_teachers_domains_when_fit_starts(
    tiny_teacher, corpus, tmp_path
) -> None:
    """Built with no trainer (as ``load_from_checkpoint`` builds it), the distiller does not
    know which rows each teacher teaches; it ran every teacher on every row once fitted."""
    code = tmp_path / "code.txt"
    code.write_text("def add(a, b):\n    return a + b\n" * 30)
    second = {**tiny_teacher.config, "num_hidden_layers": 3}
    module = make_module(
        tiny_teacher,
        teachers=[
            {"name": "a", "weight": 0.5, "domains": ["code"]},
            {"name": "b", "weight": 0.5, "config": second, "domains": ["prose"]},
        ],
    )
    module.configure_model()
    assert module.distiller.domains.named and module.distiller.domains.weights is None
    domains = {"prose": [str(corpus)], "code": [str(code)]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(max_steps=1).fit(module, make_datamodule([corpus, code], domains=domains))
    # Every teacher's modules are meant to be in eval mode: Lightning's warning said 105.
    assert not [w for w in caught if "in eval mode" in str(w.message)]
    torch.testing.assert_close(
        module.distiller.domains.weights, torch.eye(2, dtype=torch.float64).flip(1)
    )


def test_optimizer_holds_only_student_parameters(tiny_teacher, corpus) -> None:
    module = make_module(tiny_teacher)
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, make_datamodule([corpus]))
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    trainable = {id(p) for p in module.student.parameters() if p.requires_grad}
    assert optimized == trainable  # the frozen embeddings and head (the default) stay out too
    assert not optimized & {id(p) for p in module.teacher.parameters()}


def test_checkpoint_has_no_teacher_and_resumes(tiny_teacher, corpus, tmp_path) -> None:
    dm = make_datamodule([corpus])
    trainer = make_trainer(tmp_path, max_steps=3)
    module = make_module(tiny_teacher)
    trainer.fit(module, dm)
    path = tmp_path / "step3.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    keys = checkpoint["state_dict"].keys()
    assert not [k for k in keys if k.startswith("distiller.teacher.")]
    assert any(k.startswith("distiller.student.") for k in keys)
    assert checkpoint["optimizer_states"] and checkpoint["lr_schedulers"] == []

    resumed = make_module(tiny_teacher)
    trainer = make_trainer(tmp_path, max_steps=5)
    trainer.fit(resumed, dm, ckpt_path=path)
    assert trainer.global_step == 5
    # The teacher is rebuilt from its spec, identical to the one that trained the checkpoint.
    for key, value in resumed.teacher.state_dict().items():
        torch.testing.assert_close(value, module.teacher.state_dict()[key])


def test_load_from_checkpoint_rebuilds_the_module_without_the_teacher_in_the_file(
    tiny_teacher, corpus, tmp_path
) -> None:
    """save_hyperparameters keeps the specs as plain data: a checkpoint read with
    weights_only=True rebuilds the module, its teacher loaded from the spec, its student trained."""
    module = make_module(tiny_teacher, features="uniform")
    trainer = make_trainer(tmp_path, max_steps=2)
    trainer.fit(module, make_datamodule([corpus]))
    path = tmp_path / "trained.ckpt"
    trainer.save_checkpoint(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "missing keys" warning for the teacher either
        loaded = DistillationModule.load_from_checkpoint(path, weights_only=True)
    assert loaded.distill == module.distill and loaded.student_spec == module.student_spec
    for role in ("student", "teacher"):
        want = getattr(module, role).state_dict()
        for key, value in getattr(loaded, role).state_dict().items():
            torch.testing.assert_close(value, want[key], msg=f"{role}.{key}")
    projector = module.distiller.projectors.state_dict()
    for key, value in loaded.distiller.projectors.state_dict().items():
        torch.testing.assert_close(value, projector[key])
    with pytest.raises(ValueError, match="pass optimizer="):
        loaded.configure_optimizers()


def one_step_checkpoint(module, dm, tmp_path: Path, name: str) -> Path:
    """``module`` trained one step on ``dm``, saved as ``tmp_path/name``."""
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.fit(module, dm)
    trainer.save_checkpoint(tmp_path / name)
    return tmp_path / name


def test_checkpoint_missing_student_weights_is_refused(tiny_teacher, corpus, tmp_path) -> None:
    dm = make_datamodule([corpus])
    path = one_step_checkpoint(make_module(tiny_teacher), dm, tmp_path, "bad.ckpt")
    checkpoint = torch.load(path, weights_only=False)
    del checkpoint["state_dict"]["distiller.student.model.norm.weight"]
    torch.save(checkpoint, path)
    with pytest.raises(
        CheckpointError, match=r"lacks 1 student weights.*student.model.norm.weight"
    ):
        make_trainer(tmp_path, max_steps=2).fit(make_module(tiny_teacher), dm, ckpt_path=path)


def test_a_resume_with_another_student_names_the_setting(tiny_teacher, corpus, tmp_path) -> None:
    dm = make_datamodule([corpus])
    path = one_step_checkpoint(make_module(tiny_teacher), dm, tmp_path, "two_layers.ckpt")
    deeper = make_module(tiny_teacher, student={"num_layers": 3})
    with pytest.raises(CheckpointError, match=r"student\.num_layers: checkpoint 2, this run 3"):
        make_trainer(tmp_path, max_steps=2).fit(deeper, dm, ckpt_path=path)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"r": 4, "alpha": 16}, r"student\.lora\.alpha: checkpoint 8, this run 16"),
        ({"r": 8, "alpha": 8}, r"lora_A\.default\.weight: checkpoint \(4, 32\)"),
    ],
)
def test_a_resume_with_another_lora_is_refused(tiny_teacher, corpus, tmp_path, lora, message):
    """Another alpha (or dropout) resumed at another adapter scale, silently; another r was a
    load_state_dict size-mismatch traceback."""
    pytest.importorskip("peft")
    dm = make_datamodule([corpus])
    first = make_module(tiny_teacher, student={"lora": {"r": 4, "alpha": 8}})
    path = one_step_checkpoint(first, dm, tmp_path, "lora.ckpt")
    other = make_module(tiny_teacher, student={"lora": lora})
    with pytest.raises(CheckpointError, match=message):
        make_trainer(tmp_path, max_steps=2).fit(other, dm, ckpt_path=path)


def test_a_lora_resume_spelling_out_the_defaults_goes_on(tiny_teacher, corpus, tmp_path):
    """``{r: 4}`` and ``{r: 4, alpha: 32, dropout: 0.0, target_modules: all-linear}`` build the
    same adapters: the mappings as typed were compared, and the resume refused."""
    pytest.importorskip("peft")
    dm = make_datamodule([corpus])
    first = make_module(tiny_teacher, student={"lora": {"r": 4}})
    path = one_step_checkpoint(first, dm, tmp_path, "lora.ckpt")
    spelt = {"r": 4, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
    other = make_module(tiny_teacher, student={"lora": spelt})
    make_trainer(tmp_path, max_steps=2).fit(other, dm, ckpt_path=path)
    assert other.trainer.global_step == 2


def test_a_resume_draws_the_dropout_the_run_would_have(tiny_teacher, corpus, tmp_path) -> None:
    """The random state is checkpointed and put back before the first resumed batch (after the
    loader's iterator drew from it): a resume restarted the generators from the seed, so a LoRA
    adapter's dropout (or a GPT-2 student's) drew step 0's masks again, and drifted. (The whole
    run through the CLI, interrupted and resumed with LoRA dropout 0.1: bit-identical.)"""
    dm = make_datamodule([corpus])
    path = one_step_checkpoint(make_module(tiny_teacher), dm, tmp_path, "rng.ckpt")
    saved = torch.load(path, weights_only=True)["rng"]["cpu"]
    seen, resumed = [], make_module(tiny_teacher)
    step = resumed.training_step

    def drawing_step(*args, **kwargs):
        seen.append(torch.get_rng_state())  # what the step's dropout draws from
        return step(*args, **kwargs)

    resumed.training_step = drawing_step
    torch.manual_seed(123)  # whatever the process drew since
    make_trainer(tmp_path, max_steps=2).fit(resumed, dm, ckpt_path=path)
    assert torch.equal(seen[0], saved)


def test_a_resume_reports_the_validation_before_training_from_its_checkpoint(
    tiny_teacher, corpus, tmp_path
) -> None:
    dm = make_datamodule([corpus])
    module = make_module(tiny_teacher)
    module.before = {"val/ppl": 123.0}  # as train() sets it from validate_before
    path = one_step_checkpoint(module, dm, tmp_path, "one.ckpt")
    resumed = make_module(tiny_teacher)
    make_trainer(tmp_path, max_steps=2).fit(resumed, dm, ckpt_path=path)
    assert resumed.before == {"val/ppl": 123.0}


def test_a_resume_at_the_last_validated_step_reuses_that_validation(
    tiny_teacher, corpus, tmp_path
) -> None:
    """Killed after training's last step (during the export), the resumed run validated the
    final student again, and metrics.csv held that step's validation twice."""
    dm = make_datamodule([corpus])
    module = make_module(tiny_teacher)
    module.fit_validation = (1, {"val/ppl": 99.0})  # as the in-fit validation at step 1 sets it
    path = one_step_checkpoint(module, dm, tmp_path, "one.ckpt")
    resumed = make_module(tiny_teacher)
    make_trainer(tmp_path, max_steps=1).fit(resumed, dm, ckpt_path=path)  # nothing left to do
    assert resumed.validation_at(1) == {"val/ppl": 99.0} and resumed.validation_at(2) is None


def test_every_validation_is_logged_at_the_optimizer_steps_done(
    tiny_teacher, corpus, tmp_path
) -> None:
    """Lightning logged a validation inside fit at its last step's index (after 2 steps: 1) and
    one by trainer.validate at the steps done: metrics.csv held two numberings."""
    from lightning.pytorch.loggers import CSVLogger

    module, dm = make_module(tiny_teacher), make_datamodule([corpus])
    logger = CSVLogger(tmp_path, name="", version="")
    trainer = make_trainer(
        max_steps=5, val_check_interval=2, limit_val_batches=1, logger=logger, log_every_n_steps=1
    )
    trainer.validate(module, dm, verbose=False)  # before training: 0 steps done
    trainer.fit(module, dm)
    after = trainer.validate(module, dm, verbose=False)[0]  # the final student's, at 5
    logger.save()
    with open(tmp_path / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows if row["val/ppl"]] == [0, 2, 4, 5]
    assert [int(row["step"]) for row in rows if row["train/loss"]] == [0, 1, 2, 3, 4]
    assert set(after) >= {"val/ppl", "val/kl"} and "step" not in after


def test_full_depth_student_matches_teacher_metrics(tiny_teacher, corpus) -> None:
    module = DistillationModule(
        teacher=tiny_teacher,
        student=StudentSpec(num_layers=4),
        distill=DistillConfig(),
        optimizer=torch.optim.AdamW,
        tokenizer=byte_tokenizer(),
    )
    metrics = make_trainer().validate(module, make_datamodule([corpus]), verbose=False)[0]
    assert metrics["val/agreement"] == pytest.approx(1.0)
    assert metrics["val/kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["val/ppl"] == pytest.approx(metrics["val/teacher_ppl"], rel=1e-5)
    assert module.teacher_perplexity == pytest.approx(metrics["val/teacher_ppl"])


def test_the_teacher_perplexity_is_that_of_each_validations_own_set(tiny_teacher, corpus):
    """It was measured once per module: a second validation, on another set, left it out, and
    the summary kept the first one's (a fit's limit_val_batches subset)."""
    dm = make_datamodule([corpus])
    module = make_module(tiny_teacher)
    part = make_trainer(limit_val_batches=1).validate(module, dm, verbose=False)[0]
    whole = make_trainer().validate(module, dm, verbose=False)[0]
    fresh = make_trainer().validate(make_module(tiny_teacher), dm, verbose=False)[0]
    assert whole["val/teacher_ppl"] == pytest.approx(fresh["val/teacher_ppl"], rel=1e-6)
    assert whole["val/teacher_ppl"] != pytest.approx(part["val/teacher_ppl"], rel=1e-6)
    assert module.teacher_perplexity == pytest.approx(whole["val/teacher_ppl"])


def test_ce_only_run_never_calls_the_teacher_in_training(tiny_teacher, corpus) -> None:
    module = make_module(tiny_teacher, kd_weight=0.0, ce_weight=1.0)
    module.configure_model()
    calls = []
    module.teacher.register_forward_hook(lambda *args: calls.append(1))
    make_trainer(max_steps=2, limit_val_batches=0).fit(module, make_datamodule([corpus]))
    assert calls == []


def gradients_after_one_step(teacher: TeacherSpec, batch, **distill) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    module = make_module(teacher, student={"freeze_embeddings": False}, **distill)
    module.configure_model()
    module.student.double()
    module.teacher.double()
    objective, _ = module.distiller(batch)
    objective.backward()
    return {n: p.grad.clone() for n, p in module.student.named_parameters()}


@pytest.mark.parametrize("divergence", ["forward_kl", "jsd"])
def test_chunked_module_gradients_equal_full_logits(tiny_teacher, corpus, divergence) -> None:
    dm = make_datamodule([corpus])
    dm.setup("fit")
    batch = dm.collate(dm.train_examples[:3])
    batch["labels"][0, 10:] = -100
    options = {"divergence": divergence, "temperature": 2.0, "kd_weight": 0.7, "ce_weight": 0.3}
    full = gradients_after_one_step(tiny_teacher, batch, chunked=False, **options)
    chunked = gradients_after_one_step(tiny_teacher, batch, chunk_size=7, **options)
    for name, grad in full.items():
        torch.testing.assert_close(chunked[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_distill_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown divergence 'klx'"):
        DistillConfig(divergence="klx")
    with pytest.raises(ValueError, match="are all 0"):
        DistillConfig(kd_weight=0, ce_weight=0)
    with pytest.raises(ValueError, match="distill.temperature=0"):
        DistillConfig(temperature=0)
    with pytest.raises(ValueError, match="distill.chunk_size=0"):
        DistillConfig(chunk_size=0)


def test_exported_student_gives_the_module_students_logits(tiny_teacher, corpus, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    module = make_module(tiny_teacher, features="uniform")
    make_trainer(max_steps=2, limit_val_batches=0).fit(module, make_datamodule([corpus]))
    module.export_student(str(tmp_path / "student"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "student").eval()
    ids = torch.randint(0, 256, (2, 16))
    module.student.eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, module.student(ids).logits)
    assert not any("projector" in key for key in exported.state_dict())


def test_teacher_forward_keeps_no_graph(tiny_teacher, corpus) -> None:
    """The lean teacher: final hidden states only, under no_grad, nothing for autograd to keep."""
    module = make_module(tiny_teacher)
    module.configure_model()
    dm = make_datamodule([corpus])
    dm.setup("fit")
    batch = dm.collate(dm.train_examples[:2])
    hidden = module.distiller.run("teacher", batch)
    assert hidden.shape == (2, 32, 32)  # [batch, seq, hidden]: no vocab-sized logits
    assert hidden.grad_fn is None and not hidden.requires_grad
    student_hidden = module.distiller.run("student", batch)
    assert student_hidden.grad_fn is not None


@pytest.mark.parametrize("task", ["causal_lm", "encoder"])
def test_unscored_padding_leaves_validation_metrics_unchanged(tiny_teacher, corpus, task) -> None:
    """The copies that even out validation across ranks run but count nowhere — also when a
    whole batch is made of them."""
    if task == "encoder":
        teacher = TeacherSpec(path=None, config=dict(TINY_BERT), task="encoder")
        distill = DistillConfig(kd_weight=0.0, ce_weight=0.0, features="uniform")
    else:
        teacher, distill = tiny_teacher, DistillConfig(features="uniform")
    module = DistillationModule(
        teacher=teacher,
        student=StudentSpec(num_layers=2),
        distill=distill,
        optimizer=torch.optim.AdamW,
        tokenizer=byte_tokenizer(),
    )
    dm = make_datamodule([corpus])
    dm.setup()
    examples = dm.val_examples[:5]
    # In batches of 2: [e0, e1], [e2, e3], [e4, u0], [u1, u2] — one mixed, one all unscored.
    padded = [*examples, *(Unscored(example) for example in examples[:3])]

    def validate(items: list) -> dict[str, float]:
        loader = DataLoader(items, batch_size=2, collate_fn=dm.collate)
        return make_trainer().validate(module, loader, verbose=False)[0]

    plain, with_padding = validate(examples), validate(padded)
    assert set(plain) == set(with_padding)
    for name, value in plain.items():
        assert with_padding[name] == pytest.approx(value, rel=1e-6), name


def test_validation_metrics_go_where_the_strategy_runs(tiny_teacher, corpus, monkeypatch) -> None:
    """DeepSpeed ZeRO-3 and FSDP never call ``module.to`` on models built in configure_model, so
    the metrics' states (plain tensors) stayed on the CPU beside a GPU step (seen on an H200).
    The module moves them to the strategy's device itself at every validation start."""
    module, dm = make_module(tiny_teacher), make_datamodule([corpus])
    moved_to = []
    original = module.val_metrics.to
    monkeypatch.setattr(module.val_metrics, "to", lambda d: moved_to.append(d) or original(d))
    trainer = make_trainer(max_steps=2, val_check_interval=1, limit_val_batches=1)
    trainer.fit(module, dm)
    trainer.validate(module, dm, verbose=False)
    assert moved_to == [trainer.strategy.root_device] * 3  # two in fit, one in validate
