"""Strategy configuration: FSDP wrap/checkpoint policies, GPU-only strategies, Hydra configs."""

from __future__ import annotations

import importlib.util
import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra.utils import instantiate
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from lightning_kd.data.domains import Domains
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.launch.config import compose_config
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from lightning_kd.training.module import DistillationModule
from lightning_kd.training.strategies import (
    DistillationFSDPStrategy,
    check_accelerator,
    ddp,
    fsdp,
    is_trainable_block,
    is_wrap_unit,
    loss_divisor,
    window_ends,
)
from lightning_kd.utils.refusal import Refused
from tests.conftest import ROOT, TINY_LLAMA, make_module


@pytest.fixture
def built(tiny_teacher):
    module = make_module(tiny_teacher)
    module.configure_model()
    return module


def test_fsdp_units_are_what_the_step_calls(built) -> None:
    strategy = fsdp()
    policy = strategy.kwargs["auto_wrap_policy"]
    units = {
        name
        for name, m in built.named_modules()
        if policy(module=m, recurse=False, nonwrapped_numel=0)
    }
    # Each block, and the teacher's body (what hidden_states() calls). The student's embedding,
    # norm and tied head stay in the root unit, gathered for the whole step, where the chunked
    # loss reads the head; no unit mixes the two models.
    assert units == {
        "distiller.teacher.model",
        *(f"distiller.teacher.model.layers.{i}" for i in range(4)),
        *(f"distiller.student.model.layers.{i}" for i in range(2)),
    }
    assert isinstance(strategy, DistillationFSDPStrategy)


def test_under_fsdp_every_teacher_is_a_unit_with_its_head_unsharded(tiny_teacher) -> None:
    """A ``teachers`` entry's body was no unit: its embedding and norm fell into the root unit
    beside the fp32 student (a bf16 entry could not be wrapped at all), its head sharded."""
    module = make_module(tiny_teacher, teachers=TEACHERS["two"])
    module.configure_model()
    policy = fsdp().kwargs["auto_wrap_policy"]
    units = {
        name
        for name, m in module.named_modules()
        if policy(module=m, recurse=False, nonwrapped_numel=0)
    }
    second = "distiller.extra_teachers.models.0.model"
    assert {second, *(f"{second}.layers.{i}" for i in range(3))} <= units
    heads = [module.teacher, module.distiller.extra_teachers.model(0)]
    expected = [model.get_output_embeddings().weight for model in heads]
    assert module.distiller.unsharded_parameters() == expected


def test_fsdp_leaves_the_teachers_head_unsharded(built, monkeypatch) -> None:
    head = built.teacher.get_output_embeddings().weight
    assert built.distiller.unsharded_parameters() == [head]
    assert head is built.teacher.get_input_embeddings().weight  # tied: the embedding too
    # At wrap time (the models exist only then) the strategy hands them to FSDP as ignored.
    monkeypatch.setattr(FSDPStrategy, "_setup_model", lambda self, model: model)
    strategy = fsdp()
    # FSDP moves only what it wraps to its device: the strategy moves the ignored head itself
    # (FSDP's own way, ``.data``; a CPU here, a GPU in scripts/gpu_check.py), and the embedding
    # stays tied to it.
    strategy.parallel_devices = [torch.device("cpu")]
    assert strategy._setup_model(built) is built
    assert strategy.kwargs["ignored_states"] == [head]
    assert head.device == strategy.root_device
    assert built.teacher.get_input_embeddings().weight is head


def test_fsdp_checkpoints_only_student_blocks(built) -> None:
    strategy = fsdp(activation_checkpointing=True)
    policy = strategy._activation_checkpointing_kwargs["auto_wrap_policy"]
    chosen = {
        n for n, m in built.named_modules() if policy(module=m, recurse=False, nonwrapped_numel=0)
    }
    assert chosen == {"distiller.student.model.layers.0", "distiller.student.model.layers.1"}
    assert not any(is_trainable_block(m) for m in built.teacher.modules())
    assert is_wrap_unit(built.teacher.base_model) and not is_wrap_unit(built.student)


def test_fsdp_saves_a_full_state_dict() -> None:
    assert fsdp()._state_dict_type == "full"


def test_ddp_needs_no_unused_parameter_search() -> None:
    strategy = ddp()
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs.get("find_unused_parameters") is False


def test_a_gpu_strategy_without_a_gpu_is_refused() -> None:
    """A refusal (exit 2, the message alone), not a traceback."""
    with pytest.raises(Refused, match=r"strategy=fsdp .* needs a CUDA GPU.*use\s+strategy=ddp"):
        check_accelerator("lightning_kd.training.strategies.fsdp", "cpu")
    with pytest.raises(ValueError, match="strategy=deepspeed"):
        check_accelerator("deepspeed_stage_3", "cpu")
    check_accelerator("lightning_kd.training.strategies.ddp", "cpu")
    check_accelerator(None, "cpu")


