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


def test_each_block_is_one_domains_and_batches_carry_it(files) -> None:
    code, prose = files
    data = module(files, {"code": [str(code)], "prose": [str(prose)]})
    data.setup()
    tokenizer = byte_tokenizer()
    for blocks, tags in (
        (data.train_examples, data.train_domains),
        (data.val_examples, data.val_domains),
    ):
        assert len(blocks) == len(tags) and set(tags) == {0, 1}
        for block, tag in zip(blocks, tags, strict=True):
            characters = set(tokenizer.decode(block.tolist(), skip_special_tokens=True))
            assert characters <= set(CODE if tag == 0 else PROSE), (tag, characters)
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


def test_domains_need_files_read_whole(files, tmp_path: Path) -> None:
    code, prose = files
    held = tmp_path / "held.txt"
    held.write_text(PROSE * 5)
    with pytest.raises(ValueError, match=r"data.domains groups data.files read whole"):
        module(files, {"code": [str(code)], "prose": [str(prose)]}, val_files=[str(held)])
