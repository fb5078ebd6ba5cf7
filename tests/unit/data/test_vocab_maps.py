"""The maps from the teacher's vocabulary to the student's (``data/vocab_maps.py``)."""

from __future__ import annotations

from lightning_kd.data.token_bytes import token_bytes
from lightning_kd.data.vocab_maps import first_token_map, vocabulary_map
from lightning_kd.models.loading import byte_tokenizer
from tests.conftest import sentencepiece_tokenizer


def test_vocabulary_map_is_one_to_one_and_prefers_regular_pieces():
    student, teacher = byte_tokenizer(), sentencepiece_tokenizer()
    tables = token_bytes(student), token_bytes(teacher, "teacher")
    mapping = vocabulary_map(*tables, len(teacher))
    hits = mapping[mapping >= 0]
    assert hits.unique().numel() == hits.numel()
    # "e" is both a learnt piece and the byte piece <0x65>: the learnt one maps, as it is emitted.
    e = teacher.convert_tokens_to_ids("e")
    assert mapping[e] == student.convert_tokens_to_ids("e")
    assert mapping[teacher.convert_tokens_to_ids("<0x65>")] == -1
    assert mapping[teacher.eos_token_id] == student.eos_token_id
    assert mapping[teacher.convert_tokens_to_ids("▁quick")] == -1  # no such student token


def test_first_token_map_credits_each_teacher_token_to_the_students_first():
    student, teacher = byte_tokenizer(), sentencepiece_tokenizer()
    tables = token_bytes(student), token_bytes(teacher, "teacher")
    mapping = first_token_map(student, *tables, len(teacher))
    # "▁quick" is " quick": a byte student starts it with " "; a byte piece maps to its byte.
    assert mapping[teacher.convert_tokens_to_ids("▁quick")] == student.convert_tokens_to_ids("Ġ")
    byte = teacher.convert_tokens_to_ids("<0xE6>")
    assert tables[0].pieces[mapping[byte]] == b"\xe6"
    assert mapping[teacher.eos_token_id] == student.eos_token_id
    assert (mapping[[teacher.convert_tokens_to_ids(t) for t in ("<bos>", "<pad>")]] == -1).all()
