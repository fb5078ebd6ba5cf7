"""The cross-tokenizer step: with identical tokenizers it is the same-tokenizer step, exactly."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from lightning_kd.data.token_bytes import byte_lengths
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.spelled_share import judge_first_blocks
from lightning_kd.losses.cross_spans import binary_kl
from lightning_kd.losses.logits import next_token_targets
from lightning_kd.models.heads import output_head
from lightning_kd.models.loading import byte_tokenizer, model_from_config
from lightning_kd.models.student import student_from_teacher
from lightning_kd.utils.refusal import Refused
from tests.conftest import TEXT, TINY_GPT2, TINY_LLAMA, byte_level_bpe, sentencepiece_tokenizer


def batch_of(text: str, rows: int = 2, length: int = 24) -> dict[str, torch.Tensor]:
    """Rows of byte ids cut from ``text``, an EOS inside the first, a masked prompt in the last."""
    ids = byte_tokenizer()(text)["input_ids"][: rows * length]
    input_ids = torch.tensor(ids).view(rows, length)
    input_ids[0, 10] = 256
    labels = input_ids.clone()
    labels[-1, :5] = -100
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def distillers(
    divergence: str, temperature: float, loss: str = "hybrid", tokenizer=None
) -> tuple[Distiller, Distiller]:
    """A same-tokenizer distiller and its copy through the cross-tokenizer path, in fp64 (with
    ``tokenizer``'s vocabulary; the byte tokenizer's by default)."""
    tokenizer = tokenizer or byte_tokenizer()
    size, end = len(tokenizer), tokenizer.eos_token_id
    torch.manual_seed(0)
    config = dict(TINY_GPT2, vocab_size=size, bos_token_id=end, eos_token_id=end)
    teacher = model_from_config(config, "causal_lm").double().eval()
    student = student_from_teacher(teacher, [0, 3]).double()
    torch.manual_seed(1)
    with torch.no_grad():  # a student unlike its teacher: a non-zero divergence everywhere
        for parameter in student.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    config = DistillConfig(divergence=divergence, temperature=temperature, compile=False)
    same = Distiller(teacher, student, config, token_lengths=byte_lengths(tokenizer, student))
    cross = CrossTokenizer(tokenizer, tokenizer, size, size, top_k=size, loss=loss)
    other = Distiller(copy.deepcopy(teacher), copy.deepcopy(student), config, cross=cross)
    return same, other


@pytest.mark.parametrize(
    ("divergence", "temperature", "loss"),
    [
        ("forward_kl", 1.0, "hybrid"),
        ("reverse_kl", 2.0, "hybrid"),
        ("jsd", 1.0, "hybrid"),
        ("forward_kl", 1.0, "projected"),
        ("jsd", 2.0, "projected"),
    ],
)
def test_identical_tokenizers_give_the_same_loss_and_gradients(divergence, temperature, loss):
    assert_same_steps(*distillers(divergence, temperature, loss), batch_of(TEXT))


@pytest.mark.parametrize("loss", ["hybrid", "projected"])
def test_identical_byte_level_bpes_give_the_same_loss_and_gradients(loss):
    """A byte-level BPE has fragments of characters among its pieces ("âĢ"), which the
    projection credited to another token (probe 42); the byte tokenizer has none."""
    tokenizer = byte_level_bpe()
    ids = tokenizer("wait… it’s naïve — ok… " * 3 + TEXT)["input_ids"][:48]
    assert tokenizer.convert_tokens_to_ids("âĢ") in ids
    input_ids = torch.tensor(ids).view(2, 24)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    assert_same_steps(
        *distillers("forward_kl", 1.0, loss, tokenizer), batch | {"labels": input_ids}
    )


def assert_same_steps(same: Distiller, cross: Distiller, batch: dict) -> None:
    """The two distillers' steps on ``batch``: equal objectives, parts and gradients."""
    losses = []
    for distiller in (same, cross):
        objective, sums = distiller(batch)
        objective.backward()
        losses.append((objective.detach(), sums.kd, sums.ce, sums.tokens))
    for a, b in zip(*losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert losses[0][1] > 0
    for (name, a), b in zip(
        same.student.named_parameters(), cross.student.parameters(), strict=True
    ):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_identical_tokenizers_give_the_same_validation_metrics():
    same, cross = distillers("forward_kl", 1.0)
    batch = batch_of(TEXT)
    with torch.inference_mode():  # as Lightning validates, before a run's first training step
        expected, got = same.evaluate(batch), cross.evaluate(batch)
    for name in ("ppl", "kl", "agreement", "loss", "bpb", "teacher_bpb"):
        torch.testing.assert_close(
            got[name][0] / got[name][1], expected[name][0] / expected[name][1], msg=name
        )
    assert got["aligned"][0] == got["aligned"][1]  # every scored position has its partner
    # The vocabulary maps were built on first use, in inference mode: training's autograd can
    # still save them.
    objective, _ = cross(batch)
    objective.backward()


def test_the_span_term_with_identical_tokenizers_is_each_tokens_binarised_kl():
    """With one tokenizer each span is one token on both sides: the term adds, for every scored
    position but a row's last (whose span has no end), the Bernoulli KL between the teacher's and
    the student's probability of the next token — in value and in gradient (fp64)."""
    _, plain = distillers("forward_kl", 1.0)
    _, spans = distillers("forward_kl", 1.0)
    spans.cross.span_weight = 0.7
    batch = batch_of(TEXT)
    plain_objective, plain_sums = plain(batch)
    plain_objective.backward()
    objective, sums = spans(batch)
    objective.backward()

    reference = copy.deepcopy(plain.student)
    reference.zero_grad()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    targets, scored = next_token_targets(batch["labels"])
    safe = targets.clamp(min=0).unsqueeze(-1)
    with torch.no_grad():
        teacher_logits = plain.teacher(**inputs).logits[:, :-1]
    teacher = teacher_logits.log_softmax(-1).gather(-1, safe).squeeze(-1)
    student = reference(**inputs).logits[:, :-1].log_softmax(-1).gather(-1, safe).squeeze(-1)
    last = scored.long().cumsum(1) == scored.sum(1, keepdim=True)
    members = scored & ~last
    added = 0.7 * plain.distill.kd_weight * binary_kl(teacher[members], student[members]).sum()
    added.backward()

    torch.testing.assert_close(objective - plain_objective, added.detach(), rtol=1e-9, atol=1e-12)
    assert added > 0
    # Reported apart (train/span): the term inside kd, which it was folded into unseen.
    assert plain_sums.span is None
    torch.testing.assert_close(sums.span, sums.kd - plain_sums.kd, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(
        plain.distill.kd_weight * sums.span, added.detach(), rtol=1e-9, atol=1e-12
    )
    for (name, got), base, ref in zip(
        spans.student.named_parameters(),
        plain.student.parameters(),
        reference.parameters(),
        strict=True,
    ):
        torch.testing.assert_close(got.grad - base.grad, ref.grad, rtol=1e-7, atol=1e-10, msg=name)


def test_chunks_keep_spans_whole_so_the_step_does_not_depend_on_the_chunk_size():
    """A SentencePiece teacher cuts the text otherwise than the byte student, so spans run over
    several student positions; chunks of 3 scored tokens would cut many of them."""
    teacher_tokenizer = sentencepiece_tokenizer()
    torch.manual_seed(0)
    config = {**TINY_LLAMA, "vocab_size": len(teacher_tokenizer)}
    teacher = model_from_config(config, "causal_lm").double().eval()
    student = model_from_config(dict(TINY_GPT2), "causal_lm").double()
    batch = batch_of(TEXT)
    results = []
    for chunk_size in (None, 3):
        distill = DistillConfig(chunk_size=chunk_size, compile=False, cross_span_weight=1.0)
        cross = CrossTokenizer.for_models(
            byte_tokenizer(), teacher_tokenizer, student, teacher, distill
        )
        distiller = Distiller(copy.deepcopy(teacher), copy.deepcopy(student), distill, cross=cross)
        objective, _ = distiller(batch)
        objective.backward()
        grads = [parameter.grad for parameter in distiller.student.parameters()]
        results.append((objective.detach(), grads))
    records = cross.records(teacher, output_head(teacher), batch, 1.0)
    lengths = torch.unique(records.span[records.span >= 0], return_counts=True)[1]
    assert lengths.max() > 3  # spans longer than a chunk, which the chunks keep whole
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-12)
    for one, other in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(one, other, rtol=1e-8, atol=1e-12)


def test_a_negative_span_weight_is_refused():
    with pytest.raises(ValueError, match=r"^distill.cross_span_weight=-0.5 must be >= 0$"):
        DistillConfig(cross_span_weight=-0.5)


def test_each_bad_cross_setting_is_named_alone_with_the_config() -> None:
    """One sentence named all three keys, the valid ones as if refused (probe 32)."""
    from lightning_kd.launch.checks import config_errors
    from lightning_kd.launch.config import compose_config

    with pytest.raises(ValueError, match=r"^distill.cross_uld_weight=-1 must be >= 0$"):
        DistillConfig(cross_uld_weight=-1)
    cfg = compose_config(["debug=smoke", "distill.cross_uld_weight=-1", "distill.cross_top_k=0"])
    errors = config_errors(cfg)
    assert any(e.startswith("distill.cross_uld_weight=-1: must be") for e in errors)
    assert any(e.startswith("distill.cross_top_k=0: must be an integer >= 1") for e in errors)
    assert not any("cross_span_weight" in e for e in errors)


def test_the_teachers_end_means_a_turns_end_or_a_documents_by_what_the_student_reads_next():
    """A teacher whose end is ``<|im_end|>`` on a base student's chat row then document end:
    its end's mass goes to the student's ``<|im_end|>`` before the turn's end, and to the
    student's ``<|endoftext|>`` before the document's end."""
    from lightning_kd.data.chat_tokens import encode_chat
    from lightning_kd.losses.cross_top import TeacherTop
    from tests.unit.data.test_encoding import conversation
    from tests.unit.data.test_vocab_maps import base_chatml_pair

    student, teacher = base_chatml_pair()
    example = encode_chat(student, conversation("Name a prime."), "row 0")
    ids = torch.cat([example.tokens, torch.tensor([student.eos_token_id])]).unsqueeze(0)
    labels = ids.clone()
    cross = CrossTokenizer(student, teacher, len(student), len(teacher), top_k=2)
    wanted = torch.ones(1, ids.shape[1] - 1, dtype=torch.bool)
    n = int(wanted.sum())
    other = teacher.convert_tokens_to_ids("<eos>")
    top = TeacherTop(  # every position: the teacher's end first, then another token
        torch.tensor([[teacher.eos_token_id, other]]).repeat(n, 1),
        torch.tensor([[-0.1, -2.5]], dtype=torch.float64).repeat(n, 1),
        torch.full((n,), -3.0, dtype=torch.float64),
    )
    records = cross.mapped(top, wanted, labels=labels)
    turn_end = student.convert_tokens_to_ids("<|im_end|>")
    row = ids[0].tolist()
    before_turn_end = [i - 1 for i, t in enumerate(row) if t == turn_end]
    before_document_end = len(row) - 2
    for position in before_turn_end:
        assert records.ids[0, position, 0] == turn_end
    assert records.ids[0, before_document_end, 0] == student.eos_token_id
    assert bool(records.matched[0, before_document_end, 0])
    assert bool(cross.student_twins[turn_end]) and bool(cross.student_twins[student.eos_token_id])


def test_a_block_the_teacher_reads_beyond_its_positions_is_refused() -> None:
    """The teacher's tokens of a block can outnumber the student's: beyond a learned-position
    teacher's positions its embedding raised an IndexError."""
    torch.manual_seed(0)
    teacher = model_from_config({**TINY_GPT2, "n_positions": 16}, "causal_lm").eval()
    student = student_from_teacher(teacher, [0, 3])
    tokenizer = byte_tokenizer()
    cross = CrossTokenizer(tokenizer, tokenizer, 257, 257, top_k=8)
    distiller = Distiller(teacher, student, DistillConfig(compile=False), cross=cross)
    # The fit is said in student tokens, with both knobs: with on-policy KD a row is the prompt
    # and the sampled answer, and "lower data.block_size to about N" alone did not fit (probe 26).
    fits = r"a row of 24 student tokens as 24 of its own, beyond its 16 positions.*about 16 student"
    with pytest.raises(Refused, match=fits + r".*data.block_size.*distill.on_policy_tokens"):
        distiller(batch_of(TEXT))
    assert torch.isfinite(distiller(batch_of(TEXT, length=16))[0])


def test_a_top_k_past_the_teachers_vocabulary_keeps_it_whole_and_says_so() -> None:
    tokenizer = byte_tokenizer()
    with pytest.warns(UserWarning, match=r"cross_top_k=300 is more than the teacher's 257-token"):
        cross = CrossTokenizer(tokenizer, tokenizer, 257, 257, top_k=300)
    assert cross.top_k == 257


def test_the_spelled_share_is_judged_on_the_same_blocks_for_any_batch_size(tmp_path) -> None:
    """Judged on a rank's first micro-batch, the same data and global batch were refused at
    data.batch_size=2, trained at 1 with accumulation 2, and under DDP refused by one rank while
    the other reported it lost (probe 39): the run's first training blocks are judged, in the
    split's order, whatever the batch size, accumulation or number of ranks."""
    from tokenizers import normalizers

    from tests.conftest import make_datamodule

    corpus = tmp_path / "corpus.txt"
    lines = ["THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG"]
    lines += ["the quick brown fox jumps over the lazy dog"] * 2
    corpus.write_text("\n".join(lines * 20) + "\n")
    lower = sentencepiece_tokenizer(normalizers.Lowercase())
    firsts, judged = [], set()
    for batch_size in (1, 2, 4):
        data = make_datamodule([corpus], batch_size=batch_size)
        data.setup()
        cross = CrossTokenizer(byte_tokenizer(), lower, 257, len(lower), min_aligned=0.3)
        first = next(iter(data.train_dataloader()))
        view = cross.aligner.view(first["input_ids"], first["attention_mask"], first["labels"])
        firsts.append(view.share)
        judge_first_blocks(cross, data)  # passes: 71 % of the first 8 blocks is spelled back
        with pytest.raises(Refused, match=r"spells back (\d+\.\d%) of the first 8 training") as e:
            strict = CrossTokenizer(byte_tokenizer(), lower, 257, len(lower), min_aligned=0.9)
            judge_first_blocks(strict, data)
        judged.add(str(e.value))
    assert min(firsts) < 0.3 < max(firsts)  # what the first micro-batch alone would have decided
    assert len(judged) == 1


def test_a_teacher_by_domain_is_judged_on_its_own_domains_blocks(tmp_path, caplog) -> None:
    """A teachers entry teaching one domain was judged on its first batch of that domain's
    rows, mid-run (a rare domain at step 5 or 500), as "the teacher's tokenizer" (probe 39):
    it is judged before step 0 on the first blocks of its domains, by its name, and the share
    of positions it pairs (val/aligned, not the bytes it spells) is said then too."""
    from tokenizers import normalizers

    from tests.conftest import make_datamodule

    prose, shouting = tmp_path / "prose.txt", tmp_path / "shouting.txt"
    prose.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    shouting.write_text("THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG\n" * 8)
    domains = {"prose": [str(prose)], "shouting": [str(shouting)]}
    data = make_datamodule([prose, shouting], domains=domains)
    data.setup()
    lower = sentencepiece_tokenizer(normalizers.Lowercase())

    def cross() -> CrossTokenizer:
        return CrossTokenizer(byte_tokenizer(), lower, 257, len(lower))

    with caplog.at_level("INFO", logger="lightning_kd.distill.spelled_share"):
        judge_first_blocks(cross(), data, ["prose"], "lower")  # all of it spelled back
    said = re.search(r"entry 'lower' pairs (\d+\.\d)% .* of the first 8 .*'prose'", caplog.text)
    assert said and 0 < float(said.group(1)) < 100, caplog.text  # bytes: one teacher token each
    refusal = r"tokenizer of teachers entry 'lower' spells back \d\.\d% of the first 8 .*'shouting'"
    with pytest.raises(Refused, match=refusal):
        judge_first_blocks(cross(), data, ["shouting"], "lower")


def test_always_on_one_tokenizer_says_it_is_one(caplog) -> None:
    """``distill.cross_tokenizer=always`` checks the path with one tokenizer: the run's first
    line said the two differed in their normalizer or pre-tokenizer (probe 49)."""
    import logging

    from lightning_kd.distill.tokenizer_pairs import teacher_tokenizer_for
    from lightning_kd.models.loading import TeacherSpec

    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    distill = DistillConfig(cross_tokenizer="always", features=None, blockwise_passes=0)
    with caplog.at_level(logging.INFO, logger="lightning_kd.distill.tokenizer_pairs"):
        assert teacher_tokenizer_for(teacher, distill, byte_tokenizer()) is not None
    assert "the teacher's is the student's" in caplog.text
    assert "is not the student's" not in caplog.text
