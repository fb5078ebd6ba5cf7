"""On-policy KD: the student's completions scored as the definition says, sampled reproducibly in
eval mode without a graph, and refused where it cannot run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lightning_kd.data.chat_tokens import PLAIN_TEMPLATE
from lightning_kd.distill.assembly import stop_at_turn_ends
from lightning_kd.distill.batches import checked_batch
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.on_policy import OnPolicy, draw_seed
from lightning_kd.generation.decoding import completions_batch, prompt_tokens, until_stop
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.loading import StudentSpec, TeacherSpec, byte_tokenizer
from tests.conftest import TINY_LLAMA

TEACHER = TeacherSpec(path=None, config=dict(TINY_LLAMA))


def chat_batch() -> dict[str, torch.Tensor]:
    """Two rows: a prompt (labels −100) then an answer (labelled), right-padded."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]])
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 3:6], labels[1, 5:8] = ids[0, 3:6], ids[1, 5:8]
    mask = torch.tensor([[1] * 6 + [0, 0], [1] * 8])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def distiller(**distill) -> Distiller:
    options = {"on_policy": 1.0, "on_policy_tokens": 5, "compile": False} | distill
    torch.manual_seed(0)
    return Distiller.from_specs(
        TEACHER, StudentSpec(num_layers=2), DistillConfig(**options), byte_tokenizer(), "32-true"
    )


def test_the_step_scores_the_students_own_completion_by_definition() -> None:
    """λ = 1, reverse KL: for the completion the student sampled, the objective is
    Σ over completion tokens of KL(q_student ‖ p_teacher) at the positions predicting them, and
    its gradients are that sum's (a direct computation from both models' full logits)."""
    model = distiller(divergence="reverse_kl", kd_weight=1.0, ce_weight=0.0).double()
    batch = chat_batch()
    sampled = model.on_policy.sample(model.student, batch, draw=7)
    for row, prompt in enumerate(prompt_tokens(batch)):
        assert torch.equal(sampled["input_ids"][row, : len(prompt)], prompt)
        assert (sampled["labels"][row, : len(prompt)] == IGNORE_INDEX).all()
        assert (sampled["labels"][row, len(prompt) :] != IGNORE_INDEX).sum() >= 1
    objective, sums = model(batch, draw=7)
    objective.backward()
    got = {n: p.grad.clone() for n, p in model.student.named_parameters() if p.grad is not None}
    model.zero_grad()

    inputs = {k: sampled[k] for k in ("input_ids", "attention_mask")}
    student = F.log_softmax(model.student(**inputs).logits[:, :-1], -1)
    with torch.no_grad():
        teacher = F.log_softmax(model.teacher(**inputs).logits[:, :-1], -1)
    scored = sampled["labels"][:, 1:] != IGNORE_INDEX
    direct = (student.exp() * (student - teacher)).sum(-1)[scored].sum()
    direct.backward()
    torch.testing.assert_close(objective, direct, rtol=1e-9, atol=1e-9)
    assert int(sums.tokens) == int(scored.sum())
    for name, parameter in model.student.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(got[name], parameter.grad, rtol=1e-7, atol=1e-10)


def test_the_ce_weight_trains_on_the_datasets_answers_never_on_the_students_own() -> None:
    """With CE beside the divergence, a sampled micro-batch's objective is the divergence alone
    (CE on the student's own sample has no expected gradient: noise), its CE still reported; a
    dataset micro-batch (here: before the warmup ends) keeps kd_weight · KD + ce_weight · CE."""
    mixed = distiller(divergence="reverse_kl", kd_weight=0.7, ce_weight=0.5, on_policy_warmup=1)
    alone = distiller(divergence="reverse_kl", kd_weight=0.7, ce_weight=0.0, on_policy_warmup=1)
    mixed, alone = mixed.double(), alone.double()
    batch = chat_batch()
    on_data, data_sums = mixed(batch, draw=3, step=0)
    torch.testing.assert_close(on_data, 0.7 * data_sums.kd + 0.5 * data_sums.ce)
    sampled, sums = mixed(batch, draw=3, step=1)
    reference, reference_sums = alone(batch, draw=3, step=1)
    assert int(sums.tokens) == int(reference_sums.tokens)  # the same completion was sampled
    torch.testing.assert_close(sampled, 0.7 * sums.kd, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sampled, reference, rtol=1e-12, atol=1e-12)
    assert float(sums.ce) > 0  # computed and logged, not trained on


