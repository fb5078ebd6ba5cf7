"""The teacher's tokenisation of a student batch, and which positions of the two predict alike.

A student row is decoded to bytes through its :class:`~lightning_kd.data.token_bytes.TokenBytes`
(exactly: each id is a run of the text's bytes), cut at its document boundaries (EOS), and each
piece of text is tokenised by the teacher, which gets its own BOS before a document (if its
tokenizer adds one) and its own EOS where the student's was. Both rows then live in one byte
coordinate, and a student position and a teacher position are **aligned** when the tokens they
predict start at the same byte (or are both the document's end): the two models have read the same
text and predict what follows it, so their next-token distributions can be compared. A position
whose next token starts inside one of the other side's tokens has no partner.

The teacher's text should spell the student's bytes back. Where it does not — a normaliser that
rewrites characters, a dummy-prefix space, bytes an UTF-8 cut left at a block's edge — the two
byte strings are matched (``data/spelling.py``) and only boundaries inside matched runs align;
:attr:`TeacherView.share` is the share of the student's text bytes the teacher spelled back, which
the run checks before step 0 (``distill.cross_min_aligned``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.encoding import marked_ids, special_strings, text_ids
from lightning_kd.data.spelling import spelled_offsets, utf8_window
from lightning_kd.data.token_bytes import TokenBytes, token_bytes

RULE = 3
"""Which positions pair, as a number a cross-tokenizer cache records (``cache/format.py``):
raised whenever a change pairs other positions. 3: the teacher reads special-token strings in the
text as text, and a marker it shares with the student as its own control token, paired as its
string; 2: only teacher tokens whose bytes are the text's pair (1 paired a token whose first byte
the teacher rewrote, a lower-cased capital)."""
END = "end"
TEXT = "text"
IGNORE_INDEX = -100


@dataclass
class TeacherView:
    """A student batch as the teacher reads it, and the positions both predict alike."""

    input_ids: Tensor
    """``[batch, teacher_seq]``: the teacher's ids (right-padded)."""
    attention_mask: Tensor
    """``[batch, teacher_seq]``: 1 on the teacher's tokens, 0 on padding."""
    partner: Tensor
    """``[batch, seq]``: for student position i (predicting token i + 1), the index j of the
    teacher position predicting the same next text, or −1."""
    scored: Tensor
    """``[batch, teacher_seq]``: teacher positions whose next token lies in the text the student
    is scored on (its labels): what the teacher's own bits per byte count."""
    target_bytes: Tensor
    """``[batch, teacher_seq]``: the byte length of each teacher position's next token."""
    text_bytes: int
    """Bytes of text in the student rows."""
    matched_bytes: int
    """Of those, the bytes the teacher's tokenisation spelled back."""

    @property
    def share(self) -> float:
        """The share of the student's text the teacher's tokens spell back (1.0 for no text)."""
        return self.matched_bytes / self.text_bytes if self.text_bytes else 1.0


@dataclass
class _Segment:
    start: int
    """Byte offset of the segment in its row."""
    data: bytes
    markers: list[tuple[int, int]] = field(default_factory=list)
    """``[start, stop)`` in ``data`` of each of the student's control tokens (chat markers)."""


