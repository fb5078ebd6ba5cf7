"""Which token of the student's vocabulary stands for each of the teacher's: the maps the
cross-tokenizer loss reads the teacher's top k through (``losses/cross_vocab.py``).

- :func:`vocabulary_map`: one to one, by identical bytes (the hybrid loss's matched tokens);
- :func:`first_token_map`: many to one, the student token a teacher token's text starts with.

Control tokens map by their content (:func:`control_twins`: ``<|im_start|>`` in both is one
marker), the teacher's document end to the student's where no content says otherwise. Where the
teacher's end *is* a control the student has for something else — an instruct teacher's EOS
``<|im_end|>``, a base student's turn marker — its mass means the student's turn marker at a
turn's end and the student's end at a document's end: both maps then end in one extra entry,
for the teacher's end at positions whose next student token is the student's end
(:func:`end_column`, read by ``CrossTokenizer.mapped``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.encoding import text_ids
from lightning_kd.data.token_bytes import TokenBytes


def vocabulary_map(student: TokenBytes, teacher: TokenBytes, teacher_size: int) -> Tensor:
    """``[teacher_size]``: the student id spelling the same bytes as each teacher id, or −1.

    One to one: where several ids of either side spell the same bytes, the one its tokenizer
    emits stands for them (a regular piece before a byte-fallback piece); control tokens by content
    (:func:`control_twins`), the others (padding, markers the student lacks) to nothing; with
    :func:`end_column`, one extra entry.
    """
    by_bytes = text_pieces(student)
    mapping = torch.full((teacher_size,), -1, dtype=torch.long)
    order = sorted(range(len(teacher.pieces)), key=lambda i: i in teacher.byte_pieces)
    controls = control_twins(student, teacher, teacher_size)
    taken = set(controls.values())
    for index in order:
        if index >= teacher_size or index in teacher.specials:
            continue
        target = by_bytes.get(teacher.pieces[index]) if teacher.pieces[index] else None
        if target is not None and target not in taken:
            mapping[index] = target
            taken.add(target)
    return _with_controls(mapping, controls, end_column(student, teacher, controls))


def text_pieces(tokenizer: TokenBytes) -> dict[bytes, int]:
    """Each text piece's bytes → its id (of several spelling the same bytes, a regular piece
    before a byte-fallback one, then the lowest id); control tokens left out."""
    order = sorted(range(len(tokenizer.pieces)), key=lambda i: i in tokenizer.byte_pieces)
    found: dict[bytes, int] = {}
    for index in order:
        piece = tokenizer.pieces[index]
        if piece and index not in tokenizer.specials:
            found.setdefault(piece, index)
    return found


def fragment_twin(piece: bytes, by_bytes: dict[bytes, int]) -> int:
    """The id of the longest piece of ``by_bytes`` (:func:`text_pieces`) that ``piece`` starts
    with, or −1: its twin where the student has one (byte-level BPE's "âĢ", bytes E2 80, went to
    "â", E2, so identical tokenizers' projection was not the same-tokenizer loss: probe 42),
    else its first byte's piece or a longer one."""
    for end in range(len(piece), 0, -1):
        if piece[:end] in by_bytes:
            return by_bytes[piece[:end]]
    return -1


def control_twins(student: TokenBytes, teacher: TokenBytes, teacher_size: int) -> dict[int, int]:
    """Teacher control id → the student control id of the same content (one to one), and the
    teacher's end → the student's end where neither has a twin by content."""
    by_content: dict[bytes, int] = {}
    for index, content in sorted(student.controls.items()):
        by_content.setdefault(content, index)
    found = {
        index: by_content[content]
        for index, content in teacher.controls.items()
        if index < teacher_size and content in by_content
    }
    end, own = teacher.end, student.end
    free = own is not None and own not in found.values()
    if free and end is not None and end < teacher_size and end not in found:
        found[end] = own
    return found


def end_column(student: TokenBytes, teacher: TokenBytes, controls: dict[int, int]) -> int | None:
    """The student's end, where the teacher's end is the twin (in ``controls``,
    :func:`control_twins`) of another student control and the student's end of nothing: the
    map's extra entry (after the teacher's ids), which ``CrossTokenizer.mapped`` puts for the
    teacher's end before a student document end."""
    if teacher.end is None or student.end is None or teacher.end not in controls:
        return None
    if controls[teacher.end] == student.end or student.end in controls.values():
        return None
    return student.end


def _with_controls(mapping: Tensor, controls: dict[int, int], end: int | None) -> Tensor:
    """``mapping`` with the control twins set, and one more entry, ``end``, where there is one."""
    for index, target in controls.items():
        mapping[index] = target
    if end is None:
        return mapping
    return torch.cat([mapping, torch.tensor([end], dtype=mapping.dtype)])


def first_token_map(
    student_tokenizer: PreTrainedTokenizerBase,
    student: TokenBytes,
    teacher: TokenBytes,
    teacher_size: int,
) -> Tensor:
    """``[teacher_size]``: for each teacher id, the student id the student's tokenizer starts
    that token's text with (many to one), or −1; a piece that is not whole UTF-8 (a byte piece,
    or a byte-level BPE's fragment of a character) goes to the student's longest piece it starts
    with (:func:`fragment_twin`); control tokens as in :func:`vocabulary_map`."""
    by_bytes = text_pieces(student)
    mapping = torch.full((teacher_size,), -1, dtype=torch.long)
    texts, indices = [], []
    for index, piece in enumerate(teacher.pieces[:teacher_size]):
        if not piece or index in teacher.specials:
            continue
        try:
            texts.append(piece.decode("utf-8"))
            indices.append(index)
        except UnicodeDecodeError:
            mapping[index] = fragment_twin(piece, by_bytes)
    encoded = text_ids(student_tokenizer, texts)
    for index, ids in zip(indices, encoded, strict=True):
        mapping[index] = ids[0] if ids else -1
    controls = control_twins(student, teacher, teacher_size)
    return _with_controls(mapping, controls, end_column(student, teacher, controls))
