"""Data domains: each domain's documents packed on their own, every block and batch row tagged
with its domain, and a mapping that does not cover data.files exactly refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_kd.data.text import TextDataModule
from lightning_kd.models.loading import byte_tokenizer

CODE = "def add(a, b):\n    return a + b\n"
PROSE = "The river ran quietly past the old mill, and nobody minded it.\n"


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    code, prose = tmp_path / "code.txt", tmp_path / "prose.txt"
    code.write_text(CODE * 40)
    prose.write_text(PROSE * 40)
    return code, prose


def module(files, domains, **options) -> TextDataModule:
    settings = {"block_size": 32, "batch_size": 4, "val_fraction": 0.2} | options
    return TextDataModule(
        byte_tokenizer(), files=[str(f) for f in files], domains=domains, **settings
    )


def assert_blocks_of_their_domain(data: TextDataModule, code: str, prose: str) -> None:
    """Every training and validation block of both domains, each holding its domain's text."""
    tokenizer = byte_tokenizer()
    for blocks, tags in (
        (data.train_examples, data.train_domains),
        (data.val_examples, data.val_domains),
    ):
        assert len(blocks) == len(tags) and set(tags) == {0, 1}
        for block, tag in zip(blocks, tags, strict=True):
            characters = set(tokenizer.decode(block.tolist(), skip_special_tokens=True))
            assert characters <= set(code if tag == 0 else prose), (tag, characters)


def test_each_block_is_one_domains_and_batches_carry_it(files) -> None:
    code, prose = files
    data = module(files, {"code": [str(code)], "prose": [str(prose)]})
    data.setup()
    assert_blocks_of_their_domain(data, CODE, PROSE)
    batch = next(iter(data.train_dataloader()))
    assert batch["domain"].tolist() == [
        data.train_domains[i] for i in batch["block_index"].tolist()
    ]
    val = next(iter(data.val_dataloader()))
    assert val["domain"].tolist() == [data.val_domains[i] for i in val["block_index"].tolist()]


def test_without_domains_batches_have_none(files) -> None:
    data = module(files, None)
    data.setup()
    assert data.train_domains is None and "domain" not in next(iter(data.train_dataloader()))


@pytest.mark.parametrize(
    ("domains", "message"),
    [
        (lambda c, p: {"code": [str(c)]}, r"are in no domain of data.domains"),
        (
            lambda c, p: {"a": [str(c), str(p)], "b": [str(p)]},
            r"is in data.domains.a and data.domains.b",
        ),
        (
            lambda c, p: {"a": [str(c)], "b": [str(p), str(p.with_name("x.txt"))]},
            r"no file|not read|matches no",
        ),
        (lambda c, p: {"a": str(c), "b": [str(p)]}, r"list the domain's files"),
    ],
)
def test_a_mapping_that_does_not_cover_the_files_exactly_is_refused(
    files, domains, message
) -> None:
    code, prose = files
    if "x.txt" in str(domains(code, prose)):
        prose.with_name("x.txt").write_text("other text\n")
        message = r"which data.files does not read"
    with pytest.raises(ValueError, match=message):
        module(files, domains(code, prose))


def test_a_domain_names_a_file_as_data_files_does_or_otherwise(files, tmp_path, monkeypatch):
    """Matched by the file, not its spelling: data.files relative and data.domains absolute (or
    through a symlinked folder) were told their files were in no domain (probe 39); a domain's
    pattern matching nothing is named as the domain's, not as data.files'."""
    code, prose = files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "linked").symlink_to(tmp_path)
    domains = {"code": [str(code)], "prose": [str(tmp_path / "linked" / prose.name)]}
    data = TextDataModule(
        byte_tokenizer(), files=[code.name, prose.name], domains=domains, block_size=32
    )
    data.setup()
    assert_blocks_of_their_domain(data, CODE, PROSE)
    with pytest.raises(ValueError, match=r"data.domains.none pattern '.*/\*.md' matches no file"):
        module(files, {"code": [str(code)], "prose": [str(prose)], "none": [f"{tmp_path}/*.md"]})


def test_validation_files_are_split_by_domain_too(files, tmp_path: Path) -> None:
    """data.val_files in the mapping: validation blocks carry their domain, a domain may have
    none of them; a val file in no domain, or a domain with nothing to train on, is refused."""
    code, prose = files
    held = tmp_path / "held.txt"
    held.write_text(PROSE.upper() * 20)
    domains = {"code": [str(code)], "prose": [str(prose), str(held)]}
    data = module(files, domains, val_files=[str(held)])
    data.setup()
    tokenizer = byte_tokenizer()
    assert data.val_domains == [1] * len(data.val_examples) and data.val_examples
    for block in data.val_examples:
        assert set(tokenizer.decode(block.tolist(), skip_special_tokens=True)) <= set(PROSE.upper())
    assert set(data.train_domains) == {0, 1}
    val = next(iter(data.val_dataloader()))
    assert set(val["domain"].tolist()) == {1}
    with pytest.raises(ValueError, match=r"data.files and data.val_files \[.*held.txt"):
        module(files, {"code": [str(code)], "prose": [str(prose)]}, val_files=[str(held)])
    with pytest.raises(ValueError, match=r"data.domains.held holds no text to train on"):
        only_val = {"code": [str(code), str(prose)], "held": [str(held)]}
        module(files, only_val, val_files=[str(held)]).setup()


