"""Block-wise repair (``distill.blockwise_passes``): which layers it trains, what each is fed and
learns, that nothing else moves, and where it runs in a fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_kd.cache.hidden_states import mapped_paths
from lightning_kd.data.loaders import FullBatchShare, passes_over, sharded_loader
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.repair import (
    Captures,
    Resumable,
    Span,
    repair,
    repair_plan,
    repair_sums,
)
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.teacher_cache import choose
from lightning_kd.launch.teacher_reads import passes
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.training.summary import RunSummary
from lightning_kd.utils.refusal import Refused
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer
from tests.integration.test_cli import command_here
from tests.unit.cache.test_cache_teacher import STUDENT, write
from tests.unit.cache.test_cache_teacher import TEACHER as CACHED_TEACHER

REPAIR = DistillConfig(blockwise_passes=1, compile=False)  # no feature term: the repair alone


def distiller_for(student: StudentSpec, distill: DistillConfig = REPAIR) -> Distiller:
    """An fp32 tiny Llama teacher (4 layers) and ``student`` copied from it, teacher online."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32")
    return Distiller.from_specs(teacher, student, distill, byte_tokenizer(), "32-true")


def batch_of(corpus: Path) -> dict[str, torch.Tensor]:
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    return next(iter(datamodule.train_dataloader()))


def test_the_plan_repairs_trainable_layers_whose_span_holds_several_teacher_layers() -> None:
    # Teacher layers 0-3. Student [0, 1, 3]: layer 0 stands for teacher 0 alone, layer 1 for
    # teacher 1-2 (fed teacher 0's output), layer 2 for teacher 3 alone.
    plan = repair_plan(distiller_for(StudentSpec(layers=[0, 1, 3])))
    assert plan == [Span("model.layers.1", "model.layers.0", "model.layers.2")]
    # Student [0, 3]: layer 0 stands for teacher 0-2 and reads the embeddings, as it does anyway.
    plan = repair_plan(distiller_for(StudentSpec(num_layers=2)))
    assert plan == [Span("model.layers.0", None, "model.layers.2")]
    # Student [1, 2, 3]: layer 0 copies teacher 1 but reads the embeddings: it stands for
    # teacher 0-1 (it was left out, as if it stood for teacher 1 alone: probe 43).
    plan = repair_plan(distiller_for(StudentSpec(layers=[1, 2, 3])))
    assert plan == [Span("model.layers.0", None, "model.layers.1")]
    # A frozen layer is not repaired: student [0, 2], its first layer (teacher 0-1) frozen.
    plan = repair_plan(distiller_for(StudentSpec(layers=[0, 2], freeze_layers=1)))
    assert plan == [Span("model.layers.1", "model.layers.1", "model.layers.3")]


def test_a_repair_of_no_layer_is_refused_naming_why() -> None:
    """It ran 0 passes of 0 layers without a word, and teacher_cache=auto wrote a cache for
    its passes, which changed the KD term to the cache's (probe 55)."""
    frozen = distiller_for(StudentSpec(layers=[0, 2, 3], freeze_layers=1))
    with pytest.raises(Refused, match=r"\['model.layers.0'\] each stand for several teacher"):
        repair_plan(frozen)
    with pytest.raises(Refused, match="each copies one teacher layer as it is, none stands"):
        repair_plan(distiller_for(StudentSpec(layers=[0, 1, 2, 3])))


