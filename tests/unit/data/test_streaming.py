"""``data.streaming=true``: validation held out and never trained on, ranks on disjoint shares,
and a resume — from a saved position, through Lightning's own loop too — on exactly the batches
the uninterrupted stream would have given next."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.dataset_source import DatasetSource, open_split
from lightning_kd.data.stream_shares import share
from lightning_kd.data.text import TextDataModule
from lightning_kd.models.loading import byte_tokenizer
from lightning_kd.utils.refusal import Refused
from tests.conftest import make_module, make_trainer
from tests.unit.data.test_chat import chat_tokenizer, continued, conversations
from tests.unit.data.test_datasets import write_parquet

LETTERS = "ABCDEFGHIJKLMNOPQRST"
TOKENIZER = byte_tokenizer()


def lettered(path: Path, rows: int = 20, first: int = 0) -> Path:
    """Row i is one letter repeated 30 + 3i times (a byte token each): every token says which
    row it is from."""
    texts = [LETTERS[first + i] * (30 + 3 * i) for i in range(rows)]
    return write_parquet(path, [{"text": text} for text in texts])


def text(tokens: torch.Tensor) -> str:
    """The byte tokenizer's text of ``tokens`` (EOS and padding, token 256, left out)."""
    return TOKENIZER.decode([token for token in tokens.flatten().tolist() if token < 256])


def letters(tokens: torch.Tensor) -> set[str]:
    return set(text(tokens))


def streamed(source: dict, module=TextDataModule, tokenizer=None, **settings) -> TextDataModule:
    options = {"block_size": 16, "batch_size": 2, "val_size": 4, "shuffle_buffer": 8}
    data = module(
        tokenizer or byte_tokenizer(), dataset=source, streaming=True, **options | settings
    )
    data.setup("fit")
    return data


def parquet_source(path: Path) -> dict:
    return {"path": "parquet", "data_files": str(path)}


def trained(data: TextDataModule, count: int) -> list[tuple[torch.Tensor, dict]]:
    """The first ``count`` training batches, each with the state a checkpoint saved after it
    would hold (the batch handed to training as Lightning hands it)."""
    batches = []
    for batch in data.train_dataloader():
        batch = data.on_before_batch_transfer(batch, 0)
        batches.append((batch["input_ids"], data.state_dict()))
        if len(batches) == count:
            return batches
    raise AssertionError("the stream ended")


