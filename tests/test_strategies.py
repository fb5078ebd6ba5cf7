"""Strategy configuration: FSDP wrap/checkpoint policies, GPU-only strategies, Hydra configs."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

from lightning_kd.strategies import (
    check_accelerator,
    ddp,
    fsdp,
    is_trainable_block,
    is_wrap_unit,
)
from tests.conftest import ROOT, make_module


@pytest.fixture
def built(tiny_teacher):
    module = make_module(tiny_teacher)
    module.configure_model()
    return module


def test_fsdp_wraps_each_model_and_block_separately(built) -> None:
    strategy = fsdp()
    policy = strategy.kwargs["auto_wrap_policy"]
    units = {
        name
        for name, m in built.named_modules()
        if policy(module=m, recurse=False, nonwrapped_numel=0)
    }
    assert {"teacher", "student"} <= units
    assert {f"teacher.model.layers.{i}" for i in range(4)} <= units
    assert {f"student.model.layers.{i}" for i in range(2)} <= units
    # Nothing else: embeddings, norms and heads stay inside their own model's unit, so no
    # flat parameter mixes teacher and student (or a bf16 teacher with an fp32 student).
    assert len(units) == 2 + 4 + 2


def test_fsdp_checkpoints_only_student_blocks(built) -> None:
    strategy = fsdp(activation_checkpointing=True)
    policy = strategy._activation_checkpointing_kwargs["auto_wrap_policy"]
    chosen = {
        n for n, m in built.named_modules() if policy(module=m, recurse=False, nonwrapped_numel=0)
    }
    assert chosen == {"student.model.layers.0", "student.model.layers.1"}
    assert not any(is_trainable_block(m) for m in built.teacher.modules())
    assert is_wrap_unit(built.teacher) and is_wrap_unit(built.student)


def test_fsdp_saves_a_full_state_dict() -> None:
    assert fsdp()._state_dict_type == "full"


def test_ddp_needs_no_unused_parameter_search() -> None:
    strategy = ddp()
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs.get("find_unused_parameters") is False


def test_gpu_only_strategy_on_cpu_names_the_alternative() -> None:
    with pytest.raises(ValueError, match=r"strategy=fsdp .* needs a CUDA GPU.*use\s+strategy=ddp"):
        check_accelerator("lightning_kd.strategies.fsdp", "cpu")
    with pytest.raises(ValueError, match="strategy=deepspeed"):
        check_accelerator("deepspeed_stage_3", "cpu")
    check_accelerator("lightning_kd.strategies.ddp", "cpu")
    check_accelerator(None, "cpu")


@pytest.mark.parametrize(("name", "kind"), [("ddp", DDPStrategy), ("fsdp", FSDPStrategy)])
def test_strategy_configs_compose_and_build(name, kind) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"strategy={name}", "output_dir=/tmp/x"])
    assert isinstance(instantiate(cfg.trainer.strategy), kind)


def test_deepspeed_config_excludes_frozen_parameters() -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["strategy=deepspeed", "output_dir=/tmp/x"])
    assert cfg.trainer.strategy._target_ == "lightning_kd.strategies.deepspeed"
    assert cfg.trainer.strategy.stage == 3
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return  # DeepSpeed itself is a GPU-machine install; the config is checked above
    strategy = instantiate(cfg.trainer.strategy)
    assert strategy.exclude_frozen_parameters


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_flags_checkpoints_with_teacher_weights(tmp_path) -> None:
    gpu_check = load_gpu_check()
    path = tmp_path / "last.ckpt"
    weight = torch.zeros(1)
    torch.save({"state_dict": {"student.w": weight, "teacher.w": weight}}, path)
    assert gpu_check.checkpoint_status(path) == "checkpoint holds teacher weights"
    torch.save({"state_dict": {"student.w": weight}}, path)
    assert gpu_check.checkpoint_status(path) == "ok"
    deepspeed = tmp_path / "ds.ckpt" / "checkpoint"
    deepspeed.mkdir(parents=True)
    assert gpu_check.checkpoint_status(deepspeed.parent) == "checkpoint has no model states"
    (deepspeed / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"x")
    assert gpu_check.checkpoint_status(deepspeed.parent) == "ok"
    assert gpu_check.checkpoint_status(tmp_path / "none.ckpt") == "no checkpoint written"
    hint = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    assert gpu_check.last_error(f"x\nValueError: needs a GPU\n{hint}") == "ValueError: needs a GPU"