@pytest.mark.parametrize(("name", "kind"), [("ddp", DDPStrategy), ("fsdp", FSDPStrategy)])
def test_strategy_configs_compose_and_build(name, kind) -> None:
    cfg = compose_config([f"strategy={name}"], output_dir="/tmp/x")
    assert isinstance(instantiate(cfg.trainer.strategy), kind)


def test_deepspeed_config_excludes_frozen_parameters() -> None:
    cfg = compose_config(["strategy=deepspeed"], output_dir="/tmp/x")
    assert cfg.trainer.strategy._target_ == "lightning_kd.training.strategies.deepspeed"
    assert cfg.trainer.strategy.stage == 3
    strategy = instantiate(cfg.trainer.strategy)
    assert strategy.exclude_frozen_parameters
    assert strategy.config["zero_optimization"]["stage"] == 3


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_flags_checkpoints_with_teacher_weights(tmp_path) -> None:
    gpu_check = load_gpu_check()
    path = tmp_path / "last.ckpt"
    weight = torch.zeros(1)
    torch.save({"state_dict": {"distiller.student.w": weight, "distiller.teacher.w": weight}}, path)
    assert gpu_check.checkpoint_status(path) == "checkpoint holds teacher weights"
    torch.save({"state_dict": {"distiller.student.w": weight}}, path)
    assert gpu_check.checkpoint_status(path) == "ok"
    deepspeed = tmp_path / "ds.ckpt" / "checkpoint"
    deepspeed.mkdir(parents=True)
    assert gpu_check.checkpoint_status(deepspeed.parent) == "checkpoint has no model states"
    (deepspeed / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"x")
    assert gpu_check.checkpoint_status(deepspeed.parent) == "ok"
    assert gpu_check.checkpoint_status(tmp_path / "none.ckpt") == "no checkpoint written"
    hint = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    assert gpu_check.last_error(f"x\nValueError: needs a GPU\n{hint}") == "ValueError: needs a GPU"
    # As a run on an H200 ended: the exception, a blank line, Hydra's hint; after a progress line.
    h200 = f"Traceback\nlightning.fabric.Misconfiguration: x\nRuntimeError: y\n\n{hint}\n"
    assert gpu_check.last_error(h200) == "RuntimeError: y"


class StepRoot(nn.Module):
    """Stands in for Lightning's wrapper around the LightningModule: FSDP's root unit, whose
    forward runs the distillation step (as Lightning runs ``training_step`` through it)."""

    def __init__(self, module: DistillationModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        objective, sums = self.module.distiller(batch)
        return objective / sums.tokens


SECOND_TEACHER = [
    {"name": "first", "weight": 0.5},
    {"name": "second", "weight": 0.5, "config": {**TINY_LLAMA, "num_hidden_layers": 3}},
]
"""A ``teachers`` list: the teacher group's model and another, bf16 like it (their own dtype)."""

TEACHERS = {
    "one": None,
    "two": SECOND_TEACHER,
    "by_domain": [  # rank r's batch is all domain r: the second teacher runs on rank 1's rows only
        {**SECOND_TEACHER[0], "domains": ["code"]},
        {**SECOND_TEACHER[1], "domains": ["prose"]},
    ],
}


def build_mixed_precision_pair(chunked: bool, teachers: str = "one") -> DistillationModule:
    """A bf16 teacher and a narrower fp32 student (so projectors too), the same on every call;
    with ``teachers`` (of :data:`TEACHERS`), a second bf16 teacher beside the first."""
    torch.manual_seed(0)
    module = DistillationModule(
        teacher=TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="bfloat16"),
        student=StudentSpec(config={"hidden_size": 16, "num_hidden_layers": 2}),
        distill=DistillConfig(features="uniform", chunked=chunked, compile=False),
        optimizer=torch.optim.AdamW,
        tokenizer=byte_tokenizer(),
        teachers=TEACHERS[teachers],
    )
    module.configure_model()
    if teachers == "by_domain":
        module.distiller.domains.know(Domains(("code", "prose"), {"code.txt": 0, "prose.txt": 1}))
    return module


def rank_batch(rank: int, domains: bool = False) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 257, (2, 12), generator=torch.Generator().manual_seed(rank))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return batch | ({"domain": torch.full((2,), rank)} if domains else {})


