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


def test_a_random_student_of_a_custom_code_teachers_config_is_built(tmp_path, monkeypatch) -> None:
    """student.config over a trust_remote_code teacher was refused as "model_type='ownllama' is
    not a transformers model type; did you mean ...?", a key the user never set (probe 45)."""
    from lightning_kd.models.loading import StudentSpec, TeacherSpec, load_teacher
    from lightning_kd.models.student import build_student
    from tests.unit.evaluation.test_evaluate import save_custom

    save_custom(tmp_path, monkeypatch)
    teacher = load_teacher(TeacherSpec(path=str(tmp_path / "own"), trust_remote_code=True))
    spec = StudentSpec(config={"num_hidden_layers": 1}, trust_remote_code=True)
    student = build_student(spec, teacher, "causal_lm").student
    assert type(student).__name__ == "OwnForCausalLM" and student.config.num_hidden_layers == 1