class Aligner:
    """Re-tokenises student batches for the teacher and pairs their positions."""

    def __init__(self, student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> None:
        self.student_tokenizer, self.teacher_tokenizer = student, teacher
        self.student: TokenBytes = token_bytes(student, "student")
        self.teacher: TokenBytes = token_bytes(teacher, "teacher")
        self.student_lengths = self.student.lengths()
        # Inside a text, a teacher control token can only be a marker it shares with the student
        # (text is read with special-token strings spelled out): its string is that text, even
        # for the teacher's document boundary (an instruct teacher's EOS <|im_end|>, a base
        # student's turn marker), which spells nothing where it ends a document.
        controls = {
            index: token.content.encode() for index, token in teacher.added_tokens_decoder.items()
        }
        self.teacher_pieces = [
            piece or controls.get(index, b"") for index, piece in enumerate(self.teacher.pieces)
        ]
        self.teacher_lengths = np.array([len(piece) for piece in self.teacher_pieces])
        pad = teacher.pad_token_id
        self.teacher_pad = pad if pad is not None else (self.teacher.end or 0)
        self.teacher_controls = {string.encode() for string in special_strings(teacher)}

    # -------------------------------------------------------------------- the student's side

    def student_row(self, ids: list[int], attended: list[int]) -> tuple[list, list[_Segment]]:
        """Each student token's key (``(kind, byte)`` or None) and the row's text segments,
        with ``None`` in the segment list where a document ends."""
        keys: list[tuple[str, int] | None] = []
        events: list = []
        position, current = 0, None
        for token, on in zip(ids, attended, strict=True):
            if not on:
                keys.append(None)
                continue
            if token in self.student.boundaries:
                current = None
                if token == self.student.end:
                    keys.append((END, position))
                    events.append(None)
                else:
                    keys.append(None)  # a BOS: nothing predicts it, it predicts like a start
                continue
            piece = self.student.pieces[token] if token < len(self.student) else b""
            keys.append((TEXT, position) if piece else None)
            if current is None:
                current = _Segment(position, b"")
                events.append(current)
            if token in self.student.specials:
                current.markers.append((len(current.data), len(current.data) + len(piece)))
            current.data += piece
            position += len(piece)
        return keys, events

    # -------------------------------------------------------------------- the teacher's side

    def teacher_rows(self, rows: list[list]) -> tuple[list[list[int]], list[list], int, int]:
        """The teacher's ids of each row, each token's key, the bytes of text it read and those
        it spelled back. Stray bytes a block's cut left of a character are no text to spell:
        counted, they kept CJK text at 97.5 % under distill.cross_min_aligned=1 (probe 39)."""
        segments = [event for events in rows for event in events if event is not None]
        windows = [utf8_window(segment.data) for segment in segments]
        text_bytes = sum(hi - lo for lo, hi in windows)
        encoded = self.teacher_ids(segments, windows)
        # The rows' segments come back in the order they were collected.
        tokenised = iter(zip(windows, encoded, strict=True))
        all_ids, all_keys, matched = [], [], 0
        for events in rows:
            ids, keys, end_at = [], [], 0
            for event in events:
                if event is None:
                    ids.append(self.teacher.end if self.teacher.end is not None else 0)
                    keys.append((END, end_at))
                    continue
                ids.extend(self.teacher.prefix)
                keys.extend([None] * len(self.teacher.prefix))
                (lo, hi), tokens = next(tokenised)
                pieces = [self.teacher_pieces[t] if t < len(self.teacher) else b"" for t in tokens]
                text = event.data[lo:hi]
                mapping = spelled_offsets(text, b"".join(pieces))
                offset = 0
                for token, piece in zip(tokens, pieces, strict=True):
                    start = spelled_at(text, piece, mapping[offset])
                    ids.append(token)
                    keys.append((TEXT, event.start + lo + start) if start >= 0 else None)
                    matched += len(piece) if start >= 0 else 0
                    offset += len(piece)
                end_at = event.start + len(event.data)
            all_ids.append(ids)
            all_keys.append(keys)
        return all_ids, all_keys, text_bytes, matched

    def teacher_ids(self, segments: list[_Segment], windows: list[tuple[int, int]]) -> list:
        """Each segment's text (its window) as the teacher's ids: special-token strings spelled
        out, except the student's control tokens that the teacher has too (ChatML markers both
        read), which stay the teacher's control tokens."""
        texts, controls = [], {}
        for number, (segment, (lo, hi)) in enumerate(zip(segments, windows, strict=True)):
            texts.append(segment.data[lo:hi].decode("utf-8", errors="replace"))
            shared = [
                (start - lo, stop - lo)
                for start, stop in segment.markers
                if lo <= start and stop <= hi and segment.data[start:stop] in self.teacher_controls
            ]
            if shared:
                controls[number] = shared
        encoded = text_ids(self.teacher_tokenizer, texts)
        for number, shared in controls.items():
            lo, hi = windows[number]
            encoded[number] = marked_ids(
                self.teacher_tokenizer, segments[number].data[lo:hi], shared
            )
        return encoded

    # -------------------------------------------------------------------- the pairing

    def view(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None
    ) -> TeacherView:
        """The teacher's view of the student batch ``input_ids`` ``[batch, seq]``."""
        batch, seq = input_ids.shape
        ids = input_ids.tolist()
        attended = attention_mask.tolist() if attention_mask is not None else [[1] * seq] * batch
        student = [self.student_row(row, on) for row, on in zip(ids, attended, strict=True)]
        rows = [events for _, events in student]
        teacher_ids, teacher_keys, text_bytes, matched = self.teacher_rows(rows)
        width = max(1, max(len(row) for row in teacher_ids))
        out_ids = torch.full((batch, width), self.teacher_pad, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        partner = torch.full((batch, seq), -1, dtype=torch.long)
        scored = torch.zeros((batch, width), dtype=torch.bool)
        target_bytes = torch.zeros((batch, width), dtype=torch.long)
        label_rows = labels if labels is not None else input_ids
        targets = label_rows[:, 1:].numpy() != IGNORE_INDEX
        next_lengths = self.student_lengths[input_ids[:, 1:].clamp(0, len(self.student) - 1)]
        for row, ((keys, _), t_ids, t_keys) in enumerate(
            zip(student, teacher_ids, teacher_keys, strict=True)
        ):
            out_ids[row, : len(t_ids)] = torch.tensor(t_ids, dtype=torch.long)
            mask[row, : len(t_ids)] = 1
            # Position i predicts token i + 1: its key, if that token is text or an end and is
            # scored (not a masked label).
            wanted = key_codes(keys[1:])
            wanted[~targets[row]] = -1
            t_codes = key_codes(t_keys)
            partner[row, : seq - 1] = torch.from_numpy(partners(wanted, t_codes))
            spans = target_spans(wanted, next_lengths[row].numpy())
            t_lengths = self.teacher_lengths[
                np.asarray(t_ids[1:], dtype=np.int64).clip(0, len(self.teacher) - 1)
            ]
            row_scored, row_bytes = teacher_targets(t_codes[1:], t_lengths, *spans)
            scored[row, : len(t_ids) - 1] = torch.from_numpy(row_scored)
            target_bytes[row, : len(t_ids) - 1] = torch.from_numpy(row_bytes)
        return TeacherView(out_ids, mask, partner, scored, target_bytes, text_bytes, matched)


def spelled_at(text: bytes, piece: bytes, start: int) -> int:
    """``start``, the byte of ``text`` a teacher token's spelling maps to, if the token spells
    ``text``'s bytes there exactly; else −1. A token whose first byte the teacher rewrote or
    inserted (a lower-cased capital, a dummy-prefix space) maps to the byte after the last
    shared run all the same, yet predicts other text than the student's there: it pairs with
    nothing, and its bytes do not count as spelled back."""
    if piece and start >= 0 and text[start : start + len(piece)] == piece:
        return start
    return -1


def key_codes(keys: list[tuple[str, int] | None]) -> np.ndarray:
    """Each key as one integer, ``2 · byte + 1`` for an end and ``2 · byte`` for text; −1 for
    None (a token with no text, padding)."""
    return np.fromiter(
        (-1 if key is None else 2 * key[1] + (key[0] == END) for key in keys),
        dtype=np.int64,
        count=len(keys),
    )


def partners(wanted: np.ndarray, t_codes: np.ndarray) -> np.ndarray:
    """For each wanted key, the teacher position before the last teacher token with that key
    (the position that predicts it), or −1; the teacher's first token has no predictor."""
    found = np.full(len(wanted), -1, dtype=np.int64)
    have = np.flatnonzero(t_codes[1:] >= 0) + 1
    if not len(have):
        return found
    order = np.argsort(t_codes[have], kind="stable")  # equal keys keep their order: last wins
    codes, at = t_codes[have][order], have[order]
    index = np.searchsorted(codes, wanted, side="right") - 1
    hit = (wanted >= 0) & (index >= 0) & (codes[index.clip(0)] == wanted)
    found[hit] = at[index[hit]] - 1
    return found


def target_spans(wanted: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes ``[start, stop)`` each scored student target covers (an end: ``[at, at]``)."""
    keep = wanted >= 0
    codes = wanted[keep]
    starts = codes >> 1
    return starts, np.where(codes & 1, starts, starts + lengths[keep])


def teacher_targets(
    t_next: np.ndarray, t_lengths: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each teacher position, whether its next token (key ``t_next``) starts inside a
    scored student target (an end: at a scored end), and that token's byte count (text only)."""
    text, end = (t_next >= 0) & (t_next & 1 == 0), (t_next >= 0) & (t_next & 1 == 1)
    at = t_next >> 1
    size = int(stops.max()) if len(stops) else 0
    depth = np.zeros(size + 1, dtype=np.int64)
    np.add.at(depth, starts, 1)
    np.add.at(depth, stops, -1)
    covered = np.cumsum(depth)[:size] > 0
    inside = text & (at < size) & covered[at.clip(0, max(size - 1, 0))] if size else text & False
    at_end = end & np.isin(at, starts[starts == stops])
    return inside | at_end, np.where(text, t_lengths, 0)