def unsharded_step(
    reference: DistillationModule, batch: dict[str, torch.Tensor], world_size: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This rank's loss on one device, and the rank-mean gradients a sharded step must produce."""
    loss = StepRoot(reference)(batch)
    loss.backward()
    grads = {}
    for name, parameter in reference.named_parameters():
        if parameter.requires_grad:
            dist.all_reduce(grad := parameter.grad.clone())
            grads[name] = grad / world_size
    return loss, grads


def fsdp_worker(rank: int, world_size: int, port: int, chunked: bool, teachers: str) -> None:
    """One rank: the step under FSDP (our policy) gives the unsharded module's loss on this rank's
    batch and, after backward, the rank-mean of its gradients."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    module, reference = (build_mixed_precision_pair(chunked, teachers) for _ in range(2))
    batch = rank_batch(rank, domains=teachers == "by_domain")

    # The trap the policy avoids: one flat unit for a bf16 teacher and an fp32 student.
    with pytest.raises(ValueError, match="uniform dtype"):
        FSDP(StepRoot(build_mixed_precision_pair(chunked)), device_id=torch.device("cpu"))

    want_loss, want = unsharded_step(reference, batch, world_size)

    strategy = fsdp()
    root = FSDP(
        StepRoot(module),
        auto_wrap_policy=strategy.kwargs["auto_wrap_policy"],
        ignored_states=module.distiller.unsharded_parameters(),
        use_orig_params=True,
        device_id=torch.device("cpu"),
    )
    loss = root(batch)
    loss.backward()
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    with FSDP.summon_full_params(root, with_grads=True):
        got = {
            name.replace("_fsdp_wrapped_module.", ""): parameter.grad.clone()
            for name, parameter in module.named_parameters()
            if parameter.requires_grad
        }
    assert set(got) == set(want) and any(name.startswith("distiller.projectors.") for name in got)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("chunked", "teachers"),
    [(True, "one"), (False, "one"), (True, "two"), (True, "by_domain")],
    ids=["chunked", "full_logits", "two_teachers", "teachers_by_domain"],
)
def test_step_under_fsdp_equals_the_unsharded_step(chunked: bool, teachers: str) -> None:
    """FSDP on CPUs over gloo (torch's own; Lightning's FSDPStrategy wants a GPU): the wrap
    units and unsharded heads of ``strategy=fsdp`` let the chunked loss read every output head
    and train the student, projectors included, as one device would; a second bf16 teacher
    (its embedding in the root unit beside the fp32 student, FSDP refused to wrap: probe 39)
    is a unit of its own, its head unsharded; a teacher by domain runs on every rank, those
    with none of its rows too (a rank skipping its gathers left the other waiting: probe 39)."""
    mp.spawn(fsdp_worker, args=(2, free_port(), chunked, teachers), nprocs=2)


def deepspeed_worker(rank: int, world_size: int, port: int, chunked: bool, teachers: str) -> None:
    """One rank: the step under DeepSpeed ZeRO-3, every parameter partitioned, gives the unsharded
    module's loss on this rank's batch and the rank-mean of its gradients."""
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank)
    )
    os.environ["WORLD_SIZE"] = str(world_size)
    deepspeed.init_distributed(dist_backend="gloo")
    module, reference = (build_mixed_precision_pair(chunked, teachers) for _ in range(2))
    batch = rank_batch(rank, domains=teachers == "by_domain")
    want_loss, want = unsharded_step(reference, batch, world_size)

    config = {
        "train_micro_batch_size_per_gpu": 2,
        # Threshold 0: even the tiny models' parameters are partitioned, as a real head would be.
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_allow_untested_optimizer": True,
    }
    root = StepRoot(module)
    trainable = [p for p in root.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=root, model_parameters=trainable, config=config)
    head = module.student.get_output_embeddings().weight
    assert head.data.numel() == 0, "partitioned outside the forward"
    loss = engine(batch)
    engine.backward(loss)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    parameters = dict(module.named_parameters())
    assert any(name.startswith("distiller.projectors.") for name in want)
    for name, grad in want.items():
        got = safe_get_full_grad(parameters[name])
        torch.testing.assert_close(got, grad, rtol=1e-4, atol=1e-6, msg=name)
    # Tear down in step: a rank leaving with its process group alive can abort the other.
    engine.destroy()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("chunked", "teachers"),
    [(True, "one"), (False, "one"), (True, "two"), (True, "by_domain")],
    ids=["chunked", "full_logits", "two_teachers", "teachers_by_domain"],
)
def test_step_under_deepspeed_zero3_equals_the_unsharded_step(chunked: bool, teachers) -> None:
    """DeepSpeed ZeRO-3 on CPUs over gloo (Lightning's DeepSpeedStrategy wants a GPU) with a
    second, frozen bf16 model inside the module: the chunked loss reads both partitioned heads
    and trains the student, projectors included, as one device would; so with two teachers,
    and with teachers by domain (a rank skipping a teacher with none of its rows aborted the
    other on mismatched collectives: probe 39)."""
    mp.spawn(deepspeed_worker, args=(2, free_port(), chunked, teachers), nprocs=2)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_gpu_check_without_cuda_says_so(monkeypatch, capsys) -> None:
    gpu_check = load_gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["gpu_check.py"])
    assert gpu_check.main() == 2
    assert "no CUDA device here" in capsys.readouterr().out


def test_clipping_under_fsdp_uses_fsdps_own_norm(built, monkeypatch) -> None:
    """Lightning's FSDP precision refuses gradient_clip_algorithm="norm" (seen on an H200): the
    module clips through the wrapped root's clip_grad_norm_, which reduces over all shards."""

    class Root(FullyShardedDataParallel):
        def __init__(self) -> None:  # no process group needed: only the clip call is used
            nn.Module.__init__(self)
            self.clipped = []

        def clip_grad_norm_(self, max_norm, norm_type=2.0):
            self.clipped.append(max_norm)

    root = Root()
    monkeypatch.setattr(type(built), "trainer", property(lambda self: SimpleNamespace(model=root)))
    built.configure_gradient_clipping(None, 1.0, "norm")
    assert root.clipped == [1.0]


def test_fsdp_is_a_strategy_that_wraps_in_place() -> None:
    run = importlib.import_module("lightning_kd.launch.train")
    assert run.wraps_in_place(SimpleNamespace(strategy=fsdp()))
    assert not run.wraps_in_place(SimpleNamespace(strategy=ddp()))


@pytest.mark.parametrize(("max_steps", "validated_at_end"), [(6, True), (4, False)])
def test_under_fsdp_the_run_is_one_fit(tmp_path, monkeypatch, capsys, max_steps, validated_at_end):
    """Under FSDP a second stage on the module leaves its root unwrapped (Lightning #19015, seen
    on an H200: the root's parameters were never handed to FSDP): no validate before or after
    fit; the final student's metrics come from fit's own last validation when there is one."""
    run = importlib.import_module("lightning_kd.launch.train")
    monkeypatch.setattr(run, "wraps_in_place", lambda trainer: True)

    def no_second_stage(*args, **kwargs):
        raise AssertionError("trainer.validate ran beside fit")

    monkeypatch.setattr(run.L.Trainer, "validate", no_second_stage)
    overrides = ["debug=smoke", f"trainer.max_steps={max_steps}", "export_student=false"]
    summary = run.train(compose_config(overrides, output_dir=tmp_path))
    out = capsys.readouterr().out
    assert summary.before == {} and "validate_before skipped" in out
    assert (summary.after.get("val/ppl", 0) > 0) == validated_at_end
    assert ("final validation skipped" in out) != validated_at_end


def deepspeed_like(boundary: bool, accumulate: int = 4) -> SimpleNamespace:
    """A trainer as Lightning's DeepSpeedStrategy runs it: the engine accumulates."""
    engine = SimpleNamespace(is_gradient_accumulation_boundary=lambda: boundary)
    strategy = SimpleNamespace(handles_gradient_accumulation=True)
    return SimpleNamespace(strategy=strategy, model=engine, accumulate_grad_batches=accumulate)


def test_under_deepspeed_the_window_ends_at_the_engines_boundary_and_undoes_both_divisions():
    """Lightning runs the optimizer hooks after every micro-batch under DeepSpeed and divides
    each loss by the accumulation count, which the engine's backward does again: the exact
    accumulation rescales once per window, by the square."""
    assert not window_ends(deepspeed_like(boundary=False))
    assert window_ends(deepspeed_like(boundary=True))
    assert loss_divisor(deepspeed_like(boundary=True, accumulate=4)) == 16
    ddp = SimpleNamespace(
        strategy=SimpleNamespace(handles_gradient_accumulation=False), accumulate_grad_batches=4
    )
    assert window_ends(ddp) and loss_divisor(ddp) == 4


def test_a_micro_batch_inside_a_deepspeed_window_leaves_the_window_open(built) -> None:
    module = built
    module.window.add(module.distiller(rank_batch(0))[1])
    totals = module.window.totals.clone()
    module._trainer = deepspeed_like(boundary=False)
    try:
        module.on_before_optimizer_step(optimizer=None)
    finally:
        module._trainer = None
    assert torch.equal(module.window.totals, totals)  # counted on, not rescaled or reset
