"""Which tokenizers a student shares with its teacher (models/student.py)."""

from __future__ import annotations


def test_a_tokenizer_of_the_same_vocabulary_that_splits_otherwise_is_another() -> None:
    """A lower-casing tokenizer of the student's vocabulary took the same-tokenizer path and
    read the student's ids ("Hello") as its own, which its text gives as "hello" (probe 32)."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from lightning_kd.models.loading import byte_tokenizer
    from lightning_kd.models.student import how_tokenizers_differ, same_tokenizer

    student = byte_tokenizer()
    definition = json.loads(student.backend_tokenizer.to_str())
    definition["normalizer"] = {"type": "Lowercase"}
    lower = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(definition)))
    assert lower.get_vocab() == student.get_vocab()
    assert not same_tokenizer(student, lower)
    assert same_tokenizer(student, byte_tokenizer())  # the same definition, another object
    # Said where the run goes across tokenizers: two of one vocabulary gave no reason (probe 45).
    assert how_tokenizers_differ(lower, student).startswith("the same vocabulary, split otherwise")
    from tests.conftest import byte_level_bpe

    assert how_tokenizers_differ(byte_level_bpe(), student) == "another vocabulary"
