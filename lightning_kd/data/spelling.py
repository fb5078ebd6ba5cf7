"""How a teacher's tokens spell the student's text back: the two byte strings matched, and the
UTF-8 window a block cut mid-character leaves (``data/alignment.py`` pairs positions by them).

A teacher's tokenisation need not spell the student's bytes back exactly — a normaliser that
rewrites characters, a dummy-prefix space — so :func:`spelled_offsets` maps each byte offset of
the teacher's spelling to the student's where the two agree.
"""

from __future__ import annotations

import difflib
import re


def utf8_window(data: bytes) -> tuple[int, int]:
    """``(lo, hi)``: the longest slice of ``data`` that starts and ends on whole UTF-8 characters
    (a block cut mid-character leaves up to three stray bytes at either edge)."""
    lo = 0
    while lo < min(len(data), 3) and data[lo] & 0xC0 == 0x80:
        lo += 1
    hi = len(data)
    for back in range(1, min(4, hi - lo) + 1):
        lead = data[hi - back]
        if lead & 0xC0 == 0x80:
            continue
        width = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4
        if width > back:
            hi -= back
        break
    return lo, max(lo, hi)


CUT_BYTES = rb"\s0@P`p\x80\x90\xa0\xb0"
"""Bytes after which :func:`chunks` cuts: ASCII whitespace, and bytes picked by value alone
(about one in eight characters of any script), so that a cut depends on the text around it and
not on its offset: an inserted or dropped byte moves no cut elsewhere."""

CHUNK = re.compile(rb"[^" + CUT_BYTES + rb"]*[" + CUT_BYTES + rb"]+|[^" + CUT_BYTES + rb"]+")

WINDOW = 256
"""A region of no matching chunk longer than this on either side is matched byte by byte in
windows of about this size, cut at the same share of each side (``difflib``'s cost grows with
the product of the two lengths): such a region is text the teacher rewrote throughout (lower
case, stripped spaces), whose two versions keep step."""


def chunks(data: bytes) -> list[bytes]:
    """``data`` cut after each of :data:`CUT_BYTES`' runs: pieces that join back to it."""
    return CHUNK.findall(data)


def spelled_offsets(original: bytes, spelled: bytes) -> list[int]:
    """Map each byte offset of ``spelled`` (0 .. len) to one of ``original`` (−1 where the two
    disagree). Identical strings map one to one.

    Matched in two passes — chunks first (:func:`chunks`), then byte by byte inside the regions
    where chunks differ — because one byte-level ``difflib`` pass over a long row costs time
    quadratic in its length even when the two differ in a few characters (seconds per 8k-token
    row for a teacher whose normaliser composes accents)."""
    if original == spelled:
        return list(range(len(spelled) + 1))
    mapping = [-1] * (len(spelled) + 1)
    a_chunks, b_chunks = chunks(original), chunks(spelled)
    a_at, b_at = offsets(a_chunks), offsets(b_chunks)
    matcher = difflib.SequenceMatcher(None, a_chunks, b_chunks, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        a0, a1, b0, b1 = a_at[i1], a_at[i2], b_at[j1], b_at[j2]
        if tag == "equal":
            match_run(mapping, a0, b0, a1 - a0)
        elif a1 > a0 and b1 > b0:
            match_region(mapping, original[a0:a1], spelled[b0:b1], a0, b0)
    mapping[len(spelled)] = len(original)  # both texts end together
    return mapping


def offsets(pieces: list[bytes]) -> list[int]:
    """The byte offset at which each of ``pieces`` starts, and their total length last."""
    at = [0]
    for piece in pieces:
        at.append(at[-1] + len(piece))
    return at


def match_run(mapping: list[int], a0: int, b0: int, size: int) -> None:
    """Map ``size`` shared bytes at ``b0`` to ``a0``, both ends included (a token may start
    right after the run)."""
    for offset in range(size + 1):
        mapping[b0 + offset] = a0 + offset


def match_region(mapping: list[int], a: bytes, b: bytes, a0: int, b0: int) -> None:
    """Map what ``a`` and ``b`` share byte by byte, in windows of :data:`WINDOW` bytes or so."""
    windows = -(-max(len(a), len(b)) // WINDOW)
    a_cuts = [len(a) * k // windows for k in range(windows + 1)]
    b_cuts = [len(b) * k // windows for k in range(windows + 1)]
    for k in range(windows):
        a_part, b_part = a[a_cuts[k] : a_cuts[k + 1]], b[b_cuts[k] : b_cuts[k + 1]]
        match_bytes(mapping, a_part, b_part, a0 + a_cuts[k], b0 + b_cuts[k])


def match_bytes(mapping: list[int], a: bytes, b: bytes, a0: int, b0: int) -> None:
    """Map the bytes ``a`` and ``b`` (at ``a0`` and ``b0``) share, byte by byte."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for i, j, size in matcher.get_matching_blocks():
        if size:
            match_run(mapping, a0 + i, b0 + j, size)
