"""The maps from the teacher's vocabulary to the student's (``data/vocab_maps.py``)."""

from __future__ import annotations

import torch

from lightning_kd.data.token_bytes import token_bytes
from lightning_kd.data.vocab_maps import first_token_map, vocabulary_map
from lightning_kd.models.loading import byte_tokenizer
from tests.conftest import byte_level_bpe, sentencepiece_tokenizer


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


def test_identical_tokenizers_map_every_token_to_itself():
    """Byte-level BPE fragments ("âĢ", bytes E2 80, a piece of no whole character) went to the
    student's first byte ("â") though it has the very piece, so identical tokenizers' projected
    loss was not the same-tokenizer loss (probe 42)."""
    tokenizer = byte_level_bpe()
    table = token_bytes(tokenizer)
    fragment = tokenizer.convert_tokens_to_ids("âĢ")
    assert table.pieces[fragment] == b"\xe2\x80"
    same = torch.arange(len(tokenizer))
    assert (first_token_map(tokenizer, table, table, len(tokenizer)) == same).all()
    assert (vocabulary_map(table, table, len(tokenizer)) == same).all()


def test_a_fragment_the_student_lacks_goes_to_the_longest_piece_it_starts_with():
    teacher = byte_level_bpe()
    student = byte_tokenizer()
    tables = token_bytes(student), token_bytes(teacher, "teacher")
    mapping = first_token_map(student, *tables, len(teacher))
    assert tables[0].pieces[mapping[teacher.convert_tokens_to_ids("ĠâĢ")]] == b" "
    assert tables[0].pieces[mapping[teacher.convert_tokens_to_ids("âĢ")]] == b"\xe2"


def base_chatml_pair():
    """A base student (EOS ``<|endoftext|>``) with ChatML's markers, and an instruct teacher
    whose EOS is ``<|im_end|>`` and which has no ``<|endoftext|>``."""
    from tests.unit.data.test_encoding import MARKERS, chatml_tokenizer

    student = chatml_tokenizer()
    student.add_special_tokens({"eos_token": "<|endoftext|>"})
    teacher = sentencepiece_tokenizer()
    teacher.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": MARKERS})
    return student, teacher


def test_shared_markers_are_twins_and_an_end_with_two_meanings_gets_a_second_entry():
    """The teacher's end is the student's turn marker: it maps there (a turn's end), and the
    map's extra entry is the student's own end (a document's end). Before, the teacher's end
    went to the student's end everywhere, so at every turn's end the student was taught to end
    the document, and the markers both have mapped to nothing."""
    student, teacher = base_chatml_pair()
    tables = token_bytes(student), token_bytes(teacher, "teacher")
    for mapping in (
        vocabulary_map(*tables, len(teacher)),
        first_token_map(student, *tables, len(teacher)),
    ):
        assert len(mapping) == len(teacher) + 1
        start, end = (student.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
        assert mapping[teacher.convert_tokens_to_ids("<|im_start|>")] == start
        assert mapping[teacher.eos_token_id] == end
        assert mapping[-1] == student.eos_token_id
        assert mapping[teacher.convert_tokens_to_ids("<eos>")] == student.convert_tokens_to_ids(
            "<eos>"
        )  # the same content: a twin, though neither tokenizer's end
    one_to_one = vocabulary_map(*tables, len(teacher))
    hits = one_to_one[one_to_one >= 0]
    assert hits.unique().numel() == hits.numel()


def test_an_end_both_spell_the_same_needs_no_second_entry():
    from tests.unit.data.test_encoding import MARKERS, chatml_tokenizer

    student, teacher = chatml_tokenizer(), sentencepiece_tokenizer()
    teacher.add_special_tokens({"additional_special_tokens": MARKERS})
    mapping = vocabulary_map(token_bytes(student), token_bytes(teacher, "teacher"), len(teacher))
    assert len(mapping) == len(teacher)
    assert mapping[teacher.eos_token_id] == student.eos_token_id
    assert mapping[teacher.convert_tokens_to_ids("<|im_end|>")] == student.convert_tokens_to_ids(
        "<|im_end|>"
    )
