"""Matching the teacher's spelling of a text to the student's bytes (``data/spelling.py``)."""

from __future__ import annotations

import difflib
import random
import unicodedata

import pytest

from lightning_kd.data.spelling import WINDOW, chunks, spelled_offsets


def test_spelled_offsets_maps_shared_runs():
    mapping = spelled_offsets(b"a fish", b" a fish")  # a dummy-prefix space
    assert mapping == [-1, 0, 1, 2, 3, 4, 5, 6]
    # A rewritten byte right after a shared run maps where that run ends (a token may start
    # there): the offsets agree though the bytes do not, so data/alignment.spelled_at compares
    # a token's bytes before pairing it.
    assert spelled_offsets(b"see The end", b"see the end") == list(range(12))


def byte_level_offsets(original: bytes, spelled: bytes) -> list[int]:
    """The reference: one ``difflib`` pass over the two byte strings (quadratic in length)."""
    mapping = [-1] * (len(spelled) + 1)
    matcher = difflib.SequenceMatcher(None, original, spelled, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        mapping[b : b + size + 1] = range(a, a + size + 1)
    return mapping


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda text: unicodedata.normalize("NFC", text),  # a normaliser composing accents
        lambda text: " " + text,  # a dummy-prefix space
        str.upper,  # rewritten throughout, in step
    ],
)
def test_spelled_offsets_in_chunks_agree_with_one_byte_level_pass(rewrite):
    rng = random.Random(0)
    words = ["the", "quick", "fox", "a", "dog", "cafe\u0301", "nai\u0308ve", "日本語", "ﬁn", "\n"]
    text = " ".join(rng.choice(words) for _ in range(700))  # > WINDOW: upper case in windows
    original, spelled = text.encode(), rewrite(text).encode()
    assert original != spelled
    assert spelled_offsets(original, spelled) == byte_level_offsets(original, spelled)


def test_a_text_rewritten_throughout_is_matched_in_windows():
    rng = random.Random(1)
    words = ["the", "quick", "brown", "fox", "jumps", "a", "dog"]
    text = " ".join(rng.choice(words) for _ in range(1200))
    original, spelled = text.encode(), text.upper().encode()
    assert len(original) > 2 * WINDOW and not set(chunks(original)) & set(chunks(spelled))
    mapping = spelled_offsets(original, spelled)
    # Only the spaces are shared, each with itself, and a token may start on either side of one.
    spaces = [at for at, byte in enumerate(original) if byte == ord(" ")]
    assert sum(at >= 0 for at in mapping) == 2 * len(spaces) + 1  # and both ends
    assert all(mapping[at] == at and mapping[at + 1] == at + 1 for at in spaces)


def test_chunks_join_back_and_cut_where_the_text_says():
    text = "Ein Fluß, 日本語のテキスト\n\tand code: f(x) = x @ 0x50".encode()
    assert b"".join(chunks(text)) == text
    assert all(chunks(text))
    # A byte inserted early moves no later cut: the chunks after it are the same.
    assert chunks(b"X" + text)[-5:] == chunks(text)[-5:]
