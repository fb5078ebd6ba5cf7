"""Aligning two tokenisations of the same text, on hand-made strings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tokenizers import normalizers

from lightning_kd.data.alignment import (
    Aligner,
    partners,
    teacher_targets,
)
from lightning_kd.data.encoding import text_ids
from lightning_kd.data.errors import DataError
from lightning_kd.data.spelling import utf8_window
from lightning_kd.data.token_bytes import byte_lengths, check_fast
from lightning_kd.models.loading import byte_tokenizer
from lightning_kd.utils.refusal import Refused
from tests.conftest import sentencepiece_tokenizer


def student_batch(*texts: str, end: bool = False) -> torch.Tensor:
    """Byte-tokenised rows of ``texts`` joined by the student's EOS (one row)."""
    tokenizer = byte_tokenizer()
    ids = []
    for text in texts:
        ids += text_ids(tokenizer, [text])[0] + ([256] if end or text is not texts[-1] else [])
    return torch.tensor([ids])


def starts(aligner: Aligner, ids: list[int], table) -> list[int]:
    """The byte offset at which each token of ``ids`` starts (boundaries take no bytes)."""
    offsets, at = [], 0
    for token in ids:
        offsets.append(at)
        at += len(table.pieces[token])
    return offsets


def pairs(view, student_ids):
    partner = view.partner[0].tolist()
    return [(i, j) for i, j in enumerate(partner) if j >= 0]


def test_aligned_positions_predict_tokens_that_start_at_the_same_byte():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    ids = student_batch("The quick brown fox jumps")
    view = aligner.view(ids)
    student_starts = starts(aligner, ids[0].tolist(), aligner.student)
    teacher_ids = view.input_ids[0].tolist()
    teacher_starts = starts(aligner, teacher_ids, aligner.teacher)
    found = pairs(view, ids)
    # The teacher's merged words ("▁quick") start where the student's bytes do: one pair each.
    assert [student_starts[i + 1] for i, _ in found] == [teacher_starts[j + 1] for _, j in found]
    words = {3, 9, 15, 19}  # the bytes where " quick", " brown", " fox", " jumps" start
    assert {student_starts[i + 1] for i, _ in found} >= words
    # Inside a teacher token (the "u" of "quick") nothing aligns: the student predicts a byte
    # the teacher never predicts alone.
    assert all(student_starts[i + 1] in set(teacher_starts) for i, _ in found)
    assert view.share == 1.0


def test_a_bos_on_the_teacher_side_only_predicts_the_first_token():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    view = aligner.view(student_batch("The fox"))
    teacher = view.input_ids[0].tolist()
    assert teacher[0] == aligner.teacher.prefix[0]  # its own BOS, which the student lacks
    # Student position 0 predicts "h" (inside the teacher's "The"): no partner. The teacher's
    # BOS predicts "The", which no student position predicts (nothing precedes the first token).
    assert view.partner[0, 0] == -1
    assert 0 not in view.partner[0].tolist()


def test_document_ends_align_with_each_other_and_the_next_document_with_the_bos():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    ids = student_batch("The fox", "The dog")
    row = ids[0].tolist()
    end = row.index(256)
    view = aligner.view(ids)
    teacher = view.input_ids[0].tolist()
    teacher_end = teacher.index(aligner.teacher.end)
    assert view.partner[0, end - 1] == teacher_end - 1  # "x" → EOS and its teacher twin
    # After the EOS the teacher reads its own BOS; the student's EOS position and the teacher's
    # BOS position both predict the next document's first token.
    assert teacher[teacher_end + 1] == aligner.teacher.prefix[0]
    assert view.partner[0, end] == teacher_end + 1


def test_byte_fallback_pieces_spell_bytes_and_align_byte_by_byte():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    text = "ok 日本"  # not in the teacher's learnt merges: six <0xNN> pieces
    view = aligner.view(student_batch(text))
    assert view.share == 1.0
    teacher = view.input_ids[0].tolist()
    pieces = [aligner.teacher_tokenizer.convert_ids_to_tokens(t) for t in teacher]
    assert pieces[-6:] == ["<0xE6>", "<0x97>", "<0xA5>", "<0xE6>", "<0x9C>", "<0xAC>"]
    # Every byte of the two characters starts a token on both sides.
    student_row = student_batch(text)[0].tolist()
    assert all(view.partner[0, i] >= 0 for i in range(len(student_row) - 7, len(student_row) - 1))


def test_a_normaliser_that_rewrites_characters_leaves_the_rest_aligned():
    nfkc = sentencepiece_tokenizer(normalizers.NFKC())
    aligner = Aligner(byte_tokenizer(), nfkc)
    text = "The ﬁsh and the fox"  # NFKC turns the ligature "ﬁ" (3 bytes) into "fi" (2)
    view = aligner.view(student_batch(text))
    # The teacher's "▁f" and "i" spell " fi" where the text has " ﬁ": those 4 bytes of the
    # text are not spelled back (nor paired); the rest is.
    assert view.share == pytest.approx((len(text.encode()) - 4) / len(text.encode()))
    student_starts = starts(aligner, student_batch(text)[0].tolist(), aligner.student)
    aligned = {student_starts[i + 1] for i, _ in pairs(view, None)}
    assert text.encode().index(b" fox") in aligned  # after the rewrite, offsets still agree


