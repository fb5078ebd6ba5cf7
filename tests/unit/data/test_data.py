"""Reading, packing, padding and splitting text."""

from __future__ import annotations

import gzip
import json
import warnings

import pytest
import torch

from lightning_kd.data.batches import Unscored, pad_for_ranks
from lightning_kd.data.packing import pack_blocks
from lightning_kd.data.reading import (
    DEFAULT_CORPUS,
    DEFAULT_FILES,
    TEACHER_CORPUS,
    expand_files,
    read_documents,
)
from lightning_kd.data.text import TextDataModule
from lightning_kd.losses import IGNORE_INDEX
from tests.conftest import byte_tokenizer, make_datamodule


def test_pack_blocks_joins_with_eos_and_drops_the_tail() -> None:
    blocks = pack_blocks([[1, 2, 3], [4, 5]], block_size=3, eos_id=0)
    assert blocks.tolist() == [[1, 2, 3], [0, 4, 5]]


def test_split_is_deterministic_and_disjoint(corpus) -> None:
    first, second = make_datamodule([corpus]), make_datamodule([corpus])
    first.setup("fit")
    second.setup("fit")
    assert [t.tolist() for t in first.val_examples] == [t.tolist() for t in second.val_examples]
    train = {tuple(t.tolist()) for t in first.train_examples}
    assert not train & {tuple(t.tolist()) for t in first.val_examples}
    assert len(first.val_examples) == round(
        0.2 * (len(first.train_examples) + len(first.val_examples))
    )


def test_a_seed_sweep_keeps_the_split_and_the_subset_and_split_seed_draws_another(corpus):
    """``seed`` reorders training, never what is held out or kept: the runs of a seed sweep
    validate on the same text (and share a teacher cache, whose digests cover these lists)."""
    as_lists = lambda examples: [t.tolist() for t in examples]  # noqa: E731
    runs = {}
    for seed, split_seed in ((0, 0), (7, 0), (0, 3)):
        data = make_datamodule([corpus], seed=seed, split_seed=split_seed, max_train_examples=4)
        data.setup("fit")
        order = [row for b in data.train_dataloader() for row in b["input_ids"].tolist()]
        runs[seed, split_seed] = as_lists(data.val_examples), as_lists(data.train_examples), order
    (val, train, order), swept, resplit = runs[0, 0], runs[7, 0], runs[0, 3]
    assert swept[:2] == (val, train) and swept[2] != order  # same examples, another order
    assert sorted(swept[2]) == sorted(order)
    assert resplit[0] != val  # another split seed holds out other examples


def test_max_train_examples_keeps_a_fixed_prefix_of_the_training_split(corpus) -> None:
    full, subset = make_datamodule([corpus]), make_datamodule([corpus], max_train_examples=3)
    full.setup("fit")
    subset.setup("fit")
    as_lists = lambda examples: [t.tolist() for t in examples]  # noqa: E731
    assert as_lists(subset.train_examples) == as_lists(full.train_examples[:3])
    assert as_lists(subset.val_examples) == as_lists(full.val_examples)  # the split is unchanged
    epochs = []
    for epoch in (0, 1):  # each epoch is a new order of the same three blocks
        loader = subset.train_dataloader()
        loader.sampler.set_epoch(epoch)
        epochs.append(sorted(map(tuple, (row for b in loader for row in b["input_ids"].tolist()))))
    assert epochs[0] == epochs[1] == sorted(map(tuple, as_lists(subset.train_examples)))


def test_max_train_examples_beyond_the_split_is_all_of_it_and_below_one_refused(corpus) -> None:
    with pytest.raises(ValueError, match=r"data.max_train_examples=0; use a count"):
        make_datamodule([corpus], max_train_examples=0)
    full, capped = make_datamodule([corpus]), make_datamodule([corpus], max_train_examples=10_000)
    full.setup("fit")
    capped.setup("fit")
    assert len(capped.train_examples) == len(full.train_examples)


def test_packed_batches_have_no_padding(corpus) -> None:
    dm = make_datamodule([corpus])
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32)
    assert batch["attention_mask"].all()
    assert torch.equal(batch["labels"], batch["input_ids"])


def test_unpacked_documents_are_padded_and_masked(tmp_path) -> None:
    path = tmp_path / "docs.jsonl"
    texts = ["short", "a much longer document here", "mid length"]
    docs = [f"{text} {copy}" for copy in range(4) for text in texts]  # distinct documents
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    dm = make_datamodule([path], pack=False, batch_size=12, val_fraction=0.1)
    dm.setup("fit")
    batch = dm.collate(dm.train_examples)
    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) > 1
    for row, length in enumerate(lengths.tolist()):
        assert (batch["labels"][row, length:] == IGNORE_INDEX).all()
        assert (batch["labels"][row, :length] != IGNORE_INDEX).all()


