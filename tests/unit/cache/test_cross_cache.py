"""A cache of a teacher with another tokenizer than the student's: the teacher's top k in its own
vocabulary at the student positions aligned with one of its own, read back as the records and the
teacher's bits per byte the online cross-tokenizer path computes; a cache of another tokenizer or
too small a k refused before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import normalizers

from lightning_kd.cache import CacheMismatch, CacheSpec
from lightning_kd.cache.cross_shards import cross_shard_records
from lightning_kd.cache.narrow import narrow_cache
from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.cache.writer import write_cache
from lightning_kd.data.alignment import RULE
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.models.heads import output_head
from lightning_kd.models.loading import model_from_config
from tests.conftest import TINY_LLAMA, make_datamodule, sentencepiece_tokenizer


@pytest.fixture
def setup(corpus: Path):
    """A tiny SentencePiece teacher, the byte-tokenized data, and the path between them."""
    teacher_tokenizer = sentencepiece_tokenizer()
    torch.manual_seed(0)
    config = {**TINY_LLAMA, "vocab_size": len(teacher_tokenizer)}
    teacher = model_from_config(config, "causal_lm").eval()
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    cross = CrossTokenizer(
        datamodule.tokenizer, teacher_tokenizer, 257, len(teacher_tokenizer), top_k=8
    )
    return teacher, datamodule, cross


def written(setup, directory: Path, k: int = 16) -> Path:
    teacher, datamodule, cross = setup
    spec = CacheSpec(k=k, shard_blocks=4)
    write_cache(teacher, datamodule.tokenizer, datamodule, spec, directory, cross=cross)
    # The writer aligns and keeps the teacher's own top k: the vocabulary maps are never built.
    assert "mapping" not in vars(cross) and "student_twins" not in vars(cross)
    return directory


def online_and_cached(setup, directory: Path):
    """A validation batch's records and teacher bits per byte, online and from the cache."""
    teacher, datamodule, cross = setup
    batch = next(iter(datamodule.val_dataloader()))
    online = cross.records(teacher, output_head(teacher), batch, 1.0, keep=True)
    online_bits = cross.teacher_sums()["teacher_bpb"]
    cached = CachedTeacher.for_run(
        directory, teacher, datamodule.tokenizer, datamodule, 1.0, (), cross
    )
    stored, features = cached.records(batch, "val")
    assert features == {}
    return online, online_bits, stored, cross.teacher_sums()["teacher_bpb"]


