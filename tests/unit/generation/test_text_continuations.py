"""Sequence-level KD on text: the teacher continues the start of training documents only, the rows
are text any tokenizer reads back, a stopped generation resumes, and a base teacher (no chat
template, a BOS of its own) is served."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.chat_tokens import PLAIN_TEMPLATE
from lightning_kd.data.text import TextDataModule
from lightning_kd.generation.completions_record import CompletionsMismatch, record_path
from lightning_kd.generation.teacher_completions import GenerateSpec
from lightning_kd.generation.text_continuations import (
    continuations,
    document_prefix,
    text_prompt_ids,
)
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.generate import generate
from lightning_kd.models.loading import TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.utils.refusal import Refused, messages
from tests.conftest import TINY_LLAMA, sentencepiece_tokenizer
from tests.unit.data.test_chat import CHATML

WORDS = ["quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "pack", "my", "box"]


@pytest.fixture(scope="module")
def teacher():
    return load_teacher(TeacherSpec(path=None, config=dict(TINY_LLAMA)), "32-true")


def write_documents(path: Path, count: int = 30) -> Path:
    """``count`` distinct documents of 40 to 120 characters, one a line."""
    rows = []
    for i in range(count):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(4 + (i * 7) % 15)]
        rows.append({"text": f"Document {i}: " + " ".join(words) + "."})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config(out: Path, documents: Path, *overrides: str):
    common = [
        "debug=smoke",
        f"data.files=[{documents}]",
        "data.block_size=64",
        "data.val_fraction=0.1",
        "generate.prompts=train_split",
        "generate.prefix_chars=24",
        "generate.max_new_tokens=6",
        "generate.batch_size=4",
    ]
    return compose_config([*common, *overrides], output_dir=out)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def held_out_documents(documents: list[str], data: TextDataModule) -> set[int]:
    """The documents a validation block holds a byte of, found by content: the packed stream cut
    into blocks, each block compared with the validation examples."""
    stream, owner = [], []
    for index, text in enumerate(documents):
        tokens = data.tokenizer(text, add_special_tokens=False)["input_ids"]
        stream += [*tokens, data.tokenizer.eos_token_id]
        owner += [index] * len(tokens) + [None]
    size = data.block_size
    held = {tuple(example.tolist()) for example in data.val_examples}
    return {
        owner[position]
        for start in range(0, len(stream) - size + 1, size)
        if tuple(stream[start : start + size]) in held
        for position in range(start, start + size)
        if owner[position] is not None
    }


def test_text_prompts_are_the_start_of_training_documents_only(teacher, tmp_path, capsys):
    """Every document no validation block touches is continued once, from its first words; no
    document with a byte in validation is a prompt; the rows are text data=text reads. A
    continuation cut off at generate.max_new_tokens is marked, and the line counting them says
    what data=text makes of it."""
    documents = write_documents(tmp_path / "docs.jsonl")
    texts = [json.loads(line)["text"] for line in documents.read_text().splitlines()]
    out = generate(config(tmp_path / "g", documents), teacher, byte_tokenizer())
    cut = sum(row.get("finished") is False for row in rows(out))
    assert cut > 0, "the tiny random teacher runs to its budget"
    assert re.search(
        rf"{cut} of {len(rows(out))} continuations reached generate.max_new_tokens=\d+ .* "
        "data=text scores its text but not the document separator packed after it",
        capsys.readouterr().out,
    )
    data = TextDataModule(byte_tokenizer(), files=[str(documents)], block_size=64, val_fraction=0.1)
    data.setup()
    held = held_out_documents(texts, data)
    written = rows(out)
    lines = [int(row["prompt_line"].rsplit(":", 1)[1]) - 1 for row in written]
    assert 0 < len(held) < len(texts) // 2
    assert sorted(lines) == [i for i in range(len(texts)) if i not in held]
    for row, line in zip(written, lines, strict=True):
        prefix = document_prefix(texts[line], 24)
        assert texts[line].startswith(prefix) and len(prefix) <= 24
        assert row["text"].startswith(prefix) and len(row["text"]) > len(prefix)
    assert lines != sorted(lines)  # a seeded order: a cap samples both ends of the files
    capped = generate(
        config(tmp_path / "c", documents, "generate.max_prompts=3"), teacher, byte_tokenizer()
    )
    assert rows(capped) == written[:3]
    read = TextDataModule(sentencepiece_tokenizer(), files=[str(out)], block_size=16)
    read.setup()  # another tokenizer reads the rows back as text
    assert read.train_examples
    (where, _), *_ = TextDataModule(byte_tokenizer()).training_documents()
    assert re.fullmatch(r"(python_reference|smollm2_generated):\d+", where)  # any install's name


def test_a_stopped_text_generation_resumes_to_the_uninterrupted_file(teacher, tmp_path) -> None:
    documents = write_documents(tmp_path / "docs.jsonl")
    sampled = ["generate.do_sample=true", "generate.temperature=1.5"]
    whole = generate(config(tmp_path / "a", documents, *sampled), teacher, byte_tokenizer())
    expected = whole.read_text()
    stopped = tmp_path / "b" / "completions.jsonl"
    stopped.parent.mkdir()
    lines = expected.splitlines(keepends=True)
    stopped.write_text("".join(lines[:5]) + lines[5][:10])  # mid-batch, a torn last row
    shutil.copy(record_path(whole), record_path(stopped))
    resumed = generate(config(tmp_path / "b", documents, *sampled), teacher, byte_tokenizer())
    assert resumed.read_text() == expected
    shorter = config(tmp_path / "b", documents, *sampled, "generate.prefix_chars=12")
    with pytest.raises(CompletionsMismatch, match=r"generate.prefix_chars: the file's 24"):
        generate(shorter, teacher, byte_tokenizer())
    fewer = config(tmp_path / "b", documents, *sampled, "generate.max_prompts=2")
    with pytest.raises(ValueError, match=r"more than the 2 prompts .*raise generate.max_prompts"):
        generate(fewer, teacher, byte_tokenizer())


def test_a_larger_max_prompts_continues_the_file(teacher, tmp_path) -> None:
    """A capped generation rerun with a larger cap (or none) answers the same prompts in the
    same order, and goes on (greedy: the file an uncapped run writes)."""
    documents = write_documents(tmp_path / "docs.jsonl")
    whole = generate(config(tmp_path / "a", documents), teacher, byte_tokenizer()).read_text()
    capped = config(tmp_path / "b", documents, "generate.max_prompts=7")
    assert len(rows(generate(capped, teacher, byte_tokenizer()))) == 7
    resumed = generate(config(tmp_path / "b", documents), teacher, byte_tokenizer())
    assert resumed.read_text() == whole


def test_a_document_start_ends_a_word_and_its_continuation_keeps_the_joining_space() -> None:
    assert document_prefix("The quick brown fox", 12) == "The quick"
    assert document_prefix("The quick brown fox", 9) == "The quick"  # a space follows
    assert document_prefix("Supercalifragilistic day", 5) == "Super"  # one long word: cut
    assert document_prefix("Short.\n", 100) == "Short."
    with pytest.raises(ValueError, match=r"generate.prefix_chars=0: must be at least 1"):
        GenerateSpec(prefix_chars=0)
    tokenizer = sentencepiece_tokenizer()
    (prompt,) = text_prompt_ids(tokenizer, ["The quick"])
    assert prompt[0] == tokenizer.bos_token_id  # the BOS a SentencePiece teacher needs
    rest = tokenizer(" brown fox", add_special_tokens=False)["input_ids"]
    ends = [tokenizer.eos_token_id]
    new = torch.tensor([[*rest, tokenizer.eos_token_id, *rest]])  # what follows its EOS goes
    assert continuations(tokenizer, [prompt], new, ends) == [" brown fox"]


def test_a_base_teacher_and_a_bad_prompts_file_are_refused_at_once(teacher, tmp_path) -> None:
    """The missing template was said first, and the file's bad row only once it was set
    (probe 37): its rows are read without a template, so both are said together."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"nope": 1}) + "\n")
    cfg = config(tmp_path / "out", bad, f"generate.prompts={bad}")
    with pytest.raises(Refused, match=r"^2 values are refused:") as refused:
        generate(cfg, teacher, byte_tokenizer())
    first, second = messages(refused.value)
    assert first.startswith("generate.chat_template=null: the teacher's tokenizer has no chat")
    assert second.startswith(f"{bad}:1 has neither 'prompt' nor 'messages'")