def test_unpacked_documents_cut_to_the_block_are_counted_in_a_warning(tmp_path) -> None:
    path = tmp_path / "docs.jsonl"
    docs = [f"document {i} " + "word " * (40 if i % 2 else 1) for i in range(10)]
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    dm = make_datamodule([path], pack=False, block_size=32)
    with pytest.warns(UserWarning, match=r"data.pack=false: 5 document\(s\) of 10 are longer "):
        dm.setup("fit")
    quiet = make_datamodule([path], pack=False, block_size=256)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet.setup("fit")


def test_packed_text_past_the_last_block_is_counted_in_a_warning(tmp_path) -> None:
    """A small corpus lost its last documents to the tail no block holds, unsaid (probe 46)."""
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"Sentence number {i}."}) for i in range(17)))
    dm = make_datamodule([path], block_size=64)
    with pytest.warns(UserWarning, match=r"pack=true: the last \d+ of \d+ tokens \(\d+%\) of the"):
        dm.setup("fit")
    quiet = make_datamodule([path], block_size=3)  # under 1 % left over
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet.setup("fit")


@pytest.mark.parametrize(
    ("count", "world_size", "extra"), [(5, 1, 0), (5, 2, 1), (5, 4, 3), (8, 4, 0)]
)
def test_validation_is_padded_for_ranks_with_unscored_copies(count, world_size, extra) -> None:
    examples = [torch.arange(3 + i) for i in range(count)]
    padded = pad_for_ranks(examples, world_size)
    assert len(padded) == count + extra and len(padded) % world_size == 0
    assert padded[:count] == examples
    assert all(isinstance(item, Unscored) for item in padded[count:])


@pytest.mark.parametrize(("blocks", "world_size"), [(41, 2), (42, 2), (10, 3), (7, 4)])
def test_ranks_together_train_one_processs_batches_with_no_block_twice(blocks, world_size):
    """Lightning's DistributedSampler repeated the first blocks where they did not divide by the
    ranks: the epoch's last step trained a block twice (41 blocks, 2 ranks: 63 tokens more than
    one process). Each rank's share is dealt from the same permutation, padding unscored."""
    from lightning_kd.data.batches import IndexedBlocks
    from lightning_kd.data.loaders import EpochSampler, training_order

    examples = [torch.arange(3) for _ in range(blocks)]
    per_rank = 2
    one = list(EpochSampler(examples, seed=5))
    one_steps = [
        one[i : i + per_rank * world_size] for i in range(0, blocks, per_rank * world_size)
    ]
    dataset = IndexedBlocks(pad_for_ranks(examples, world_size))
    shares = []
    for rank in range(world_size):
        sampler = training_order(dataset, blocks, 5, rank, world_size)
        sampler.set_epoch(0)
        share = list(sampler)
        shares.append([share[i : i + per_rank] for i in range(0, len(share), per_rank)])
    assert {len(steps) for steps in shares} == {len(one_steps)}  # no rank waits for another
    for step, expected in enumerate(one_steps):
        dealt = [index for steps in shares for index in steps[step]]
        assert sorted(i for i in dealt if i < blocks) == sorted(expected)
        assert all(dataset[i][0] == -1 for i in dealt if i >= blocks)  # padding: unscored
    sampler = training_order(dataset, blocks, 5, 0, world_size)
    sampler.set_epoch(1)
    assert list(sampler) != [i for step in shares[0] for i in step]  # a new order each epoch


def test_unscored_examples_run_with_all_labels_masked(corpus) -> None:
    dm = make_datamodule([corpus], pack=False)
    real, copy = torch.arange(5), Unscored(torch.arange(7))
    batch = dm.collate([real, copy])
    assert batch["attention_mask"].sum(1).tolist() == [5, 7]  # both run through the models
    assert batch["input_ids"][1].tolist() == list(range(7))
    assert (batch["labels"][0, :5] == real).all()
    assert (batch["labels"][1] == IGNORE_INDEX).all()  # the copy counts nowhere


def test_reads_txt_jsonl_and_gzip(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n\nbeta")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"body": "gamma"}) + "\n\n" + json.dumps({"body": "delta"}) + "\n")
    assert list(read_documents(tmp_path / "a.txt")) == ["alpha\n\nbeta"]
    assert list(read_documents(tmp_path / "b.jsonl.gz", "body")) == ["gamma", "delta"]


def test_one_file_given_as_a_string_is_that_file(tmp_path, corpus) -> None:
    """``data.files=notes.txt`` (no brackets) was read letter by letter: "entry 'n' does not
    exist"; one string is one path or glob, for data.files and data.val_files alike."""
    as_string = TextDataModule(byte_tokenizer(), files=str(corpus), val_fraction=0.2)
    assert as_string.files == make_datamodule([corpus]).files == [corpus]
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().upper())
    assert make_datamodule([other], val_files=str(corpus)).val_files == [corpus]
    assert expand_files(str(tmp_path / "oth*.txt")) == [other]


