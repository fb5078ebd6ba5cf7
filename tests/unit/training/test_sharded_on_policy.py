"""On-policy and interleaved KD under FSDP and DeepSpeed ZeRO-3: the ranks decode in step, and
training equals the unsharded run (2 CPU ranks over gloo; Lightning's strategies want a GPU)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lightning_kd.distill.accumulation import TERMS, Window
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.generation.decoding import decodes_in_step
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from lightning_kd.training.module import DistillationModule
from lightning_kd.training.strategies import fsdp
from tests.conftest import TINY_GPT2
from tests.unit.training.test_strategies import free_port

ACCUMULATE, STEPS, LR = 2, 3, 0.1
SEED = 6  # the first step samples one micro-batch of two, and the ranks write different lengths
"""``distill.on_policy_seed``: at λ = 0.5 it samples micro-batches 0, 2, 3 and 4 of 0–5, so
every optimizer step's window holds a sampled one and two hold a dataset one beside it."""


def build(top_k: int | None, dtype: str = "float64") -> DistillationModule:
    """A GPT-2 teacher and a 2-layer student copied from it (its copied embeddings and head
    frozen, the default), both in ``dtype``, the same on every call, sampling half the
    micro-batches (interleaved with ``top_k``)."""
    torch.manual_seed(0)
    distill = DistillConfig(
        on_policy=0.5,
        on_policy_tokens=6,
        on_policy_seed=SEED,
        on_policy_teacher_top_k=top_k,
        compile=False,
    )
    module = DistillationModule(
        teacher=TeacherSpec(path=None, config=dict(TINY_GPT2), dtype=dtype),
        student=StudentSpec(num_layers=2, dtype=dtype),
        distill=distill,
        tokenizer=byte_tokenizer(),
    )
    module.configure_model()
    ends_often(module.student)
    return module


def ends_often(student: nn.Module, logit: float = 5.5) -> None:
    """Raise the student's end-token logit by ``logit`` everywhere (the final norm's bias along
    the token's head row): P(end) ≈ 0.5 a token instead of 1/257, so completions, and the ranks'
    decoding, end at different lengths within a few tokens. (A trained head would unlearn it in
    one step: its end row's gradient grows with that bias.)"""
    end = student.get_output_embeddings().weight[TINY_GPT2["eos_token_id"]].detach()
    with torch.no_grad():
        student.transformer.ln_f.bias += logit * end / end.dot(end)