def test_sampling_is_reproducible_in_eval_mode_without_a_graph() -> None:
    model = distiller(features="uniform")  # captures on: generation's forwards must not record
    model.train()
    batch = chat_batch()
    first = model.on_policy.sample(model.student, batch, draw=3)
    again = model.on_policy.sample(model.student, batch, draw=3)
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert model.student.training and not model.teacher.training
    assert all(p.grad is None for p in model.parameters())
    objective, _ = model(batch, draw=3)  # the captures hold exactly the step's forwards
    objective.backward()


def test_lambda_chooses_that_share_of_micro_batches_reproducibly() -> None:
    sampler = OnPolicy(0.25, 4, 1.0, seed=1, stop_ids=(256,), pad_token_id=256)
    chosen = [sampler.chooses(draw) for draw in range(2000)]
    assert 0.22 < sum(chosen) / len(chosen) < 0.28
    assert chosen == [sampler.chooses(draw) for draw in range(2000)]
    assert all(OnPolicy(1.0, 4, 1.0, 0, (), 0).chooses(d) for d in range(10))
    assert not any(OnPolicy(0.0, 4, 1.0, 0, (), 0).chooses(d) for d in range(10))


def test_two_seeds_choose_and_sample_apart() -> None:
    """Seeds were summed with the draw number (step · 1,000,003 + batch): seed 1 chose and
    sampled what seed 0 did one step later (probe 43)."""
    draws = [step * 1_000_003 + batch for step in range(40) for batch in range(4)]
    later = [draw + 1_000_003 for draw in draws]
    one, zero = OnPolicy(0.5, 4, 1.0, 1, (), 0), OnPolicy(0.5, 4, 1.0, 0, (), 0)
    assert [one.chooses(d) for d in draws] != [zero.chooses(d) for d in later]
    assert len({draw_seed(seed, draw, "sample") for seed in (0, 1) for draw in draws}) == 320
    assert draw_seed(0, 5, "choose") != draw_seed(0, 5, "sample")


def test_warmup_steps_train_on_the_datasets_answers_alone() -> None:
    sampler = OnPolicy(1.0, 4, 1.0, seed=0, stop_ids=(2,), pad_token_id=0, warmup=3)
    assert [sampler.chooses(draw, step) for draw, step in enumerate(range(5))] == [
        False,
        False,
        False,
        True,
        True,
    ]
    model = distiller(on_policy_warmup=2)
    batch = chat_batch()
    seen: list[bool] = []
    model.on_policy = Recording(model.on_policy, seen)
    for step in range(4):
        model(batch, draw=step, step=step)
    assert seen == [False, False, True, True]
    model(batch)  # no step given: the distiller's own count (4) of micro-batches
    assert seen[-1] is True
    with pytest.raises(ValueError, match=r"distill.on_policy_warmup=-1: must be >= 0"):
        DistillConfig(on_policy=0.5, on_policy_warmup=-1)


