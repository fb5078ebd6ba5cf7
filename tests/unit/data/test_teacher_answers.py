"""Sequence-level KD from a file: the training answers become the teacher's, validation keeps the
dataset's, and a file that does not answer every training prompt is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.conversations import prompt_of
from tests.unit.data.test_chat import chat_tokenizer, write_rows


def chats(tmp_path: Path) -> Path:
    rows = [{"prompt": f"Say {i}.", "completion": f"dataset {i}"} for i in range(8)]
    return write_rows(tmp_path / "c.jsonl", rows)


def answers_file(path: Path, conversations, answer=lambda i: f"teacher {i}") -> Path:
    rows = [
        {"messages": [*prompt_of(c.messages), {"role": "assistant", "content": answer(i)}]}
        for i, c in enumerate(conversations)
    ]
    return write_rows(path, rows)


def module(rows: Path, answers: Path | None = None) -> ChatDataModule:
    teacher_answers = None if answers is None else str(answers)
    return ChatDataModule(
        chat_tokenizer(), files=[str(rows)], val_fraction=0.25, teacher_answers=teacher_answers
    )


def decoded(data: ChatDataModule, examples) -> list[str]:
    return [data.tokenizer.decode(e.tokens) for e in examples]


def test_training_answers_are_the_teachers_and_validation_keeps_the_datasets(tmp_path) -> None:
    rows = chats(tmp_path)
    plain = module(rows)
    train, _ = plain.split()
    data = module(rows, answers_file(tmp_path / "a.jsonl", train))
    data.setup()
    plain.setup()
    assert decoded(data, data.val_examples) == decoded(plain, plain.val_examples)
    texts = decoded(data, data.train_examples)
    assert len(texts) == len(train) == 6
    for index, (text, chat) in enumerate(zip(texts, train, strict=True)):
        assert chat.messages[0]["content"] in text and "dataset" not in text
        assert f"<|im_start|>assistant\nteacher {index}<|im_end|>" in text
    # Only the teacher's answer is scored.
    for example, index in zip(data.train_examples, range(6), strict=True):
        scored = example.labels[example.labels != -100]
        assert data.tokenizer.decode(scored) == f"teacher {index}<|im_end|>\n"


def test_a_teacher_answer_cut_off_is_scored_without_its_end_of_turn(tmp_path) -> None:
    """An answer generate.max_new_tokens cut off ("finished": false) is trained on its text;
    the end of turn the template closes it with is not scored (it was: the student was taught
    to stop mid-sentence where the teacher's budget ran out)."""
    rows = chats(tmp_path)
    train, _ = module(rows).split()
    answers = answers_file(tmp_path / "a.jsonl", train)
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    lines[0]["messages"][-1]["finished"] = False  # as generate writes a cut answer
    write_rows(answers, lines)
    data = module(rows, answers)
    data.setup()
    scored = [e.labels[e.labels != -100] for e in data.train_examples]
    assert data.tokenizer.decode(scored[0]) == "teacher 0"
    assert data.tokenizer.decode(scored[1]) == "teacher 1<|im_end|>\n"


@pytest.mark.integration  # runs the command line in a subprocess
def test_a_file_missing_a_training_prompt_is_refused_with_the_command(tmp_path) -> None:
    rows = chats(tmp_path)
    train, val = module(rows).split()
    partial = answers_file(tmp_path / "a.jsonl", train[:-1] + val)  # answers held-out ones too
    with pytest.raises(ValueError, match=r"answers 5 of the 6 training prompts \(1 missing.*"):
        module(rows, partial).setup()
    with pytest.raises(FileNotFoundError, match=r"generate.prompts=train_split"):
        module(rows, tmp_path / "none.jsonl").setup()


def test_bad_answer_rows_are_named(tmp_path) -> None:
    rows = chats(tmp_path)
    train, _ = module(rows).split()
    twice = answers_file(tmp_path / "twice.jsonl", train + train[:1], lambda i: f"t{i}")
    asked_once = r"twice.jsonl:1, .*twice.jsonl:7 answer one prompt 2 times, differently, and the "
    with pytest.raises(ValueError, match=asked_once + r"training data asks it 1 time\(s\)"):
        module(rows, twice).setup()
    unanswered = write_rows(tmp_path / "u.jsonl", [{"messages": train[0].messages[:1]}])
    with pytest.raises(ValueError, match=r"u.jsonl:1: a teacher answer row is the prompt"):
        module(rows, unanswered).setup()
    # generate's rows on data=text: named as such (it said a conversation is a list of messages)
    text = write_rows(tmp_path / "t.jsonl", [{"text": "a b", "prompt_line": "x:1"}])
    with pytest.raises(ValueError, match=r"t.jsonl:1 is a text continuation .* data=text"):
        module(rows, text).setup()
    same = answers_file(tmp_path / "same.jsonl", train + train[:1], lambda i: "t")
    module(rows, same).setup()  # the same answer twice is one answer
    assert json.loads(same.read_text().splitlines()[0])["messages"][-1]["content"] == "t"


def test_a_resume_names_an_edited_answers_file_or_template_file(tmp_path) -> None:
    """Either edited was refused as "the same files and settings give other examples (another
    tokenizer ...)", naming neither (probe 55)."""
    from lightning_kd.data.provenance import data_differences
    from tests.unit.data.test_chat import CHATML

    rows = chats(tmp_path)
    train, _ = module(rows).split()
    answers = answers_file(tmp_path / "a.jsonl", train)
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)

    def record() -> dict:
        data = ChatDataModule(
            chat_tokenizer(None),
            files=[str(rows)],
            val_fraction=0.25,
            teacher_answers=str(answers),
            chat_template=str(template),
        )
        data.setup()
        return data.provenance()

    saved = record()
    assert data_differences(saved, record()) == []
    answers_file(answers, train, answer=lambda i: f"another {i}")
    assert data_differences(saved, record()) == [f"data.teacher_answers: edited ['{answers}']"]
    answers_file(answers, train)
    template.write_text(CHATML.replace("<|im_start|>", "<|start|>"))
    assert data_differences(saved, record()) == [f"data.chat_template: edited ['{template}']"]