@pytest.mark.parametrize(
    "rewrite",
    [normalizers.Lowercase(), normalizers.Replace("\n", "\n ")],
    ids=["lower-case", "a space inserted after each newline"],
)
def test_only_teacher_tokens_that_spell_the_text_back_are_paired(rewrite):
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer(rewrite))
    text = "see The end\nThe fox and The dog\nthe fox"
    ids = student_batch(text)
    view = aligner.view(ids)
    data = text.encode()
    student_starts = starts(aligner, ids[0].tolist(), aligner.student)
    teacher_ids = view.input_ids[0].tolist()
    found = pairs(view, ids)
    # Every pair predicts the same text: the teacher's next token is the text's bytes there
    # (a teacher's " the" for the text's " The", or its " The" for "\nThe", started at the same
    # byte and was paired before).
    for i, j in found:
        piece = aligner.teacher.pieces[teacher_ids[j + 1]]
        assert data[student_starts[i + 1] :].startswith(piece)
    assert len(found) >= 10
    assert view.share < 1.0


def test_a_teacher_that_rewrites_most_of_the_text_is_refused():
    from lightning_kd.distill.cross_tokenizer import CrossTokenizer

    lower = sentencepiece_tokenizer(normalizers.Lowercase())
    cross = CrossTokenizer(byte_tokenizer(), lower, 257, len(lower))
    ids = student_batch("THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG")
    # a Refused: the command prints the message alone (it was a traceback, exit 1)
    with pytest.raises(Refused, match=r"spells back .*% of the student's first batch.*cross_min"):
        cross.view({"input_ids": ids, "labels": ids})


def test_a_teacher_that_rewrites_the_text_after_a_first_batch_it_spells_is_warned_about():
    """A lower-casing teacher passed on a lower-case first batch, then trained silently on
    upper-case text it spelled 3 % of (probe 32): the share of every batch read is watched."""
    from lightning_kd.distill.cross_tokenizer import CrossTokenizer

    lower = sentencepiece_tokenizer(normalizers.Lowercase())
    cross = CrossTokenizer(byte_tokenizer(), lower, 257, len(lower))
    first = student_batch("the quick brown fox jumps over the lazy dog")
    shouting = student_batch("THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG, TWICE OVER")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cross.view({"input_ids": first, "labels": first})  # passes: all of it spelled back
    with pytest.warns(
        UserWarning, match=r"spelled back \d+\.\d% .* over the 2 batches .*cross_min"
    ):
        cross.view({"input_ids": shouting, "labels": shouting})
    assert cross.spelled.share < 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        cross.view({"input_ids": shouting, "labels": shouting})


def test_whitespace_runs_and_newlines_round_trip():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    view = aligner.view(student_batch("The  fox\n\n  jumps\t over"))
    assert view.share == 1.0
    assert (view.partner >= 0).sum() >= 6


def test_a_block_cut_inside_a_character_drops_only_the_stray_bytes():
    """The stray bytes are no text either side can spell: counted as text not spelled back,
    CJK that neither tokenizer rewrites was 97.5 % spelled in 64-token blocks, and refused at
    distill.cross_min_aligned=1 as a normalisation problem (probe 39)."""
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    full = student_batch("日本 fox jumps 日")[0]
    cut = full[1:-2].unsqueeze(0)  # starts and ends mid-character
    view = aligner.view(cut)
    assert view.text_bytes == view.matched_bytes == len(cut[0]) - 3 and view.share == 1.0
    assert view.partner[0, 0] == -1  # the second stray byte: no teacher token starts there
    assert (view.partner >= 0).sum() >= 4
    assert utf8_window("本".encode()[1:]) == (2, 2)
    assert utf8_window(b"ab" + "本".encode()[:2]) == (0, 2)


def test_partners_take_the_last_teacher_token_of_a_key_and_skip_the_first():
    # Codes: 2 * byte for text, 2 * byte + 1 for an end; -1 for none.
    t_codes = np.array([0, 4, 9, 9, 12, -1])  # two ends at byte 4 (an empty document)
    wanted = np.array([0, 4, 9, 12, 6, -1])
    # byte 0 text is the teacher's first token: nothing predicts it.
    assert partners(wanted, t_codes).tolist() == [-1, 0, 2, 3, -1, -1]
    assert partners(wanted, np.array([-1])).tolist() == [-1] * 6


def test_teacher_targets_are_scored_inside_student_targets_and_at_their_ends():
    starts, stops = np.array([0, 5, 9]), np.array([3, 5, 12])  # text 0-3, an end at 5, text 9-12
    t_next = np.array([0, 4, 2 * 4, 2 * 5 + 1, 2 * 7 + 1, 2 * 9, -1])
    scored, sizes = teacher_targets(t_next, np.array([2, 3, 1, 0, 0, 3, 7]), starts, stops)
    assert scored.tolist() == [True, True, False, True, False, True, False]
    assert sizes.tolist() == [2, 3, 1, 0, 0, 3, 0]