class Recording:
    """An on-policy sampler that records whether each micro-batch was sampled."""

    def __init__(self, sampler: OnPolicy, seen: list[bool]) -> None:
        self.sampler, self.seen = sampler, seen

    def replace(self, student, batch, draw, step, teacher=None):
        self.seen.append(self.sampler.chooses(draw, step))
        return self.sampler.replace(student, batch, draw, step, teacher)


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_on_policy_and_interleaved_kd_are_accepted_under_sharding(strategy: str) -> None:
    """Sharded students sample in step across ranks (on_policy.py); the block-wise repair is
    still refused under sharding."""
    sampled = [f"strategy={strategy}", "data=chat", "distill.on_policy=0.5"]
    sampled += ["distill.on_policy_teacher_top_k=8"]
    assert config_errors(compose_config([*sampled, "distill.blockwise_passes=0"])) == []
    repaired = compose_config([*sampled, "distill.blockwise_passes=1"])
    assert [e.split(":")[0] for e in config_errors(repaired)] == [
        "distill.blockwise_passes with a sharding strategy"
    ]
    # Completion samples are rank 0's alone, outside the step: a sharded forward would hang.
    no_repair = [*sampled, "distill.blockwise_passes=0", "+callbacks=samples"]
    (error,) = config_errors(compose_config(no_repair))
    assert error.startswith("callbacks.samples with a sharding strategy") and "drop" in error


def test_a_completion_ends_at_its_end_token_and_is_labelled_alone() -> None:
    assert until_stop(torch.tensor([4, 5, 9, 7, 9]), (3, 9)).tolist() == [4, 5, 9]
    assert until_stop(torch.tensor([4, 5]), (9,)).tolist() == [4, 5]  # cut by the token limit
    batch = completions_batch(
        [torch.tensor([1, 2]), torch.tensor([3])],
        [torch.tensor([4, 9]), torch.tensor([5, 6, 9])],
        pad_id=0,
    )
    assert batch["input_ids"].tolist() == [[1, 2, 4, 9], [3, 5, 6, 9]]
    assert batch["labels"].tolist() == [[-100, -100, 4, 9], [-100, 5, 6, 9]]


@pytest.mark.parametrize("interleaved", [None, 257], ids=["sampled", "interleaved"])
def test_a_completion_ends_at_any_of_its_stop_tokens(interleaved) -> None:
    """Only the first of several EOS ids ended a completion, and a chat template's end of turn
    none: the student's completions ran on into turns of its own, all scored (probe 43)."""
    model = distiller(on_policy_teacher_top_k=interleaved)
    batch = chat_batch()
    start = len(prompt_tokens(batch)[0])
    free = replace(model.on_policy, stop_ids=())
    first = int(free.sample(model.student, batch, 3, model.teacher)["input_ids"][0, start])
    stopped = replace(model.on_policy, stop_ids=(256, first))
    labels = stopped.sample(model.student, batch, 3, model.teacher)["labels"][0]
    assert labels[start:].tolist()[:2] == [first, IGNORE_INDEX]


