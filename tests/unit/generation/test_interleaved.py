"""Interleaved sampling (speculative KD): the cached two-model decoder writes what the rule says,
token for token, and draws each token from the distribution the rule defines."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.generation.decoding import decodes_in_step, left_padded, prompt_tokens, widest
from lightning_kd.generation.interleaved import interleaved_sample, sample, vetoed_draw
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from tests.conftest import TINY_LLAMA
from tests.unit.distill.test_on_policy import chat_batch
from tests.unit.training.test_strategies import free_port

TEACHER = TeacherSpec(path=None, config=dict(TINY_LLAMA))


def distiller(**distill) -> Distiller:
    options = {"on_policy": 1.0, "on_policy_tokens": 6, "compile": False}
    options |= {"on_policy_teacher_top_k": 8, "divergence": "reverse_kl"} | distill
    torch.manual_seed(0)
    config = DistillConfig(**options)
    spec = StudentSpec(num_layers=2)
    return Distiller.from_specs(TEACHER, spec, config, byte_tokenizer(), "32-true").double()


def prompts() -> dict[str, torch.Tensor]:
    """Two left-padded prompts of different lengths (the shorter one padded)."""
    return left_padded(prompt_tokens(chat_batch()), 0, torch.device("cpu"))


def reference(student, teacher, left, steps: int, temperature: float, top_k: int):
    """The rule computed plainly: both models re-read the whole sequence at every step (no
    cache), the next token drawn as :func:`vetoed_draw` draws it."""
    ids, mask = left["input_ids"], left["attention_mask"]
    tokens, own = [], []
    for _ in range(steps):
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": position}
        with torch.no_grad():
            last = [model(**inputs).logits[:, -1] for model in (student, teacher)]
        token, accepted = vetoed_draw(*last, temperature, top_k)
        tokens.append(token)
        own.append(accepted)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(tokens, 1), torch.stack(own, 1)


@pytest.mark.parametrize("top_k", [1, 8, 257])
def test_the_cached_decoder_writes_what_the_plain_rule_writes(top_k: int) -> None:
    """Left padding, two KV caches, one token a step: the same tokens (and the same
    own/replaced marks) as re-reading everything each step, in fp64."""
    model = distiller()
    left = prompts()
    torch.manual_seed(3)
    got, own = interleaved_sample(
        model.student,
        model.teacher,
        left,
        max_new_tokens=6,
        temperature=1.0,
        top_k=top_k,
        stop_ids=(),
        pad_token_id=0,
    )
    torch.manual_seed(3)
    expected, expected_own = reference(model.student, model.teacher, left, 6, 1.0, top_k)
    assert torch.equal(got, expected)
    assert torch.equal(own, expected_own)
    if top_k == 257:  # the whole vocabulary: plain sampling from the student, nothing vetoed
        assert own.all()
    assert model.student.training is True  # its mode restored after eval-mode decoding


def test_each_token_is_drawn_from_the_vetoed_mixture() -> None:
    """P(y) = q(y)·1[y ∈ top-k of p] + (1 − q(top-k))·p(y), by counting 200,000 draws."""
    student = torch.log(torch.tensor([0.1, 0.4, 0.3, 0.2], dtype=torch.float64))
    teacher = torch.log(torch.tensor([0.5, 0.05, 0.25, 0.2], dtype=torch.float64))
    rows = 200_000
    torch.manual_seed(0)
    token, accepted = vetoed_draw(student.expand(rows, 4), teacher.expand(rows, 4), 1.0, 2)
    q, p = student.exp(), teacher.exp()
    in_top = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)  # the teacher's top 2
    expected = q * in_top + (1 - (q * in_top).sum()) * p
    counted = torch.bincount(token, minlength=4).double() / rows
    assert torch.allclose(counted, expected, atol=4e-3), (counted, expected)
    assert abs(accepted.double().mean() - (q * in_top).sum()) < 4e-3


def test_temperature_sharpens_both_draws() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]]).expand(50_000, 3)
    torch.manual_seed(0)
    cold = torch.bincount(sample(logits, 0.5), minlength=3).double() / 50_000
    expected = torch.softmax(logits[0].double() / 0.5, -1)
    assert torch.allclose(cold, expected, atol=6e-3)


def test_a_row_stops_at_its_end_token_and_pads_after_it() -> None:
    """A teacher whose top 1 is always the end token, top_k 1: the first token is either the
    student's end token or the teacher's replacement, and every row has ended by then."""
    model = distiller(on_policy_teacher_top_k=1)
    end = 7

    def ends(module, args, output):  # the end token's logit raised: the teacher's only choice
        output.logits[..., end] = 50.0
        return output

    model.teacher.register_forward_hook(ends)
    torch.manual_seed(0)
    got, _ = interleaved_sample(
        model.student,
        model.teacher,
        prompts(),
        max_new_tokens=5,
        temperature=1.0,
        top_k=1,
        stop_ids=(end,),
        pad_token_id=0,
    )
    assert got.shape == (2, 1) and (got == end).all()


def test_the_distiller_trains_on_interleaved_completions_and_counts_the_share() -> None:
    model = distiller(on_policy_teacher_top_k=128)  # about half the vocabulary: both kinds
    batch = chat_batch()
    sampled = model.on_policy.sample(model.student, batch, 5, model.teacher)
    again = model.on_policy.sample(model.student, batch, 5, model.teacher)
    assert torch.equal(sampled["input_ids"], again["input_ids"])  # seeded by the draw
    for row, prompt in enumerate(prompt_tokens(batch)):
        assert (sampled["labels"][row, : len(prompt)] == IGNORE_INDEX).all()
    model.on_policy.tally.take()
    objective, sums = model(batch, draw=5)
    objective.backward()
    assert int(sums.tokens) == int((sampled["labels"] != IGNORE_INDEX).sum())
    share = model.on_policy.tally.take()
    assert share is not None and 0.0 < share < 1.0
    assert model.on_policy.tally.take() is None  # taken: counting starts again


def decode_in_step_worker(rank: int, world_size: int, port: int) -> None:
    """One rank: rank 0's one row ends at its first token, rank 1's two rows never end. Alone
    they run 1 and 6 forwards of each model; in step both run 6, and write what they wrote alone."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = distiller()  # the same unsharded models on both ranks
    assert not decodes_in_step(model.student, model.teacher)  # whole models decode alone
    rows = prompt_tokens(chat_batch())  # prompts of 3 and 5 tokens
    left = left_padded(rows if rank else rows[:1], 0, torch.device("cpu"))
    widths = [left["input_ids"].shape[1]] * 2
    dist.all_gather_object(widths, widths[0])
    assert widest(widths[rank], torch.device("cpu"), True) == max(widths) > min(widths)
    assert widest(widths[rank], torch.device("cpu"), False) == widths[rank]
    options = {"max_new_tokens": 6, "temperature": 1.0, "top_k": 8, "pad_token_id": 0}

    def decode(stop: int | None, in_step: bool) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(3)
        args = (model.student, model.teacher, left)
        stops = () if stop is None else (stop,)
        return interleaved_sample(*args, stop_ids=stops, in_step=in_step, **options)

    first = int(decode(None, False)[0][0, 0])
    end = first if rank == 0 else None  # rank 0's first token is its end token
    alone = decode(end, False)
    forwards = {"student": 0, "teacher": 0}
    for role in forwards:

        def count(module, args, output, role=role) -> None:
            forwards[role] += 1

        getattr(model, role).register_forward_hook(count)
    together = decode(end, True)
    assert all(torch.equal(a, b) for a, b in zip(together, alone, strict=True))
    assert alone[0].shape[1] == (1 if rank == 0 else 6)
    assert forwards == {"student": 6, "teacher": 6}
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_decode_in_step_until_every_rank_is_done() -> None:
    """The interleaved loop's synchronisation (sharded models: each forward a collective): a rank
    whose rows have ended keeps running both models, drawing nothing, until the other is done;
    the widest prompt over ranks sets every rank's token budget."""
    mp.spawn(decode_in_step_worker, args=(2, free_port()), nprocs=2)


def test_bad_top_k_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"needs distill.on_policy > 0"):
        DistillConfig(on_policy_teacher_top_k=25)
    with pytest.raises(ValueError, match=r"distill.on_policy_teacher_top_k=0"):
        DistillConfig(on_policy=0.5, on_policy_teacher_top_k=0)