def test_a_datasets_domains_are_the_values_of_a_column(files, tmp_path, datasets_home) -> None:
    """data.dataset with data.domain_field: rows grouped by that column's values, each
    domain's packed apart as the files' are; the rows of a value in no domain refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": f"{CODE}# {i}\n", "source": "python"} for i in range(30)]
    rows += [{"text": f"{PROSE}({i})\n", "source": "books"} for i in range(30)]
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    source = {"path": "parquet", "data_files": str(table)}
    settings = {"block_size": 32, "batch_size": 4, "val_fraction": 0.2, "dataset": source}
    domains = {"code": ["python"], "prose": ["books"]}
    data = TextDataModule(byte_tokenizer(), domains=domains, domain_field="source", **settings)
    data.setup()
    assert_blocks_of_their_domain(data, CODE + "# 0123456789", PROSE + "()0123456789")
    # A validation split of its own: its blocks carry their domain too (here: prose alone).
    held = tmp_path / "held.parquet"
    pq.write_table(pa.Table.from_pylist([*rows[40:], {"text": PROSE * 2, "source": "books"}]), held)
    split = {"dataset": source | {"data_files": {"train": str(table), "validation": str(held)}}}
    split["dataset"]["val_split"] = "validation"
    data = TextDataModule(
        byte_tokenizer(), domains=domains, domain_field="source", **(settings | split)
    )
    data.setup()
    assert set(data.val_domains) == {1} and set(data.train_domains) == {0, 1}
    with pytest.raises(ValueError, match=r"rows whose 'source' is \['books'\] are in no domain"):
        only_code = {"code": ["python"]}
        TextDataModule(
            byte_tokenizer(), domains=only_code, domain_field="source", **settings
        ).setup()
    with pytest.raises(ValueError, match=r"no column 'text' and 'origin'.*data.domain_field"):
        TextDataModule(byte_tokenizer(), domains=domains, domain_field="origin", **settings).setup()


def test_a_null_domain_cell_is_no_value_unless_a_domain_lists_null(
    files, tmp_path, datasets_home
) -> None:
    """A null cell read as the text "None": a domain listing "None" took it, and the refusal
    named 'None' (probe 46). Now it is null, taken by a domain listing null, read or streamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": f"{CODE}# {i}\n", "source": "python"} for i in range(30)]
    rows += [{"text": f"{PROSE}({i})\n", "source": None} for i in range(30)]
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    settings = {"block_size": 32, "batch_size": 4, "val_fraction": 0.2}
    settings["dataset"] = {"path": "parquet", "data_files": str(table)}
    for streaming in (False, True):
        with pytest.raises(ValueError, match=r"is \[None\] are in no domain.*\(null: a row"):
            named = {"code": ["python"], "prose": ["None"]}
            data = TextDataModule(
                byte_tokenizer(),
                domains=named,
                domain_field="source",
                streaming=streaming,
                **settings,
            )
            data.setup()
            next(iter(data.train_dataloader()))
    taken = {"code": ["python"], "prose": [None]}
    data = TextDataModule(byte_tokenizer(), domains=taken, domain_field="source", **settings)
    data.setup()
    assert_blocks_of_their_domain(data, CODE + "# 0123456789", PROSE + "()0123456789")


def test_domains_of_a_dataset_need_its_column(files, tmp_path) -> None:
    code, _ = files
    source = {"path": "json", "data_files": str(tmp_path / "rows.jsonl")}
    for streaming in (False, True):
        with pytest.raises(ValueError, match=r"groups the values of one of its columns.*field="):
            TextDataModule(
                byte_tokenizer(), domains={"code": [str(code)]}, dataset=source, streaming=streaming
            )
    with pytest.raises(ValueError, match=r"data.domain_field='source' names the column"):
        TextDataModule(byte_tokenizer(), files=[str(code)], domain_field="source")


def test_the_documents_a_teacher_may_continue_touch_no_validation_block(tmp_path: Path) -> None:
    """Each domain packed apart: the untouched documents are found domain by domain."""
    code, prose = tmp_path / "code.jsonl", tmp_path / "prose.jsonl"
    for path, kind in ((code, "def f{}(): return {}"), (prose, "Story {} tells of {} rivers.")):
        path.write_text(
            "".join(f'{{"text": "{kind.format(i, i)} <{path.stem}{i}>"}}\n' for i in range(60))
        )
    # Read prose first, packed code first: the blocks are not in reading order.
    data = module((prose, code), {"code": [str(code)], "prose": [str(prose)]})
    data.setup()
    tokenizer = byte_tokenizer()
    held_text = "".join(tokenizer.decode(b.tolist()) for b in data.val_examples)
    kept = data.training_documents()
    assert {place.rsplit(":", 1)[0] for place, _ in kept} == {str(code), str(prose)}
    for _, text in kept:
        assert text.split()[-1] not in held_text, text
    # None is lost beyond the documents a held block holds a piece of: those whose tag it
    # holds, and at most one cut at each end of it.
    shown = sum(f"<{path.stem}{i}>" in held_text for path in (code, prose) for i in range(60))
    assert 120 - len(kept) <= shown + 2 * len(data.val_examples)
