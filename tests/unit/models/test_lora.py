"""LoRA students: only adapters train and are checkpointed, resume and accumulation are exact,
the merged export is the in-module model, hooks on wrapped modules keep the capture lifecycle."""

from __future__ import annotations

import signal
import warnings
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch import Callback

from lightning_kd.distill.objective import DistillConfig
from lightning_kd.launch.config import compose_config
from lightning_kd.models import lora as lora_module
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.models.lora import ADAPTER_DIR
from lightning_kd.models.student import (
    build_student,
    student_from_teacher,
)
from lightning_kd.training.checkpoints import LAST_NAME
from lightning_kd.training.module import DistillationModule
from lightning_kd.training.saving import LastCheckpoint
from lightning_kd.utils.refusal import Refused
from tests.conftest import (
    TINY_GPT2,
    TINY_LLAMA,
    checkpoints_activations,
    make_datamodule,
    make_module,
    make_trainer,
)
from tests.integration.test_cli import run_cli
from tests.integration.test_resume import COMMON, assert_same_run
from tests.unit.distill.test_accumulation import (
    LifecycleProbe,
    RecordingSGD,
    fit,
    padded_batches,
    reference_gradients,
)

LORA = {"r": 4, "alpha": 8}


def make(config: dict = TINY_LLAMA, checkpointing: bool = False, **distill) -> DistillationModule:
    """An fp64 module with a 2-layer LoRA student (every linear layer of its blocks adapted)."""
    return DistillationModule(
        teacher=TeacherSpec(path=None, config=dict(config), dtype="float64"),
        student=StudentSpec(
            num_layers=2, dtype="float64", activation_checkpointing=checkpointing, lora=LORA
        ),
        distill=DistillConfig(**({"compile": False} | distill)),
        optimizer=RecordingSGD,
        tokenizer=byte_tokenizer(),
    )


def test_only_adapters_and_projectors_train_and_sit_in_the_checkpoint(
    tiny_teacher, corpus, tmp_path
) -> None:
    # A LoRA-wrapped up_proj (64 wide) matched to a decoder layer (32 wide): a projector sized
    # from the wrapped layer trains with the adapters.
    features = [{"student": "model.layers.1.mlp.up_proj", "teacher": "model.layers.3"}]
    module = make_module(tiny_teacher, student={"lora": LORA}, features=features)
    dm = make_datamodule([corpus])
    trainer = make_trainer(tmp_path, max_steps=2)
    trainer.fit(module, dm)
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    student_trainable = [n for n, p in module.student.named_parameters() if p.requires_grad]
    assert student_trainable and all(".lora_A." in n or ".lora_B." in n for n in student_trainable)
    projector = module.distiller.projectors[0].weight
    assert projector.shape == (32, 64)
    trainable = {id(p) for p in module.student.parameters() if p.requires_grad} | {id(projector)}
    assert optimized == trainable

    path = tmp_path / "step2.ckpt"
    trainer.save_checkpoint(path)
    keys = set(torch.load(path, weights_only=True)["state_dict"])
    wanted = {f"distiller.student.{n}" for n in student_trainable} | {
        "distiller.projectors.0.weight"
    }
    assert keys == wanted  # no teacher, no frozen base student: they are rebuilt on load


def test_load_from_checkpoint_rebuilds_the_base(tiny_teacher, corpus, tmp_path) -> None:
    module = make_module(tiny_teacher, student={"lora": LORA})
    trainer = make_trainer(tmp_path, max_steps=2)
    trainer.fit(module, make_datamodule([corpus]))
    path = tmp_path / "step2.ckpt"
    trainer.save_checkpoint(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "missing keys" warning for the rebuilt base either
        loaded = DistillationModule.load_from_checkpoint(path, weights_only=True)
    assert loaded.student_spec.lora == LORA
    want = module.student.state_dict()
    for key, value in loaded.student.state_dict().items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0, msg=key)