def assert_same_records(online, stored) -> None:
    assert torch.equal(online.aligned, stored.aligned) and online.aligned.any()
    where = online.aligned
    assert torch.equal(online.ids[where], stored.ids[where])
    assert torch.equal(online.matched[where], stored.matched[where])
    # Stored in fp16: log-probs in [-20, 0] to within 0.008.
    torch.testing.assert_close(stored.log_probs[where], online.log_probs[where], atol=1e-2, rtol=0)
    torch.testing.assert_close(stored.tail[where], online.tail[where], atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(stored.top_probs[where], online.top_probs[where], atol=1e-3, rtol=0)


def test_the_cache_serves_the_online_records_and_the_teachers_bits_per_byte(setup, tmp_path):
    """Written at k = 16 and read at distill.cross_top_k = 8: the top 8 of the top 16, the rest
    in the tail; the teacher's NLL and bytes per block sum to what the online path measures."""
    directory = written(setup, tmp_path / "cache")
    online, online_bits, stored, stored_bits = online_and_cached(setup, directory)
    assert_same_records(online, stored)
    assert stored.ids.shape[-1] == 8
    assert torch.equal(stored_bits[1], online_bits[1]) and online_bits[1] > 0
    torch.testing.assert_close(stored_bits[0], online_bits[0].to(stored_bits[0].dtype))


def test_a_smaller_k_is_narrowed_from_a_larger_cross_cache(setup, tmp_path) -> None:
    teacher, datamodule, cross = setup
    source = written(setup, tmp_path / "k16")
    spec = CacheSpec(k=8, shard_blocks=4)
    narrow_cache(
        source, teacher, datamodule.tokenizer, datamodule, spec, tmp_path / "k8", cross=cross
    )
    online, _, stored, _ = online_and_cached(setup, tmp_path / "k8")
    assert_same_records(online, stored)


def test_a_cache_of_another_tokenisation_or_too_small_a_k_is_refused(setup, tmp_path) -> None:
    teacher, datamodule, cross = setup
    directory = written(setup, tmp_path / "cache", k=4)
    args = (directory, teacher, datamodule.tokenizer, datamodule, 1.0, ())
    with pytest.raises(CacheMismatch, match=r"top 4, this run reads its top distill.cross_top_k=8"):
        CachedTeacher.for_run(*args, cross)
    # A run whose teacher reads the student's own tokens cannot use it...
    with pytest.raises(CacheMismatch, match=r"teacher_tokenizer: the cache's teacher read its own"):
        CachedTeacher.for_run(*args)
    # ...nor a run whose teacher reads another tokenizer than the one the cache was written with.
    other = CrossTokenizer(
        datamodule.tokenizer,
        sentencepiece_tokenizer(normalizer=normalizers.NFKC()),
        257,
        len(cross.teacher_tokenizer),
        top_k=4,
    )
    with pytest.raises(CacheMismatch, match=r"this run's reads its own tokenizer"):
        CachedTeacher.for_run(*args, other)


def test_a_cache_written_by_an_older_alignment_rule_is_refused(setup, tmp_path) -> None:
    """Its aligned positions may be ones this version no longer pairs (a lower-cased capital):
    the key records the rule; a key without one (written before it was recorded) is rule 0."""
    teacher, datamodule, cross = setup
    directory = written(setup, tmp_path / "cache", k=8)
    index = json.loads((directory / "index.json").read_text())
    assert index["key"]["alignment"] == RULE
    del index["key"]["alignment"]
    (directory / "index.json").write_text(json.dumps(index))
    args = (directory, teacher, datamodule.tokenizer, datamodule, 1.0, ())
    with pytest.raises(
        CacheMismatch, match=rf"alignment: the cache paired .* rule 0, .* rule {RULE}"
    ):
        CachedTeacher.for_run(*args, cross)


def test_the_cache_serves_the_online_spans(setup, tmp_path) -> None:
    """A run with the span term reads each span's teacher log-probability from the cache as the
    online path computes it (stored in fp32)."""
    cross = setup[2]
    directory = written(setup, tmp_path / "cache")
    cross.span_weight = 0.5
    online, _, stored, _ = online_and_cached(setup, directory)
    assert_same_records(online, stored)
    assert stored.span_weight == 0.5 and torch.equal(online.span, stored.span)
    assert (online.span >= 0).sum() > online.aligned.sum() // 2
    torch.testing.assert_close(
        stored.span_log_prob, online.span_log_prob, rtol=1e-6, atol=1e-5, check_dtype=False
    )


def test_a_cache_without_spans_is_refused_for_a_span_term(setup, tmp_path, monkeypatch):
    """A cache written before caches stored spans serves a run without the span term, and is
    refused, naming the fix, for a run with one."""
    from lightning_kd.cache import writer

    teacher, datamodule, cross = setup

    def without_spans(*args, **kwargs):
        tensors = cross_shard_records(*args, **kwargs)
        del tensors["span"]
        return tensors

    monkeypatch.setattr(writer, "cross_shard_records", without_spans)
    directory = written(setup, tmp_path / "old")
    args = (directory, teacher, datamodule.tokenizer, datamodule, 1.0, ())
    CachedTeacher.for_run(*args, cross)
    cross.span_weight = 1.0
    with pytest.raises(CacheMismatch, match=r"no span log-probabilities .* rewrite it"):
        CachedTeacher.for_run(*args, cross)


def test_a_same_tokenizer_cache_for_a_cross_tokenizer_teacher_is_called_another_teacher(
    setup, tmp_path
) -> None:
    """It read "rule 0, this version by rule 3" too, as if an upgrade would fix it."""
    import dataclasses

    from lightning_kd.cache.format import CacheKey
    from lightning_kd.cache.key_mismatch import mismatches

    directory = written(setup, tmp_path / "cache", k=8)
    run = CacheKey(**json.loads((directory / "index.json").read_text())["key"])
    same_tokenizer = dataclasses.replace(run, teacher_tokenizer="", alignment=0)
    found = mismatches(same_tokenizer, run)
    assert [line.split(":")[0] for line in found] == ["teacher_tokenizer"]
    assert "the cache's teacher read the student's tokens" in found[0]


def test_the_write_report_times_the_cross_tokenizer_pass_as_one(setup, tmp_path) -> None:
    """Alignment, forward and the top k of the teacher's vocabulary run as one pass: the report
    counted them all as "teacher forward" beside a "top-k 0.0 s" (probe 32)."""
    teacher, datamodule, cross = setup
    spec = CacheSpec(k=16, shard_blocks=4)
    stats = write_cache(teacher, datamodule.tokenizer, datamodule, spec, tmp_path, cross=cross)
    line = stats.line(0)
    assert "teacher alignment, forward and top-k" in line and "top-k 0.0 s" not in line