def test_a_run_stops_on_policy_completions_at_its_chat_templates_end_of_turn() -> None:
    from tests.unit.data.test_encoding import chatml_tokenizer

    model = distiller()
    eos = model.student.config.eos_token_id
    assert model.on_policy.stop_ids == (eos,)  # the student's own
    tokenizer = chatml_tokenizer()
    stop_at_turn_ends(model, tokenizer)
    assert model.on_policy.stop_ids == (eos, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert model.on_policy.text_stop is None
    # Markers the tokenizer reads as text end a completion in text; a template whose answer
    # ends in whitespace alone, with no next turn, ends none: said, not silent (probe 44).
    from tests.unit.data.test_chat import chat_tokenizer

    stop_at_turn_ends(model, chat_tokenizer())
    assert (model.on_policy.stop_ids, model.on_policy.text_stop.marker) == ((eos,), "<|im_end|>")
    bare = chat_tokenizer("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    with pytest.warns(UserWarning, match=r"neither a special token of the tokenizer nor text"):
        stop_at_turn_ends(model, bare)
    assert (model.on_policy.stop_ids, model.on_policy.text_stop) == ((eos,), None)


@pytest.mark.parametrize("interleaved", [None, 257], ids=["sampled", "interleaved"])
def test_a_completion_ends_where_its_text_shows_the_answer_ended(interleaved) -> None:
    """Under a template that ends an answer with no token (plain's newline before the next
    "User:"), a completion is cut where its text shows the end (it ran on into turns of its
    own, all scored, probe 44), sampled and interleaved alike; the tally counts kept tokens."""
    from tests.unit.data.test_chat import chat_tokenizer

    model = distiller(on_policy_teacher_top_k=interleaved, on_policy_tokens=8)
    stop_at_turn_ends(model, chat_tokenizer(PLAIN_TEMPLATE))
    ends = model.on_policy.text_stop
    assert (ends.marker, ends.keep) == ("\nUser:", 1)
    batch = chat_batch()
    start = len(prompt_tokens(batch)[0])
    free = replace(model.on_policy, stop_ids=(), text_stop=None)
    written = free.sample(model.student, batch, 3, model.teacher)["input_ids"][0, start:]
    marker = ends.tokenizer.decode(written[2:4])  # one byte a token: tokens 2 and 3 spell it
    assert marker not in ends.tokenizer.decode(written[:3])
    stopped = replace(free, text_stop=replace(ends, marker=marker, keep=1))
    stopped.tally.take()  # shared with ``free``, which wrote whole completions
    labels = stopped.sample(model.student, batch, 3, model.teacher)["labels"]
    assert labels[0, start:][labels[0, start:] != IGNORE_INDEX].tolist() == written[:3].tolist()
    kept = int((labels != IGNORE_INDEX).sum()) * bool(interleaved)
    assert (stopped.tally.own, stopped.tally.written) == (kept, kept)  # top 257: all its own


def test_a_batch_padded_on_the_left_is_sampled_as_the_same_batch_padded_on_the_right() -> None:
    """A tokenizer may pad on the left (the Python API takes either side): the prompt is the
    attended tokens before the first label, never the pads (they were taken as the prompt, and
    marked attended, so the student completed a row of pads)."""
    right = chat_batch()
    left = {key: value.clone() for key, value in right.items()}
    for key, fill in (("input_ids", 0), ("attention_mask", 0), ("labels", IGNORE_INDEX)):
        left[key][0] = torch.cat([torch.full((2,), fill), right[key][0, :6]])
    prompts = prompt_tokens(left)
    assert [p.tolist() for p in prompts] == [[5, 6, 7], [11, 12, 13, 14, 15]]
    assert all(torch.equal(a, b) for a, b in zip(prompts, prompt_tokens(right), strict=True))
    model = distiller()
    on_left = model.on_policy.sample(model.student, left, draw=3)
    on_right = model.on_policy.sample(model.student, right, draw=3)
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(on_left[key], on_right[key]), key


def test_bad_on_policy_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"no teacher cache holds: drop distill.teacher_cache"):
        DistillConfig(on_policy=0.5, teacher_cache="/x")
    with pytest.raises(ValueError, match=r"distill.on_policy=1.5: a probability"):
        DistillConfig(on_policy=1.5)
    # Sampled completions are scored by the divergence alone: with kd_weight=0 (ce_only) the run
    # sampled, trained nothing on them, and exited 0 (at on_policy=1, a run of loss 0.0).
    ce_only = compose_config(
        ["debug=smoke", "experiment=ce_only", "data=chat", "distill.on_policy=1.0"]
    )
    assert any(
        "distill.on_policy=1.0 with distill.kd_weight=0 and no feature matching" in e
        for e in config_errors(ce_only)
    )
    # Feature matching over the sampled rows trains on them: not refused.
    DistillConfig(on_policy=1.0, kd_weight=0.0, ce_weight=0.5, features="uniform")
    unprompted = chat_batch()
    unprompted["labels"][0, :6] = unprompted["input_ids"][0, :6]  # labels = input_ids
    with pytest.raises(ValueError, match=r"scored from its first token, so it has no prompt"):
        prompt_tokens(unprompted)
    # The same row padded on the left: its first token's label is masked as the pad's
    # prediction (checked_batch), and it was read as a one-token prompt (probe 51).
    left = {key: torch.roll(value, 2, dims=1) for key, value in unprompted.items()}
    with pytest.raises(ValueError, match=r"scored from its first token, so it has no prompt"):
        prompt_tokens(checked_batch(left, "causal_lm"))
    # A label on a row's first token is no target (nothing predicts it): the prompt stands.
    first = chat_batch()
    first["labels"][0, 0] = 5
    assert [p.tolist() for p in prompt_tokens(first)] == [[5, 6, 7], [11, 12, 13, 14, 15]]


def test_the_room_to_sample_in_is_the_writers_stated_limit_and_none_states_no_limit() -> None:
    """A model whose config states no position limit (a state-space model) read as 0: on-policy
    KD refused every prompt with "leaves the student no position; lower data.block_size"."""
    from types import SimpleNamespace

    def model(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    sampler = OnPolicy(1.0, 4, 1.0, 0, (), 0)
    assert sampler.room(model(), None) is None
    assert sampler.room(model(), model()) is None
    # The teacher scores the completion whether or not it writes it (interleaved): it counts.
    assert sampler.room(model(max_position_embeddings=64), model(n_positions=16)) == 16
    assert sampler.room(model(), model(n_positions=16)) == 16
    others = OnPolicy(1.0, 4, 1.0, 0, (), 0, scorer_limits=(12,))
    assert others.room(model(max_position_embeddings=64), model()) == 12


@pytest.mark.parametrize("where", ["the teacher", "another teacher"])
def test_completions_fit_every_teacher_that_scores_them(where: str) -> None:
    """The student (128 positions) sampled as far as its own positions allowed: a teacher of
    12 learned positions scoring the row raised an IndexError (probe 26); one of rotary
    positions scored past them without a word."""
    from lightning_kd.distill.teachers import ExtraTeachers
    from lightning_kd.models.loading import model_from_config
    from tests.conftest import TINY_GPT2

    torch.manual_seed(0)
    short = model_from_config({**TINY_GPT2, "n_positions": 12}, "causal_lm").eval()
    roomy = model_from_config(dict(TINY_LLAMA), "causal_lm").eval()
    student = model_from_config(dict(TINY_LLAMA), "causal_lm")
    config = DistillConfig(on_policy=1.0, on_policy_tokens=20, compile=False)
    if where == "the teacher":
        model = Distiller(short, student, config)
    else:
        extra = ExtraTeachers(["short"], [0.5], [short], [None])
        model = Distiller(roomy, student, config, extra=extra, teacher_weight=("roomy", 0.5))
    sampled = model.on_policy.sample(model.student, chat_batch(), draw=3, teacher=model.teacher)
    assert sampled["input_ids"].shape[1] <= 12
    assert torch.isfinite(model(chat_batch(), draw=3)[0])


def test_a_teachers_entry_of_fewer_positions_bounds_the_completions_of_a_run() -> None:
    """The run's distiller is assembled with its other teachers loaded afterwards: their limits
    never reached the sampler, and the CLI run still raised the IndexError (probe 27)."""
    from lightning_kd.distill.teacher_entries import teacher_entries
    from tests.conftest import TINY_GPT2

    gpt2 = {**TINY_GPT2, "n_positions": 12}
    entries = teacher_entries(
        [{"name": "tiny", "weight": 0.5}, {"name": "short", "weight": 0.5, "config": gpt2}],
        TEACHER,
    )
    options = DistillConfig(on_policy=1.0, on_policy_tokens=20, compile=False)
    run = Distiller.from_specs(
        TEACHER, StudentSpec(num_layers=2), options, byte_tokenizer(), "32-true", teachers=entries
    )
    assert run.on_policy.scorer_limits == (12,)
    sampled = run.on_policy.sample(run.student, chat_batch(), draw=3, teacher=run.teacher)
    assert sampled["input_ids"].shape[1] <= 12
    assert torch.isfinite(run(chat_batch(), draw=3)[0])