class Crash(Callback):
    """Raise as the optimizer step after ``step`` begins (LastCheckpoint saved ``step``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("crash")


def test_a_crashed_lora_run_resumes_exactly(tiny_teacher, corpus, tmp_path) -> None:
    """The checkpoint holds no base student; the resumed run rebuilds it and continues to the
    very adapters and projector of a run never interrupted."""
    features = [{"student": "model.layers.1.mlp.up_proj", "teacher": "model.layers.3"}]

    def run(directory: Path, ckpt: Path | None = None, *callbacks: Callback):
        module = make_module(tiny_teacher, student={"lora": LORA}, features=features)
        saver = LastCheckpoint(str(directory), every=2)
        callbacks = [saver, *callbacks]
        trainer = make_trainer(max_steps=4, callbacks=callbacks, enable_checkpointing=True)
        trainer.fit(module, make_datamodule([corpus]), ckpt_path=ckpt)
        return module

    torch.manual_seed(0)
    straight = run(tmp_path / "straight")
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="crash"):
        run(tmp_path / "crashed", None, Crash(step=2))
    torch.manual_seed(1)  # other initial adapters and projector: the checkpoint replaces them
    resumed = run(tmp_path / "crashed", tmp_path / "crashed" / LAST_NAME)
    want = straight.distiller.state_dict()
    for key, value in resumed.distiller.state_dict().items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_killed_lora_run_resumes_exactly(tmp_path: Path) -> None:
    """Killed after step 5 and resumed from a checkpoint without the base student: the same
    losses and, bit for bit, the same merged student as a run never interrupted."""
    common = [*COMMON, "student.lora={r: 4, alpha: 8}"]
    reference = tmp_path / "whole"
    result = run_cli(*common, f"hydra.run.dir={reference}")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    kill = "+callbacks.kill={_target_: tests.helpers.KillAtStep, step: 5}"
    result = run_cli(*common, kill, f"hydra.run.dir={run_dir}")
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    keys = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert "distiller.projectors.0.weight" in keys
    assert all(".lora_" in k for k in keys if k.startswith("distiller.student."))

    result = run_cli(*common, "ckpt_path=last", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_run(run_dir, reference)
    assert (run_dir / "student" / ADAPTER_DIR / "adapter_config.json").is_file()


def test_merged_export_equals_the_in_module_student_and_the_adapter_loads(
    tiny_teacher, tmp_path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    module = make_module(tiny_teacher, student={"lora": LORA})
    module.configure_model()
    torch.manual_seed(0)
    with torch.no_grad():  # adapters far from their zero start, so the merge has work to do
        for name, parameter in module.student.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(0, 0.2)
    module.export_student(str(tmp_path / "student"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "student").eval()
    assert not any("lora" in key for key in merged.state_dict())
    ids = torch.randint(0, 256, (2, 16))
    module.student.eval()
    base = student_from_teacher(module.teacher, module.distiller.layer_map).eval()
    with torch.no_grad():
        want, base_logits = module.student(ids).logits, base(ids).logits
        assert (base_logits - want).abs().max() > 0.01  # the adapters count
        torch.testing.assert_close(merged(ids).logits, want, rtol=1e-5, atol=1e-5)
        # the adapter alone, on the student as built before LoRA (adapters injected in place)
        adapted = PeftModel.from_pretrained(base, tmp_path / "student" / ADAPTER_DIR).eval()
        torch.testing.assert_close(adapted(ids).logits, want, rtol=1e-5, atol=1e-5)
    # the export left the training model as it was: adapters in place, not merged
    assert any(".lora_A." in name for name, _ in module.student.named_parameters())


@pytest.mark.parametrize("count", [8, 7])  # 7 = 4 + a partial window of 3
def test_accumulated_lora_gradients_equal_one_batch_of_the_window(count: int) -> None:
    batches = padded_batches(count)
    distill = {"kd_weight": 0.6, "ce_weight": 0.4, "chunk_size": 5, "features": "uniform"}
    torch.manual_seed(0)
    applied = fit(make(TINY_GPT2, **distill), batches, accumulate=4, gradient_clip_val=None)
    torch.manual_seed(0)
    expected, _ = reference_gradients(make(TINY_GPT2, **distill), batches, accumulate=4)
    assert len(applied) == len(expected) == -(-count // 4)
    for step, (got, want) in enumerate(zip(applied, expected, strict=True)):
        # B starts at zero, so A's first gradient is zero; from the second step on every
        # adapter learns
        assert step == 0 or all(g.abs().sum() > 0 for g in got)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-14, msg=f"step {step}")


def test_hooks_on_lora_wrapped_modules_record_once_with_activation_checkpointing() -> None:
    """Paths are those of the plain model; a hook on a LoRA-wrapped projection inside a
    checkpointed layer fires again in backward, and its capture still records once per step."""
    wrapped = "model.layers.0.self_attn.q_proj"
    features = [
        {"student": wrapped, "teacher": "model.layers.0.self_attn.q_proj"},
        {"student": "model.layers.1", "teacher": "model.layers.3"},
    ]
    distill = {"kd_weight": 0.5, "ce_weight": 0.5, "features": features}
    batches = padded_batches(4)
    fired = []

    def count_fires(module: DistillationModule) -> None:
        hooked = module.student.get_submodule(wrapped)
        assert type(hooked).__module__.startswith("peft.")  # the LoRA layer, not its base
        hooked.register_forward_hook(lambda *args: fired.append(1))

    torch.manual_seed(0)
    plain = fit(make(**distill), batches, accumulate=2)
    torch.manual_seed(0)
    module = make(checkpointing=True, **distill)
    module.configure_model()
    count_fires(module)
    probe = LifecycleProbe()
    checkpointed = fit(module, batches, accumulate=2, callbacks=[probe])
    assert checkpoints_activations(module.student)
    assert probe.checked == 4 and len(fired) > 4  # re-forwards in backward, unrecorded
    assert module.trainer.callback_metrics["train/features"] > 0
    for got, want in zip(checkpointed, plain, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"target_modules": ["q_prj", "v_proj"]}, r"'q_prj' matches no module.*\['q_proj'"),
        (
            {"target_modules": ["self_attn"]},
            r"matches model.layers.0.self_attn, a LlamaAttention of the student "
            r"\(LlamaForCausalLM\) with no 2-D weight to adapt; nearest valid",
        ),
        (  # it said "matches Linear modules, which LoRA does not adapt"
            {"target_modules": ["lm_head"]},
            r"'lm_head' matches the student's output head \(lm_head\), which takes no adapter",
        ),
        ({"target_modules": ["embed_tokens"]}, r"matches the student's embeddings"),
        ({"rank": 8}, r"no key 'rank' \(did you mean 'r'\?\)"),
        ({"r": 0}, r"student.lora.r=0"),
    ],
)
def test_bad_lora_settings_are_refused_with_the_nearest_valid_names(lora, message) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    with pytest.raises(ValueError, match=message) as refused:
        build_student(StudentSpec(num_layers=2, lora=lora), load_teacher(teacher), "causal_lm")
    if "target_modules" in lora:  # found on the built student: a Refused, not a traceback
        assert isinstance(refused.value, Refused)


def test_lora_from_the_command_line() -> None:
    cfg = compose_config(["debug=smoke", "student.lora={r: 4, alpha: 8, target_modules: [q_proj]}"])
    spec = instantiate(cfg.student, _convert_="all")
    assert spec.lora_spec.target_modules == ["q_proj"] and spec.lora_spec.r == 4
    with pytest.raises(ValueError, match="random student.config"):
        StudentSpec(config={"num_hidden_layers": 2}, lora={})


def test_a_lora_student_without_peft_names_the_extra(monkeypatch) -> None:
    monkeypatch.setattr(lora_module, "find_spec", lambda name: None)  # peft not installed
    teacher = load_teacher(TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'lightning-kd\[lora\]'"):
        build_student(StudentSpec(num_layers=2, lora=LORA), teacher, "causal_lm")