def test_masked_labels_and_padding_are_not_paired():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    ids = student_batch("The quick fox")
    labels = ids.clone()
    labels[0, :6] = -100
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    view = aligner.view(ids, mask, labels)
    assert (view.partner[0, :5] == -1).all()  # they predict masked labels
    assert (view.partner[0, -3:] == -1).all()  # they predict padding


def test_a_slow_tokenizer_is_refused_with_the_fix():
    """A class transformers converts (transformers 4's slow LlamaTokenizer) is told to save its
    fast version; one it cannot convert (ByT5, Python alone) was told the same, and that fix
    loaded the same slow tokenizer again (probe 32)."""
    from transformers import ByT5Tokenizer

    class LlamaTokenizer:  # transformers 4's slow one: a converter makes the fast one
        is_fast = False

    with pytest.raises(ValueError, match=r"slow .*use_fast=True"):
        check_fast(LlamaTokenizer(), "teacher")
    no_fast = r"\(ByT5Tokenizer\) is a slow .*transformers has no fast version of ByT5Tokenizer"
    with pytest.raises(ValueError, match=no_fast) as refused:
        check_fast(ByT5Tokenizer(), "teacher")
    assert "use_fast" not in str(refused.value)


def wordpiece_tokenizer():
    """A BERT-style WordPiece tokenizer ("##" continuations, whitespace split, lower case)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[SEP]": 1, "the": 2, "fox": 3, "run": 4, "##s": 5, ",": 6}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, sep_token="[SEP]", unk_token="[UNK]")


def test_a_wordpiece_tokenizer_is_refused_naming_why():
    """Its tokens do not spell the text ("the fox runs" is "the", "fox", "run", "##s": no spaces,
    a "##"), so neither alignment nor bits per byte can read bytes from it."""
    with pytest.raises(DataError, match=r"teacher's tokenizer is WordPiece .*byte-level BPE or"):
        Aligner(byte_tokenizer(), wordpiece_tokenizer())
    assert byte_lengths(wordpiece_tokenizer(), None) is None


def test_a_special_tokens_string_in_the_text_is_text_for_the_teacher_too():
    aligner = Aligner(byte_tokenizer(), sentencepiece_tokenizer())
    text = "a quoted <eos> and <bos> in prose"
    view = aligner.view(student_batch(text))
    teacher = view.input_ids[0].tolist()
    # Parsed, the teacher read its own EOS and BOS mid-text (no bytes: 10 of the text's lost).
    assert aligner.teacher.end not in teacher and teacher.count(aligner.teacher.prefix[0]) == 1
    assert view.share == 1.0


def test_chat_markers_both_tokenizers_have_stay_markers_for_the_teacher():
    from lightning_kd.data.chat_tokens import encode_chat
    from tests.unit.data.test_encoding import MARKERS, chatml_tokenizer, conversation

    student = chatml_tokenizer()
    example = encode_chat(student, conversation("Say <|im_end|> twice"), "row 0")
    ids = example.tokens.unsqueeze(0)
    knows = sentencepiece_tokenizer()
    knows.add_special_tokens({"additional_special_tokens": MARKERS})
    for teacher, markers in ((knows, 6), (sentencepiece_tokenizer(), 0)):
        view = Aligner(student, teacher).view(ids, labels=example.labels.unsqueeze(0))
        read = view.input_ids[0].tolist()
        # The template's six markers are the teacher's own where it has them (a teacher without
        # them reads their text); the one quoted in the message is text for either.
        assert sum(read.count(t) for t in teacher.convert_tokens_to_ids(MARKERS)) == markers
        assert view.share == 1.0


def test_a_shared_marker_that_is_the_teachers_end_pairs_as_its_text():
    """An instruct teacher whose EOS is <|im_end|> and a student for which it is a turn marker
    (a base model's ChatML): the teacher reads it as its own control token, whose table spells
    nothing (a document's end), so the end of every answer paired with nothing and the run was
    refused for a share the teacher had in fact read (86.7 %)."""
    from lightning_kd.data.chat_tokens import encode_chat
    from tests.unit.data.test_encoding import MARKERS, chatml_tokenizer, conversation

    student = chatml_tokenizer()
    teacher = sentencepiece_tokenizer()
    teacher.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": MARKERS})
    example = encode_chat(student, conversation("Name a prime."), "row 0")
    ids, labels = example.tokens.unsqueeze(0), example.labels.unsqueeze(0)
    view = Aligner(student, teacher).view(ids, labels=labels)
    assert view.share == 1.0
    read = view.input_ids[0].tolist()
    assert read.count(teacher.eos_token_id) == 3  # every turn's end, read as the teacher's own
    end = student.convert_tokens_to_ids("<|im_end|>")
    answer_end = [i for i, t in enumerate(ids[0].tolist()) if t == end][-1]
    assert view.partner[0, answer_end - 1] >= 0  # the position predicting the answer's end