def test_glob_patterns_expand(tmp_path, corpus) -> None:
    (tmp_path / "more.txt").write_text("x" * 400)
    dm = make_datamodule([tmp_path / "*.txt"])
    assert sorted(p.name for p in dm.files) == ["corpus.txt", "more.txt"]


def test_a_double_star_reads_every_depth(tmp_path) -> None:
    """``dir/**/*.txt`` read one level down only (``**`` was ``*``): two thirds of this corpus
    went unread, without a word."""
    for name in ("top.txt", "a/mid.txt", "a/b/deep.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"text of {name}")
    found = expand_files([str(tmp_path / "**" / "*.txt")])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in found) == [
        "a/b/deep.txt",
        "a/mid.txt",
        "top.txt",
    ]


def test_default_corpus_is_embedded() -> None:
    docs = list(read_documents(DEFAULT_CORPUS))
    assert len(docs) == 79 and sum(map(len, docs)) > 400_000
    assert docs[0].startswith('The "assert" statement')


def test_empty_data_is_an_error_and_a_blank_file_beside_text_is_named(tmp_path, corpus) -> None:
    """A whitespace-only file was called "empty"; beside others, it went without a word."""
    (tmp_path / "blank.txt").write_text("   \n\t\n")
    with pytest.raises(ValueError, match=r"no text in \[.*blank.txt'\]: empty, or only white"):
        make_datamodule([tmp_path / "blank.txt"]).setup("fit")
    with pytest.warns(UserWarning, match=r"data: \[.*blank.txt'\] hold no text \(empty, white"):
        make_datamodule([corpus, tmp_path / "blank.txt"]).setup("fit")


def test_a_file_of_nuls_is_no_text(tmp_path, corpus) -> None:
    """A data file zero-filled by a crash or a failed copy (valid UTF-8: 65,536 NULs) was
    trained on as a corpus, exit 0, without a word (probe 59)."""
    (tmp_path / "zero.txt").write_bytes(b"\0" * 65536)
    with pytest.raises(ValueError, match=r"no text in \[.*zero.txt'\]: empty, or only .* NULs"):
        make_datamodule([tmp_path / "zero.txt"]).setup("fit")
    with pytest.warns(UserWarning, match=r"data: \[.*zero.txt'\] hold no text"):
        make_datamodule([corpus, tmp_path / "zero.txt"]).setup("fit")


def test_too_little_data_is_an_error(tmp_path) -> None:
    (tmp_path / "tiny.txt").write_text("hello world")
    with pytest.raises(ValueError, match="lower data.block_size"):
        make_datamodule([tmp_path / "tiny.txt"]).setup("fit")


def test_bad_files_are_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.txt' does not exist"):
        make_datamodule([tmp_path / "missing.txt"])
    with pytest.raises(FileNotFoundError, match="matches no file"):
        make_datamodule([tmp_path / "*.jsonl"])
    (tmp_path / "data.csv").write_text("a,b")
    with pytest.raises(ValueError, match="use one of .txt"):
        make_datamodule([tmp_path / "data.csv"])
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"content": "no text key"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 has no 'text' field"):
        list(read_documents(tmp_path / "bad.jsonl"))


def test_default_files_are_the_reference_and_the_teachers_english() -> None:
    assert DEFAULT_FILES == (DEFAULT_CORPUS, TEACHER_CORPUS)
    answers = list(read_documents(TEACHER_CORPUS))
    assert len(answers) == 224 and sum(map(len, answers)) > 200_000
    # the embedded corpora by name, as data.files entries (experiment=long uses one)
    assert expand_files(["python_reference", "smollm2_generated"]) == list(DEFAULT_FILES)


def test_unpacked_single_token_documents_left_out_are_said(tmp_path) -> None:
    """'Yes', 'No': nothing to predict without a separator, dropped unsaid (probe 46)."""
    from lightning_kd.data.packing import blocks_of

    with pytest.warns(UserWarning, match=r"pack=false: 2 document\(s\) of 3 are of one token"):
        examples = blocks_of([[5], [6], [7, 8, 9]], 4, pack=False, eos_id=0, needed=1)
    assert [e.tolist() for e in examples] == [[7, 8, 9]]