def test_a_fed_layer_reads_the_teachers_state_and_its_loss_reaches_it_alone(corpus) -> None:
    """Student layer 1, a copy of teacher layer 1 fed teacher layer 0's output, computes exactly
    teacher layer 1's output: its loss is the cosine distance between teacher layers 1 and 2."""
    distiller = distiller_for(StudentSpec(layers=[0, 1, 3]))
    batch = batch_of(corpus)
    plan = repair_plan(distiller)
    captures = Captures.of(distiller, plan)
    sums, count = repair_sums(distiller, plan, batch, captures)
    with torch.no_grad():
        hidden = distiller.teacher(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"][:, 1:]  # the scored positions: every next-token target
    distance = 1 - F.cosine_similarity(hidden[2], hidden[3], dim=-1)[:, :-1]
    assert count == mask.sum()
    torch.testing.assert_close(sums[0], (distance * mask).sum(), rtol=1e-5, atol=1e-5)
    sums[0].backward()
    layers = distiller.student.model.layers
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layers[1].parameters())
    assert all(p.grad is None for i in (0, 2) for p in layers[i].parameters())
    assert all(not c.records for c in captures.all()), "captures cleared"


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_hand_built_batchs_pads_are_not_repaired_on(corpus, side: str) -> None:
    """The python-api loop's batch (labels = input_ids, pads and all): the repair scored its
    pads, where a step does not, and a batch lacking a key was a KeyError (probe 51)."""
    distiller = distiller_for(StudentSpec(layers=[0, 1, 3]))
    plan = repair_plan(distiller)
    captures = Captures.of(distiller, plan)
    row = batch_of(corpus)["input_ids"][:1, :20]
    pads = torch.zeros(1, 6, dtype=torch.long)
    ids = torch.cat([pads, row] if side == "left" else [row, pads], dim=1)
    mask = torch.cat(
        [pads, torch.ones_like(row)] if side == "left" else [torch.ones_like(row), pads], 1
    )
    padded = {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}
    alone = {"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()}
    sums, count = repair_sums(distiller, plan, padded, captures)
    want, want_count = repair_sums(distiller, plan, alone, captures)
    assert int(count) == int(want_count) == 19
    torch.testing.assert_close(sums[0], want[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"the batch lacks \['labels'\]"):
        repair_sums(distiller, plan, {"input_ids": row, "attention_mask": row}, captures)


def test_repair_lowers_each_layers_loss_and_moves_nothing_else(corpus) -> None:
    distiller = distiller_for(StudentSpec(layers=[0, 1, 3]))
    before = {k: v.clone() for k, v in distiller.state_dict().items()}
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    loader = sharded_loader(datamodule.train_dataloader(), 1, 0)
    report = repair(distiller, passes_over(loader, 3, torch.device("cpu")), 3 * len(loader), 1e-3)
    assert report.passes == 3 and report.steps == 3 * len(loader)
    assert report.layers == ["model.layers.1"]
    assert report.last[0] < 0.8 * report.first[0]
    after = distiller.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("student.model.layers.1.") for k in moved)
    assert distiller.training


def test_a_repair_that_diverges_stops_naming_its_own_rate(corpus) -> None:
    """At distill.blockwise_lr=1e9 it went on to its end (nan→nan) and said it was done;
    training then failed and blamed optimizer.lr, in a loop (probe 59)."""
    from lightning_kd.distill.repair_checks import RepairDiverged

    distiller = distiller_for(StudentSpec(layers=[0, 1, 3]))
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    loader = sharded_loader(datamodule.train_dataloader(), 1, 0)
    kept = []
    resumable = Resumable(keep=kept.append, every=1)
    refused = r"^the block-wise repair's loss is not finite at repair step \d+ \(layers model.lay"
    refused += r".*Lower distill.blockwise_lr \(e.g. 1e\+08"
    with pytest.raises(RepairDiverged, match=refused):
        repair(distiller, passes_over(loader, 3, torch.device("cpu")), 30, 1e9, resumed=resumable)
    assert all(all(torch.isfinite(t).all() for t in state["params"].values()) for state in kept)


class StopAfter:
    """A repair's ``stop``: yes after step ``steps`` (asked once a step)."""

    def __init__(self, steps: int) -> None:
        self.steps, self.asked = steps, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked == self.steps


def repaired(corpus, stop_after: int | None = None, saved: dict | None = None):
    """The student's repaired layer and the report of a 3-pass repair, or of one stopped after
    step ``stop_after`` (then the progress it kept), or of one going on from ``saved``."""
    from lightning_kd.distill.repair import Resumable
    from lightning_kd.utils.stopping import Interrupted

    distiller = distiller_for(StudentSpec(layers=[0, 1, 3]))
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    loader = sharded_loader(datamodule.train_dataloader(), 1, 0)
    kept: list[dict] = []
    resumed = Resumable(kept.append, every=1000, saved=saved)
    done, ended = (saved["done"], saved["report"]["passes"]) if saved else (0, 0)
    batches = passes_over(loader, 3, torch.device("cpu"), ended, done - ended * len(loader))
    stop = None if stop_after is None else StopAfter(stop_after)
    try:
        report = repair(distiller, batches, 3 * len(loader), 1e-3, stop=stop, resumed=resumed)
    except Interrupted:
        return None, None, kept[-1]
    return distiller.student.model.layers[1].state_dict(), report, kept


@pytest.mark.parametrize("stop_after", [2, "pass"])
def test_a_stopped_repair_goes_on_from_what_it_kept_exactly(corpus, stop_after) -> None:
    """No training checkpoint holds a repair: a run stopped in it began it again from the
    copied layers, every time (probe 47). Stopped mid-pass, or after a pass's last batch
    (before its means are taken), it goes on to the same weights and report."""
    whole, report, kept = repaired(corpus)
    assert kept[-1]["done"] == report.steps  # kept at its end too: a stop before step 1 loses none
    per_pass = report.steps // 3
    _, _, saved = repaired(corpus, stop_after=per_pass if stop_after == "pass" else stop_after)
    again, resumed_report, _ = repaired(corpus, saved=saved)
    for key, value in whole.items():
        assert torch.equal(again[key], value), key
    assert (resumed_report.passes, resumed_report.steps) == (report.passes, report.steps)
    assert resumed_report.first == pytest.approx(report.first)
    assert resumed_report.last == pytest.approx(report.last)


def test_activation_checkpointing_repairs_the_same(corpus) -> None:
    """The checkpointed layer's re-forward in backward is fed the same teacher state."""
    results = []
    for checkpointing in (False, True):
        distiller = distiller_for(
            StudentSpec(layers=[0, 1, 3], activation_checkpointing=checkpointing)
        )
        datamodule = make_datamodule([corpus])
        datamodule.setup()
        loader = sharded_loader(datamodule.train_dataloader(), 1, 0)
        repair(distiller, passes_over(loader, 1, torch.device("cpu")), len(loader), 1e-3)
        results.append(distiller.student.model.layers[1].state_dict())
    for key, value in results[0].items():
        torch.testing.assert_close(results[1][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_the_sharded_loader_splits_one_processs_batches_between_ranks(corpus) -> None:
    """Each rank's training loader ends in unscored padding where the blocks are odd (it is
    Lightning's under DDP): the repair shares the real blocks alone, as one process reads them
    (it permuted the padded count: another order, and a repaired student 15 % off in loss)."""
    datamodule = make_datamodule([corpus], batch_size=4)
    datamodule.setup()
    datamodule.train_examples = datamodule.train_examples[
        : len(datamodule.train_examples) // 2 * 2 - 1
    ]
    one = sharded_loader(datamodule.train_dataloader(), 1, 0)
    datamodule.batch_size = 2
    ranks = []
    for rank in (0, 1):
        datamodule.rank = lambda rank=rank: (rank, 2)  # as under a two-process trainer
        ranks.append(sharded_loader(datamodule.train_dataloader(), 2, rank))
    for number in (0, 1):
        for loader in (one, *ranks):
            loader.sampler.set_epoch(number)
        shares = [list(loader) for loader in ranks]
        for step, whole in enumerate(one):
            got = torch.cat([share[step]["block_index"] for share in shares]).sort().values
            assert torch.equal(got, whole["block_index"].sort().values)
    with pytest.raises(ValueError, match="3 training blocks do not fill one global batch of 2"):
        FullBatchShare(3, batch_size=2, world_size=2, rank=0, seed=0)


def test_what_cannot_be_repaired_is_refused() -> None:
    with pytest.raises(ValueError, match="blockwise_passes=-1: must be >= 0"):
        DistillConfig(features="spans", blockwise_passes=-1)
    random_student = distiller_for(StudentSpec(config={"num_hidden_layers": 2}))
    with pytest.raises(ValueError, match="not one from student.path or student.config"):
        repair_plan(random_student)
    lora = distiller_for(StudentSpec(num_layers=2, lora={"r": 2}))
    with pytest.raises(ValueError, match="LoRA student"):
        repair_plan(lora)
    cfg = compose_config(["distill.blockwise_passes=1", "strategy=fsdp"])
    assert any("distill.blockwise_passes with a sharding" in e for e in config_errors(cfg))
    for student in ("student.config={num_hidden_layers: 2}", "student.lora={r: 2}"):
        cfg = compose_config(["distill.blockwise_passes=1", student])
        assert any("the repair trains whole layers copied from" in e for e in config_errors(cfg))
    cfg = compose_config(["distill.blockwise_passes=1.5"])
    assert any("distill.blockwise_passes=1.5: must be an integer" in e for e in config_errors(cfg))


def test_a_fit_repairs_before_its_first_step_and_a_resume_does_not(corpus, tmp_path) -> None:
    module = make_module(  # the rate chosen for SmolLM2's 576-wide layers overshoots this tiny one
        TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32"),
        features=None,
        blockwise_passes=2,
        blockwise_lr=1e-3,
    )
    trainer = make_trainer(max_steps=2, limit_val_batches=1, val_check_interval=2)
    trainer.fit(module, datamodule=make_datamodule([corpus]))
    assert module.blockwise is not None and module.blockwise.passes == 2
    assert module.blockwise.last[0] < module.blockwise.first[0]
    summary = RunSummary(after={}, blockwise=module.blockwise.as_dict())
    assert "| block-wise repair before training |  | 2 passes," in summary.markdown()
    checkpoint = tmp_path / "step2.ckpt"
    trainer.save_checkpoint(checkpoint)
    resumed = make_module(
        TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32"),
        features=None,
        blockwise_passes=2,
    )
    trainer = make_trainer(max_steps=3, limit_val_batches=1, val_check_interval=3)
    trainer.fit(resumed, datamodule=make_datamodule([corpus]), ckpt_path=checkpoint)
    # Not repaired again: the report is the checkpoint's, its seconds those of the first fit.
    assert resumed.blockwise == module.blockwise and trainer.global_step == 3


@pytest.mark.parametrize("bar", [True, False])
def test_the_repair_shows_its_progress_where_training_shows_its_own(corpus, capsys, bar) -> None:
    """The default run's repair is minutes before the first step, and printed nothing until its
    end: it looked hung (probe 41). It counts its steps on a bar, unless training's is off."""
    module = make_module(
        TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32"),
        features=None,
        blockwise_passes=2,
    )
    trainer = make_trainer(max_steps=1, limit_val_batches=0, enable_progress_bar=bar)
    trainer.fit(module, datamodule=make_datamodule([corpus]))
    steps = module.blockwise.steps
    shown = capsys.readouterr().err
    assert ("block-wise repair: 100%|" in shown and f"| {steps}/{steps} [" in shown) is bar


def test_from_a_teacher_cache_the_repair_reads_the_cached_states(corpus, tmp_path) -> None:
    """The same losses as with the teacher online (to the cache's fp16 rounding of the states),
    and a repair that runs with no teacher in the distiller."""
    cache = write(tmp_path / "cache", corpus, k=8, features="spans")
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    results = []
    for teacher_cache in (None, str(cache)):
        distill = DistillConfig(blockwise_passes=1, compile=False, teacher_cache=teacher_cache)
        args = (CACHED_TEACHER, STUDENT, distill, byte_tokenizer(), "32-true", datamodule)
        distiller = Distiller.from_specs(*args)
        plan = repair_plan(distiller)
        sums, count = repair_sums(distiller, plan, batch, Captures.of(distiller, plan))
        results.append((distiller, sums[0].detach(), count))
    (_, online, count), (cached, from_cache, cached_count) = results
    assert cached.teacher is None and count == cached_count
    torch.testing.assert_close(from_cache, online, rtol=1e-2, atol=0)
    loader = sharded_loader(datamodule.train_dataloader(), 1, 0)
    report = repair(cached, passes_over(loader, 2, torch.device("cpu")), 2 * len(loader), 1e-3)
    assert report.last[0] < report.first[0]


def test_a_cache_for_a_repaired_run_holds_the_span_ends(tiny_teacher) -> None:
    teacher = load_teacher(tiny_teacher)
    student = StudentSpec(num_layers=2)  # teacher layers 0 and 3: spans end at 2 and 3
    paths = mapped_paths(DistillConfig(blockwise_passes=1), student, teacher, "causal_lm")[0]
    assert paths == ["model.layers.2", "model.layers.3"]
    both = DistillConfig(features="uniform", blockwise_passes=1)  # uniform: layers 0 and 3
    paths = mapped_paths(both, student, teacher, "causal_lm")[0]
    assert paths == ["model.layers.0", "model.layers.2", "model.layers.3"]
    with pytest.raises(ValueError, match="neither is set"):
        mapped_paths(DistillConfig(), student, teacher, "causal_lm")[0]


@pytest.mark.integration  # runs the command line (in this process)
def test_the_command_line_caches_the_span_ends_and_repairs_from_them(tmp_path, capsys) -> None:
    """``debug=smoke`` with the default run's repair: auto counts its passes, caches the teacher
    (logits and span ends, with distill.features=null), repairs from the cache, reports it, and
    drops the span ends once the run is done (test_cache_auto.py: unless asked to keep them); a
    resume finds the cache without them."""
    run_dir = tmp_path / "run"
    overrides = [
        "debug=smoke",
        "distill.blockwise_passes=2",
        "distill.features=null",
        "data.max_train_examples=20",  # 6 steps of 4 read 24 blocks: repair passes read 20
        "data.val_fraction=0.002",  # 22 validation blocks, read about twice each: a cache pays
        f"cache.dir={tmp_path / 'caches'}",
    ]
    result = command_here(capsys, "run", *overrides, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "3.20 passes over 20 training blocks (2.00 of them the block-wise repair's)" in (
        result.stdout
    )
    assert "blockwise repair: 1 student layers, 2 passes (10 steps)" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["teacher_cache"]["in_training"] == "cached once"
    assert summary["blockwise"]["passes"] == 2
    assert summary["blockwise"]["loss_last_pass"][0] < summary["blockwise"]["loss_first_pass"][0]
    cache = Path(summary["teacher_cache"]["distill.teacher_cache"])
    # Only the repair read the span ends: once the run is done the cache keeps the logits alone.
    assert json.loads((cache / "index.json").read_text())["key"]["features"] == []
    assert (
        "the repair's own hidden states ['model.layers.2', 'model.layers.3'] dropped"
        in (summary["teacher_cache"]["reason"])
    )
    assert summary["written"]["teacher cache"]["bytes"] == sum(
        p.stat().st_size for p in (cache / "shards").glob("*.safetensors")
    )
    # A resume repairs nothing and reads no state: it finds that cache and writes none.
    resume = ["trainer.max_steps=8", "resume_reset_optimizer=true", "ckpt_path=last"]
    resumed = command_here(capsys, "run", *overrides, f"hydra.run.dir={run_dir}", *resume)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "found whole in the shared cache" in resumed.stdout
    assert json.loads((run_dir / "summary.json").read_text())["teacher_cache"]["written_bytes"] == 0


def test_a_repair_pass_over_a_large_corpus_reads_what_training_reads(tmp_path) -> None:
    """On data far larger than a run reads, each repair pass takes the first max_steps batches of
    its epoch's permutation, and auto counts repair passes in that proportion (no cache)."""
    sampler = FullBatchShare(1000, batch_size=2, world_size=1, rank=0, seed=0, max_steps=5)
    assert len(sampler) == 10 and len(set(sampler)) == 10
    sampler.set_epoch(1)
    assert len(list(sampler)) == 10
    cfg = compose_config(["data.max_train_examples=null"], output_dir=tmp_path)
    training = 80 * 2 / 10_000
    assert passes(cfg, 10_000) == pytest.approx(training * 6)  # training + 5 repair passes of it
    assert choose(cfg, 10_000).path is None


def test_a_fit_without_a_data_module_is_told_what_the_repair_needs(corpus) -> None:
    module = make_module(
        TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32"), blockwise_passes=1
    )
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    trainer = make_trainer(max_steps=1, limit_val_batches=0)
    with pytest.raises(ValueError, match="pass one to fit"):
        trainer.fit(module, train_dataloaders=datamodule.train_dataloader())