def chat_batch(rank: int, index: int) -> dict[str, torch.Tensor]:
    """Rows of a prompt (2–8 tokens, unscored) and an answer (1–4, scored), right-padded: each
    rank's own, 2 rows on rank 0 and 3 on rank 1.

    Every rank seeds its sampling alike (``on_policy.py``), and this near-uniform student then
    writes nearly the same tokens for any prompt: rank 1's third row is what makes the ranks'
    longest completions differ."""
    generator = torch.Generator().manual_seed(1_000 * rank + index)
    lengths = [
        [int(torch.randint(low, high, (), generator=generator)) for low, high in ((2, 9), (1, 5))]
        for _ in range(2 + rank)
    ]
    width = max(prompt + answer for prompt, answer in lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, IGNORE_INDEX)
    for row, (prompt, answer) in enumerate(lengths):
        ids[row, : prompt + answer] = torch.randint(0, 256, (prompt + answer,), generator=generator)
        mask[row, : prompt + answer] = 1
        labels[row, prompt : prompt + answer] = ids[row, prompt : prompt + answer]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class TrainingStepRoot(nn.Module):
    """Stands in for Lightning's wrapper around the LightningModule (FSDP's root unit, DeepSpeed's
    module): its forward is ``training_step``, on-policy sampling included, as Lightning runs it."""

    def __init__(self, module: DistillationModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.module.training_step(batch, batch_idx)


class AllRanks:
    """Lightning's strategy ``reduce`` (the window's token sums over ranks), over gloo."""

    @staticmethod
    def reduce(tensor: torch.Tensor, reduce_op: str = "sum") -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor


def window_tokens(module: DistillationModule) -> torch.Tensor:
    """The window's scored tokens over all ranks (the window reset), as
    ``on_before_optimizer_step`` reads them."""
    totals = module.window.reduced(AllRanks())
    module.window.reset()
    return totals["tokens"]


class Unsharded:
    """The reference: the module whole on this rank, its gradients averaged over ranks (as DDP
    averages them), then made the window's token mean."""

    def __init__(self, module: DistillationModule) -> None:
        self.module = module
        self.optimizer = torch.optim.SGD(module.distiller.trainable_parameters(), lr=LR)

    def micro_batch(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        objective = self.module.training_step(batch, index)
        (objective / ACCUMULATE).backward()  # Lightning divides by the accumulation
        return objective.detach()

    def step(self) -> None:
        parameters = list(self.module.distiller.trainable_parameters())
        world_size = dist.get_world_size()
        for parameter in parameters:
            dist.all_reduce(parameter.grad)
            parameter.grad /= world_size
        tokens = window_tokens(self.module)
        Window.rescale_gradients(parameters, tokens, ACCUMULATE, world_size)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def student(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.module.student.named_parameters()}


class UnderFSDP:
    """The module under torch's FSDP with ``strategy=fsdp``'s wrap units and unsharded teacher
    head, stepped as the LightningModule steps under Lightning's FSDPStrategy."""

    def __init__(self, module: DistillationModule) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        self.module = module
        self.root = FullyShardedDataParallel(
            TrainingStepRoot(module),
            auto_wrap_policy=fsdp().kwargs["auto_wrap_policy"],
            ignored_states=module.distiller.unsharded_parameters(),
            use_orig_params=True,
            device_id=torch.device("cpu"),
        )
        self.optimizer = torch.optim.SGD(module.distiller.trainable_parameters(), lr=LR)

    def micro_batch(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        objective = self.root(batch, index)
        (objective / ACCUMULATE).backward()
        return objective.detach()

    def step(self) -> None:
        tokens = window_tokens(self.module)
        parameters = self.module.distiller.trainable_parameters()
        Window.rescale_gradients(parameters, tokens, ACCUMULATE, dist.get_world_size())
        self.optimizer.step()
        self.optimizer.zero_grad()

    def student(self) -> dict[str, torch.Tensor]:
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(self.root):
            return {
                name.replace("_fsdp_wrapped_module.", ""): parameter.detach().clone()
                for name, parameter in self.module.student.named_parameters()
            }


class UnderDeepSpeed:
    """The module under DeepSpeed ZeRO-3, every parameter partitioned (threshold 0), its
    accumulation DeepSpeed's own (it divides each loss by its accumulation steps)."""

    def __init__(self, module: DistillationModule, stage: int = 3) -> None:
        import deepspeed

        self.module = module
        self.trainable = list(module.distiller.trainable_parameters())
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": ACCUMULATE,
            "gradient_clipping": 0.0,  # DeepSpeed's default clips at 1.0
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "zero_allow_untested_optimizer": True,
        }
        self.engine, *_ = deepspeed.initialize(
            model=TrainingStepRoot(module),
            model_parameters=self.trainable,
            optimizer=torch.optim.SGD(self.trainable, lr=LR),
            config=config,
        )

    def micro_batch(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        objective = self.engine(batch, index)
        self.engine.backward(objective)
        if not self.engine.is_gradient_accumulation_boundary():
            self.engine.step()  # counts the micro-step; steps nothing
        return objective.detach()

    def step(self) -> None:
        # The window's token mean, by the LightningModule's own rescale: ZeRO-3 leaves
        # ``param.grad`` empty, so it scales each rank's gradient partition in place.
        tokens = window_tokens(self.module)
        Window.rescale_gradients(self.trainable, tokens, ACCUMULATE, dist.get_world_size())
        self.engine.step()

    def student(self) -> dict[str, torch.Tensor]:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.student.parameters())):
            return {n: p.detach().clone() for n, p in self.module.student.named_parameters()}

    def close(self) -> None:
        self.engine.destroy()  # a rank leaving with its engine alive can abort the other


def written(module: DistillationModule, batch: dict[str, torch.Tensor], index: int) -> int:
    """How many tokens the unsharded student writes on micro-batch ``index`` (0: not sampled):
    the forwards a rank decoding alone would run."""
    sampler = module.distiller.on_policy
    if not sampler.chooses(index):
        return 0
    sampled = sampler.sample(module.student, batch, index, module.teacher)
    return int((sampled["labels"] != IGNORE_INDEX).sum(1).max())


# DeepSpeed has no fp64 path: it reduces gradients and keeps master weights in fp32 (its
# communication_data_type takes fp16, bf16 or fp32), so its ZeRO-2 run equals the fp64 one to
# fp32's precision; ZeRO-3 cannot hold fp64 weights at all (its zero.Init refuses float64), so
# that run and its reference are fp32 throughout. FSDP gathers and reduces fp64 weights.
TOLERANCES = {"fsdp": {"rtol": 1e-10, "atol": 1e-12}, "deepspeed": {"rtol": 1e-5, "atol": 1e-7}}
TOLERANCES["deepspeed_zero2"] = TOLERANCES["deepspeed"]
DTYPES = {"deepspeed": "float32"}
"""The engines that run another dtype than fp64 (their reference with them)."""


def on_policy_worker(rank: int, world_size: int, port: int, engine: str, top_k: int | None):
    """One rank: 3 optimizer steps of 2 micro-batches under ``engine`` give the unsharded
    module's objective on every micro-batch and its student after every step."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dtype = DTYPES.get(engine, "float64")
    reference, module = Unsharded(build(top_k, dtype)), build(top_k, dtype)
    sharded = {
        "fsdp": lambda: UnderFSDP(module),
        "deepspeed": lambda: UnderDeepSpeed(module),
        "deepspeed_zero2": lambda: UnderDeepSpeed(module, stage=2),
    }[engine]()
    # What makes the LightningModule decode in step under Lightning's FSDP or DeepSpeed too.
    # (ZeRO-2 keeps whole weights on every rank: each rank decodes alone, as under DDP.)
    assert decodes_in_step(module.student) == (engine != "deepspeed_zero2")
    assert not decodes_in_step(reference.module.student)
    tolerance, lengths = TOLERANCES[engine], []
    for step in range(STEPS):
        for index in range(step * ACCUMULATE, (step + 1) * ACCUMULATE):
            batch = chat_batch(rank, index)
            lengths.append(written(reference.module, batch, index))
            want = reference.micro_batch(batch, index)
            got = sharded.micro_batch(batch, index)
            torch.testing.assert_close(got, want, **tolerance, msg=f"micro-batch {index}")
            sums, expected = module.window.totals, reference.module.window.totals
            tokens = TERMS.index("tokens")
            assert sums[tokens] == expected[tokens], "the same completions: the same token counts"
            torch.testing.assert_close(sums, expected, **tolerance)
        reference.step()
        sharded.step()
        want, got = reference.student(), sharded.student()
        assert set(got) == set(want)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, **tolerance, msg=f"{name}, step {step}")
    both = [None] * world_size
    dist.all_gather_object(both, lengths)
    assert 0 in lengths and any(lengths), lengths  # sampled and dataset micro-batches
    # On some sampled micro-batch the ranks wrote different lengths: one decoded on alone.
    assert any(a != b for a, b in zip(*both, strict=True) if a and b), both
    if top_k is not None:  # the teacher vetoed some of the student's tokens, not all
        assert 0 < module.distiller.on_policy.tally.take() < 1
    if engine.startswith("deepspeed"):
        sharded.close()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [None, 128], ids=["sampled", "interleaved"])
@pytest.mark.parametrize("engine", ["fsdp", "deepspeed", "deepspeed_zero2"])
def test_mixed_on_policy_kd_under_sharding_equals_the_unsharded_run(engine: str, top_k) -> None:
    """λ = 0.5 on 2 gloo ranks under torch's FSDP (our wrap policy) or DeepSpeed ZeRO-3, plain
    or interleaved sampling: the ranks' completions end at different lengths, and every
    micro-batch's objective and the student after each of 3 accumulated optimizer steps are the
    unsharded run's (fp64 for FSDP; DeepSpeed to its fp32 reduction, ZeRO-3 in fp32)."""
    mp.spawn(on_policy_worker, args=(2, free_port(), engine, top_k), nprocs=2)