def test_a_base_teacher_is_told_to_set_a_chat_template_or_given_plain(teacher, tmp_path) -> None:
    """Chat prompts for a teacher without a chat template: refused naming
    generate.chat_template; with generate.chat_template=plain its answers are written, and a
    student of another tokenizer trains on them through data.teacher_answers."""
    conversations = tmp_path / "chats.jsonl"
    chats = [{"prompt": f"Say {i}.", "completion": f"dataset {i}"} for i in range(8)]
    conversations.write_text("".join(json.dumps(row) + "\n" for row in chats))
    chat = ["data=chat", f"data.files=[{conversations}]", "data.val_fraction=0.25"]
    cfg = config(tmp_path / "refused", conversations, *chat)
    with pytest.raises(Refused, match=r"generate.chat_template=null.*generate.chat_template=plain"):
        generate(cfg, teacher, byte_tokenizer())
    # The run's own data.chat_template was there, unsaid (probe 44).
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    cfg = config(tmp_path / "told", conversations, *chat, f"data.chat_template={template}")
    with pytest.raises(Refused, match=f"which generate.chat_template={template} gives the teach"):
        generate(cfg, teacher, byte_tokenizer())
    tokenizer = sentencepiece_tokenizer()
    spec = TeacherSpec(path=None, config={**TINY_LLAMA, "vocab_size": len(tokenizer)})
    base = load_teacher(spec, "32-true")
    student = byte_tokenizer()
    student.chat_template = CHATML
    plain = config(tmp_path / "plain", conversations, *chat, "generate.chat_template=plain")
    out = generate(plain, base, tokenizer, student)
    assert tokenizer.chat_template == PLAIN_TEMPLATE
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi."}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<bos>User: Hi.\nAssistant:"
    answers = [row["messages"][-1]["content"] for row in rows(out)]
    assert len(answers) == 6 and not any("\nUser:" in answer for answer in answers)
    data = ChatDataModule(
        student, files=[str(conversations)], val_fraction=0.25, teacher_answers=str(out)
    )
    data.setup()  # the answers are text, encoded with the student's tokenizer
    decoded = [student.decode(example.tokens) for example in data.train_examples]
    assert all(answer in text for answer, text in zip(answers, decoded, strict=True))


def test_a_resume_whose_split_another_tokenizer_cuts_names_it(teacher, tmp_path) -> None:
    """The split's prompts are cut with the student's tokenizer (student.source's): continued
    without student.source, the resume was refused as answering "another prompt", with
    overwrite=true as the advice, which would have thrown the answers away (probe 32)."""
    documents = write_documents(tmp_path / "docs.jsonl")
    cfg = config(tmp_path / "g", documents)
    out = generate(cfg, teacher, byte_tokenizer(), data_tokenizer=byte_tokenizer())
    first = out.read_text().splitlines(keepends=True)[0]
    out.write_text(first)  # as a run stopped after one row leaves it
    with pytest.raises(CompletionsMismatch) as error:
        generate(cfg, teacher, byte_tokenizer(), data_tokenizer=sentencepiece_tokenizer())
    message = str(error.value)
    assert "prompts.split_tokenizer: the file's" in message and "student.source" in message
    assert "another prompt" not in message
    generate(cfg, teacher, byte_tokenizer(), data_tokenizer=byte_tokenizer())  # as begun: goes on
    assert out.read_text().startswith(first) and len(rows(out)) > 1
