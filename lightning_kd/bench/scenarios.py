"""What the benchmark measures, in the process that runs it: the KD-step scenarios of
:mod:`lightning_kd.bench.runner` on the composed configuration (the logit loss alone:
``bench/loss.py``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lightning_kd.bench.measure import fault_in, peak_mb, release_free_memory, reset_peak, timed
from lightning_kd.bench.sampling import (
    SAMPLING,
    TimedSampling,
    on_policy_overrides,
    prompted,
    step_counts,
)
from lightning_kd.bench.teacher_sides import teacher_sides
from lightning_kd.data.encoding import text_ids

SCENARIOS = (
    "floor",
    "teacher",
    "teacher_int8",
    "naive",
    "full_logits",
    "lightning_kd",
    "lora",
    "free_floor",
    "cached",
    "on_policy",
    "interleaved",
    "logits_only",
    "cross_tokenizer",
    "cross_spans",
    "two_teachers",
)
CACHED = ("free_floor", "cached")
"""Scenarios without teacher weights in the process: ``free_floor`` a CE-only step (chunked CE,
``distill.kd_weight=0``), ``cached`` a logit-KD step from the teacher's top-k records; both
without feature matching (``distill.features=null``), so they compare with each other."""

LOGITS_ONLY = ["distill.features=null", "distill.blockwise_passes=0"]
OTHER_PATHS = {
    "logits_only": LOGITS_ONLY,
    "cross_tokenizer": [*LOGITS_ONLY, "distill.cross_tokenizer=always", "distill.cross_top_k=64"],
}
OTHER_PATHS["cross_spans"] = [*OTHER_PATHS["cross_tokenizer"], "distill.cross_span_weight=1"]
"""Scenarios that are lightning_kd's step on logits alone (``logits_only``, the others' baseline:
hidden states pair positions of one tokenisation) and through another teacher path, on the same
teacher, student and batch: the cross-tokenizer path with the teacher's own tokenizer (each batch
decoded, re-tokenised and aligned, the teacher's top 64 at aligned positions), ``cross_spans``
(that step with the span term, ``distill.cross_span_weight=1``: the teacher's log-probability of
each span, the student's of its own, their binary KL), and
``two_teachers`` (the teacher twice, half the weight each: what a second teacher adds)."""

TEXT_BATCH = ("logits_only", "cross_tokenizer", "cross_spans", "two_teachers")
"""Scenarios measured on a batch of real text (the cross-tokenizer path decodes it)."""

Step = Callable[[dict], None]


def build_distiller(
    args: argparse.Namespace,
    chunked: bool,
    *overrides: str,
    quantize: str | None = None,
    lora: bool = False,
):
    """The distiller of ``python run.py`` (the same composed config) on ``--teacher``, with the
    benchmark's own student depth, precision, loss path and ``teacher.quantize``; ``lora``:
    ``student.lora``'s defaults."""
    from lightning_kd.launch.build import build_distiller as build
    from lightning_kd.launch.config import compose_config

    cfg = compose_config(
        [
            f"teacher.path={args.teacher}",
            f"teacher.dtype={args.teacher_dtype}",
            f"student.num_layers={args.student_layers}",
            f"distill.chunked={chunked}",
            f"distill.compile={args.compile}",
            f"teacher.quantize={quantize or 'null'}",
            *(["student.lora={}"] if lora else []),
            *overrides,
        ]
    )
    return build(cfg)[0]


class RecordsInMemory:
    """A cached teacher whose records of the benchmark's one batch are held in memory: the
    step's cost without the shard read (a dictionary lookup of an already-loaded shard)."""

    def __init__(self, records) -> None:
        self.cached = records

    def records(self, batch: dict, split: str):
        rows, positions = batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1
        return self.cached[:rows, :positions], {}  # the warm-up batch: the timed one's corner


def teacher_free(name: str, args: argparse.Namespace, batch: dict):
    """The distiller of a teacher-free scenario: built as usual, the teacher's top-k records of
    ``batch`` taken (``cache.k`` of the composed config, as ``lightning-kd cache``
    writes them), then the teacher dropped and its memory handed back."""
    from lightning_kd.cache.format import CacheSpec
    from lightning_kd.cache.writer import WriteStats, shard_records
    from lightning_kd.distill.distiller import Distiller
    from lightning_kd.launch.config import compose_config
    from lightning_kd.losses.topk import TopKTeacher

    # Logits only: these two are compared with each other, and the teacher's hidden states the
    # default objective matches (distill.features) would need the teacher or a cache of them.
    overrides = ["distill.features=null", "distill.blockwise_passes=0"]
    overrides += ["distill.kd_weight=0"] if name == "free_floor" else []
    built = build_distiller(args, True, *overrides)
    device = torch.device(args.device)
    teacher = built.teacher.to(device)
    ids = batch["input_ids"]
    with autocast_for(device, args.precision):  # the writer's own records, as stored
        stored = shard_records(
            teacher,
            list(ids),
            lambda rows: {"input_ids": torch.stack(rows), "attention_mask": torch.ones_like(ids)},
            CacheSpec(k=compose_config([]).cache.k, batch_size=len(ids)),
            ids.shape[1],
            device,
            WriteStats(),
        )
    vocab = teacher.get_output_embeddings().weight.shape[0]
    records = TopKTeacher(
        stored["ids"].long().to(device),
        stored["log_probs"].float().to(device),
        stored["tail"].to(device),
        vocab,
        stored["target"].to(device),
    )
    del teacher, stored
    distiller = Distiller(
        None,
        built.student,
        built.distill,
        layer_map=built.layer_map,
        cache=RecordsInMemory(records),
    )
    del built
    release_free_memory()
    return distiller.to(device)


def make_batch(vocab: int, batch: int, seq: int, device: torch.device) -> dict:
    """A seeded batch of random token ids, all attended, labelled with themselves."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=generator).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def text_batch(teacher: str, batch: int, seq: int, device: torch.device) -> dict:
    """A batch of the embedded corpus's text (its first documents, joined with EOS), for the
    scenarios that decode ids to text: random ids are no text to re-tokenise."""
    from lightning_kd.data.packing import pack_blocks
    from lightning_kd.data.reading import DEFAULT_CORPUS, read_documents
    from lightning_kd.data.token_bytes import separator_id
    from lightning_kd.models.loading import TeacherSpec, load_tokenizer

    tokenizer = load_tokenizer(TeacherSpec(path=teacher))
    documents, total = [], 0
    for text in read_documents(DEFAULT_CORPUS):
        documents.append(text_ids(tokenizer, [text])[0])
        total += len(documents[-1]) + 1
        if total >= batch * seq:
            break
    ids = pack_blocks(documents, seq, separator_id(tokenizer))[:batch].to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def autocast_for(device: torch.device, precision: str) -> torch.autocast:
    """The autocast context of ``trainer.precision``: on for ``*-mixed``, a no-op otherwise."""
    return torch.autocast(
        device.type,
        dtype=torch.float16 if precision.startswith("16") else torch.bfloat16,
        enabled=precision.endswith("-mixed"),
    )


def scenario_steps(
    distiller: torch.nn.Module, optimizer: torch.optim.Optimizer, autocast: torch.autocast
) -> dict[str, Step]:
    """Each scenario's step on a batch, by name (``full_logits`` and ``lightning_kd`` differ only
    in the distiller they are given)."""
    teacher, student = distiller.teacher, distiller.student

    def optimizer_step(loss: torch.Tensor) -> None:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def floor(batch: dict) -> None:
        with autocast:
            loss = student(**batch, use_cache=False).loss
        optimizer_step(loss)

    def teacher_forward(batch: dict) -> None:
        with torch.no_grad(), autocast:
            teacher(input_ids=batch["input_ids"], use_cache=False).logits.sum().item()

    def naive(batch: dict) -> None:
        with autocast:
            teacher_out = teacher(**batch, output_hidden_states=True, use_cache=False)
            student_out = student(**batch, output_hidden_states=True, use_cache=False)
            kd = F.kl_div(
                F.log_softmax(student_out.logits.float(), -1),
                F.log_softmax(teacher_out.logits.detach().float(), -1),
                log_target=True,
                reduction="batchmean",
            )
        optimizer_step(0.5 * kd + 0.5 * student_out.loss)
        del teacher_out  # the teacher's graph lived through the whole step

    def lightning_kd(batch: dict) -> None:
        with autocast:
            objective, sums = distiller(batch)
        optimizer_step(objective / sums.tokens)

    # Every other scenario is lightning_kd's step on the distiller it was given: records for
    # `cached`, answers sampled first for SAMPLING, another teacher path for TEXT_BATCH's.
    steps = dict.fromkeys(SCENARIOS, lightning_kd) | {"floor": floor, "naive": naive}
    return steps | dict.fromkeys(("teacher", "teacher_int8"), teacher_forward)


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    """One scenario's peak memory and median step time, in this process."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    batch = make_batch(teacher_vocab(args), args.batch, args.seq, device)
    if name in TEXT_BATCH:
        batch = text_batch(args.teacher, args.batch, args.seq, device)
    if name in CACHED:
        distiller = teacher_free(name, args, batch)
    elif name in SAMPLING:
        batch = prompted(batch)
        overrides = on_policy_overrides(args, interleaved=name == "interleaved")
        distiller = build_distiller(args, True, *overrides).to(device)
    elif name in OTHER_PATHS or name == "two_teachers":
        distiller = build_distiller(args, True, *other_path(name, args)).to(device)
    else:
        quantize = "int8" if name == "teacher_int8" else None
        distiller = build_distiller(
            args, chunked=name != "full_logits", quantize=quantize, lora=name == "lora"
        ).to(device)
    fault_in(distiller)
    if name in SAMPLING:
        distiller.on_policy = TimedSampling(distiller.on_policy, device)
    trainable = list(distiller.trainable_parameters())
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    step = scenario_steps(distiller, optimizer, autocast_for(device, args.precision))[name]
    if name == "naive":  # the common mistake: a teacher that is not frozen keeps its graph
        distiller.teacher.requires_grad_(True)
    warmups, repeats = step_counts(name, args)
    warm_up(name, args, step, batch, warmups)
    reset_peak(device)
    seconds = timed(lambda: step(batch), device, 0, repeats)
    params = sum(p.numel() for p in trainable)
    row = {"scenario": name, "peak_mb": peak_mb(device), "step_s": seconds, "trainable": params}
    if name in SAMPLING:
        row |= distiller.on_policy.summary(repeats)
    if name == "two_teachers":
        autocast = autocast_for(device, args.precision)
        row["teachers"] = teacher_sides(distiller, batch, device, autocast, args.repeats)
    return row


def warm_up(name: str, args: argparse.Namespace, step: Step, batch: dict, steps: int) -> None:
    """``steps`` untimed steps. ``--quick`` warms up on a short batch where lengths are fixed:
    the one-time costs are paid, the seconds of a full-size step are not."""
    short = args.quick and name not in SAMPLING
    warmup_batch = {key: value[:1, :32] for key, value in batch.items()} if short else batch
    for _ in range(steps):
        step(warmup_batch)


def other_path(name: str, args: argparse.Namespace) -> list[str]:
    """The overrides of an :data:`OTHER_PATHS` scenario (or ``two_teachers``)."""
    if name == "two_teachers":
        second = f"{{name: second, weight: 0.5, path: '{args.teacher}'}}"
        return [*LOGITS_ONLY, f"teachers=[{{name: first, weight: 0.5}}, {second}]"]
    return OTHER_PATHS[name]


def teacher_vocab(args: argparse.Namespace) -> int:
    """The teacher's vocabulary size, from its config alone (no weights)."""
    from transformers import AutoConfig

    from lightning_kd.models.sources import teacher_dir

    return AutoConfig.from_pretrained(teacher_dir(args.teacher, None)).vocab_size