def saved_and_loaded(state: dict) -> dict:
    """``state`` through a checkpoint file read as the run reads it (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_a_stream_resumes_on_the_batches_after_its_saved_position(
    tmp_path, datasets_home, pack
) -> None:
    """Positions inside a document, at window ends and across passes over the data (20 rows,
    1,190 tokens: 35 batches a pass when packed, 18 when padded)."""
    source = parquet_source(lettered(tmp_path / "d.parquet"))
    whole = trained(streamed(source, pack=pack), 60)
    for cut in (1, 4, 13, 29, 47):
        resumed = streamed(source, pack=pack)
        resumed.load_state_dict(saved_and_loaded(whole[cut - 1][1]))
        again = trained(resumed, 60 - cut)
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(again, whole[cut:], strict=True))


def test_a_streamed_corpus_is_packed_domain_by_domain_and_resumes(tmp_path, datasets_home):
    """data.domains over data.domain_field's values, streamed: every validation and training
    block is one domain's and says which; a resume gives the very batches that followed; a row
    whose value is in no domain is refused, naming it."""
    rows = [{"text": LETTERS[i] * (30 + 3 * i), "source": "ab"[i % 3 == 2]} for i in range(20)]
    source = parquet_source(write_parquet(tmp_path / "d.parquet", rows))
    by_source = {"domains": {"first": ["a"], "third": ["b"]}, "domain_field": "source"}
    of_domain = [set(LETTERS[i] for i in range(20) if (i % 3 == 2) == bool(d)) for d in (0, 1)]
    data = streamed(source, **by_source)
    assert set(data.val_domains) == {0}  # rows 0 and 1 are both domain 0's
    for example, domain in zip(data.val_examples, data.val_domains, strict=True):
        assert letters(example) <= of_domain[domain]
    domains_seen = set()
    for batch in data.train_dataloader():
        for row, domain in zip(batch["input_ids"], batch["domain"].tolist(), strict=True):
            assert letters(row) <= of_domain[domain]
            domains_seen.add(domain)
        if domains_seen == {0, 1}:
            break
    whole = trained(streamed(source, **by_source), 50)
    for cut in (1, 7, 23, 41):
        resumed = streamed(source, **by_source)
        resumed.load_state_dict(saved_and_loaded(whole[cut - 1][1]))
        again = trained(resumed, 50 - cut)
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(again, whole[cut:], strict=True))
    strays = write_parquet(tmp_path / "s.parquet", [*rows, {"text": "Z" * 40, "source": "c"}])
    with pytest.raises(ValueError, match=r"rows whose 'source' is \['c'\] are in no domain"):
        trained(streamed(parquet_source(strays), **by_source), 50)


def test_validation_rows_are_held_out_of_training(tmp_path, datasets_home) -> None:
    source = parquet_source(lettered(tmp_path / "d.parquet"))
    data = streamed(source)
    held = set().union(*(letters(example) for example in data.val_examples))
    assert held == {"A", "B"}  # 4 blocks of 16 tokens: rows 0 and 1 (31 and 34 tokens)
    train = set().union(*(letters(batch) for batch, _ in trained(data, 40)))
    assert train == set(LETTERS) - held  # every other row, over more than a pass
    # A split of its own (rows 17-19 again): its first examples; the training split is read
    # whole but for the rows those were cut from.
    copies = [{"text": LETTERS[i] * (30 + 3 * i)} for i in (17, 18, 19)]
    files = {"train": str(tmp_path / "d.parquet")}
    files["validation"] = str(write_parquet(tmp_path / "v.parquet", copies))
    separate = streamed({"path": "parquet", "data_files": files, "val_split": "validation"})
    assert set().union(*map(letters, separate.val_examples)) == {"R"}  # 64 of its 82 tokens
    train = set().union(*(letters(batch) for batch, _ in trained(separate, 40)))
    assert train == set(LETTERS) - {"R"}


def test_a_stream_whose_validation_leaves_no_batch_is_refused_as_it_is_set_up(
    tmp_path, datasets_home
) -> None:
    """Refused with validation, before the models load (not as training starts)."""
    source = parquet_source(lettered(tmp_path / "d.parquet", rows=3))  # 3 rows, 6 blocks
    assert len(trained(streamed(source, val_size=4), 1)) == 1  # row 2 is left for training
    with pytest.raises(Refused, match="share gives no batch of data.batch_size=2 .* lower data"):
        streamed(source, val_size=5)  # its 5th block is cut from row 2 too


@pytest.mark.parametrize("files", [1, 2], ids=["rows_alternate", "whole_shards"])
def test_ranks_read_disjoint_shares_that_cover_the_split(tmp_path, datasets_home, files) -> None:
    """One file: every other row each; two files (two shards): one file each."""
    paths = [lettered(tmp_path / f"d{i}.parquet", 10 // files, 10 * i) for i in range(files)]
    source = DatasetSource.of({"path": "parquet", "data_files": [str(p) for p in paths]})
    shares = [
        [row["text"][0] for row in share(open_split(source, "train", True), rank, 2)]
        for rank in (0, 1)
    ]
    assert not set(shares[0]) & set(shares[1])
    expected = LETTERS[:10] if files == 1 else LETTERS[:5] + LETTERS[10:15]
    assert sorted(shares[0] + shares[1]) == list(expected)
    if files == 2:
        assert {"".join(share) for share in shares} == {"ABCDE", "KLMNO"}


def test_streamed_chat_holds_out_its_validation_prompts(tmp_path, datasets_home) -> None:
    rows = [*conversations(12), *conversations(12)]  # every prompt twice: rows 0 and 12 share one
    source = parquet_source(write_parquet(tmp_path / "c.parquet", rows))
    data = streamed(source, ChatDataModule, chat_tokenizer(), block_size=160, val_size=2)
    assert len(data.val_examples) == 2 and all(e.scored > 0 for e in data.val_examples)
    user_turn = lambda tokens: text(tokens).split("<|im_end|>")[1]  # noqa: E731
    val_prompts = {user_turn(example.tokens) for example in data.val_examples}
    assert len(val_prompts) == 2
    for batch, _ in trained(data, 30):
        for tokens in batch:
            assert user_turn(tokens) not in val_prompts


def test_a_streamed_validation_conversations_continuation_is_not_trained_on(
    tmp_path, datasets_home
) -> None:
    """The continuation [Q, A, And?, B] of a held-out [Q, A], or [system, Q, A], was trained on,
    scoring the held-out answer (probe 46)."""
    source = parquet_source(write_parquet(tmp_path / "c.parquet", continued(8)))
    data = streamed(source, ChatDataModule, chat_tokenizer(), block_size=160, val_size=2)
    held = {text(example.tokens).split("Q")[1][0] for example in data.val_examples}
    assert held == {"0"}  # rows 0 and 1: the first opening's
    for batch, _ in trained(data, 12):
        for tokens in batch:
            assert "Q0?" not in text(tokens) and "A0." not in text(tokens)


def test_what_a_stream_cannot_go_with_is_refused(tmp_path, datasets_home) -> None:
    source = parquet_source(tmp_path / "d.parquet")
    cases = {
        "reads a dataset row by row: set data.dataset.path": {"dataset": None},
        "data.max_train_examples=10 with data.streaming=true": {"max_train_examples": 10},
        "data.num_workers=2 with data.streaming=true": {"num_workers": 2},
    }
    for message, setting in cases.items():
        with pytest.raises(Refused, match=message):
            TextDataModule(byte_tokenizer(), **{"dataset": source} | setting, streaming=True)
    rows = tmp_path / "c.jsonl"
    with pytest.raises(ValueError, match="data.teacher_answers with data.streaming=true"):
        ChatDataModule(chat_tokenizer(), dataset=source, streaming=True, teacher_answers=str(rows))


class Batches(Callback):
    """Each training batch's tokens and each step's loss, as training ran them."""

    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.batches.append(batch["input_ids"].clone())
        self.losses.append(float(outputs["loss"] if isinstance(outputs, dict) else outputs))


def test_a_streamed_fit_resumed_from_its_checkpoint_trains_the_same_batches(
    tmp_path, datasets_home, tiny_teacher, one_thread
) -> None:
    """Lightning's own loop (prefetching a batch ahead, saving the data module's state): a fit
    stopped at step 12 and resumed from its checkpoint trains steps 13-30 on the batches, and
    with the losses, of the uninterrupted fit."""
    source = parquet_source(lettered(tmp_path / "d.parquet"))

    def fit(steps: int, ckpt_path: Path | None = None) -> tuple[Batches, object]:
        torch.manual_seed(0)
        record = Batches()
        root = tmp_path / f"fit{steps}{'_resumed' if ckpt_path else ''}"
        trainer = make_trainer(root, max_steps=steps, callbacks=[record], precision="32-true")
        trainer.fit(make_module(tiny_teacher), streamed(source), ckpt_path=ckpt_path)
        return record, trainer

    whole, _ = fit(30)
    first, trainer = fit(12)
    trainer.save_checkpoint(tmp_path / "step12.ckpt")
    rest, _ = fit(30, tmp_path / "step12.ckpt")
    assert len(first.batches) == 12 and len(rest.batches) == 18
    batches = zip(first.batches + rest.batches, whole.batches, strict=True)
    assert all(torch.equal(a, b) for a, b in batches)
    assert first.losses + rest.losses == whole.losses


def test_a_resume_with_another_number_of_ranks_is_refused(tmp_path, datasets_home) -> None:
    data = streamed(parquet_source(lettered(tmp_path / "d.parquet")))
    two = {"stream_cursors": [data.state_dict()["stream_cursors"][0]] * 2}
    with pytest.raises(ValueError, match=r"read by 2 process\(es\) and this run has 1: each reads"):
        data.load_state_dict(two)


def test_a_streamed_chat_whose_answers_start_past_the_block_is_told_to_raise_it(
    tmp_path, datasets_home
) -> None:
    """A conversation whose answer starts past the block is left out: lowering the block size,
    which the refusal used to advise, left out more."""
    source = parquet_source(write_parquet(tmp_path / "c.parquet", conversations(12)))
    with pytest.raises(Refused, match=r"add rows or raise data.block_size \(a conversation whose"):
        streamed(source, ChatDataModule, chat_tokenizer(), block_size=8, val_size=2)


@pytest.mark.parametrize("module", [TextDataModule, ChatDataModule], ids=["text", "chat"])
def test_a_streamed_row_cut_to_the_block_is_said(tmp_path, datasets_home, module) -> None:
    """Read whole, pack=false counts the rows it cuts; streamed it cut them silently (probe 46)."""
    if module is ChatDataModule:
        source = parquet_source(write_parquet(tmp_path / "c.parquet", conversations(12)))
        options = {"tokenizer": chat_tokenizer(), "block_size": 110, "val_size": 2}
    else:
        options = {"block_size": 16, "val_size": 2}
        source = parquet_source(lettered(tmp_path / "l.parquet"))
    with pytest.warns(UserWarning, match=r"pack=false: streamed row \d+ is longer than data.bl"):
        data = streamed(source, module, pack=False, **options)
        trained(data, 2)
