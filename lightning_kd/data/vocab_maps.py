"""Which token of the student's vocabulary stands for each of the teacher's: the maps the
cross-tokenizer loss reads the teacher's top k through (``losses/cross_vocab.py``).

- :func:`vocabulary_map`: one to one, by identical bytes (the hybrid loss's matched tokens);
- :func:`first_token_map`: many to one, the student token a teacher token's text starts with.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.encoding import text_ids
from lightning_kd.data.token_bytes import TokenBytes


def vocabulary_map(student: TokenBytes, teacher: TokenBytes, teacher_size: int) -> Tensor:
    """``[teacher_size]``: the student id spelling the same bytes as each teacher id, or −1.

    One to one: where several teacher ids spell the same bytes, the one its tokenizer emits wins
    (a regular piece before a byte-fallback piece); the document ends map to each other; the
    teacher's other special tokens (padding, chat markers) to nothing.
    """
    by_bytes: dict[bytes, int] = {}
    for index, piece in enumerate(student.pieces):
        if piece and piece not in by_bytes:
            by_bytes[piece] = index
    mapping = torch.full((teacher_size,), -1, dtype=torch.long)
    order = sorted(range(len(teacher.pieces)), key=lambda i: i in teacher.byte_pieces)
    taken = set()
    for index in order:
        if index >= teacher_size or index in teacher.specials:
            continue
        target = by_bytes.get(teacher.pieces[index]) if teacher.pieces[index] else None
        if target is not None and target not in taken:
            mapping[index] = target
            taken.add(target)
    if teacher.end is not None and student.end is not None and teacher.end < teacher_size:
        mapping[teacher.end] = student.end
    return mapping


def first_token_map(
    student_tokenizer: PreTrainedTokenizerBase,
    student: TokenBytes,
    teacher: TokenBytes,
    teacher_size: int,
) -> Tensor:
    """``[teacher_size]``: for each teacher id, the student id the student's tokenizer starts
    that token's text with (many to one), or −1 (special tokens); a piece that is not whole UTF-8
    (a byte piece) goes to the student's token for its first byte where there is one; the ends
    to each other."""
    single = {piece: index for index, piece in enumerate(student.pieces) if len(piece) == 1}
    mapping = torch.full((teacher_size,), -1, dtype=torch.long)
    texts, indices = [], []
    for index, piece in enumerate(teacher.pieces[:teacher_size]):
        if not piece or index in teacher.specials:
            continue
        try:
            texts.append(piece.decode("utf-8"))
            indices.append(index)
        except UnicodeDecodeError:
            mapping[index] = single.get(piece[:1], -1)
    encoded = text_ids(student_tokenizer, texts)
    for index, ids in zip(indices, encoded, strict=True):
        mapping[index] = ids[0] if ids else -1
    if teacher.end is not None and student.end is not None and teacher.end < teacher_size:
        mapping[teacher.end] = student.end
    return mapping
