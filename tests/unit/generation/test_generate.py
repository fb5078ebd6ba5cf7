"""The teacher's completions for sequence-level KD: batched = one at a time, resumable, readable
by ``data=chat``, bad input named."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from lightning_kd.cli import main as cli_main
from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.conversations import ChatFields
from lightning_kd.data.errors import DataError, MissingData
from lightning_kd.generation.completion_rows import answer_row, completed_rows
from lightning_kd.generation.completions_record import CompletionsMismatch, record_path
from lightning_kd.generation.teacher_completions import GenerateSpec, complete, prompt_messages
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.generate import generate
from lightning_kd.models.loading import TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.utils.refusal import Refused
from lightning_kd.utils.stopping import STOP, Interrupted
from tests.conftest import ROOT, TINY_LLAMA
from tests.unit.data.test_chat import CHATML


@pytest.fixture(scope="module")
def teacher():
    return load_teacher(TeacherSpec(path=None, config=dict(TINY_LLAMA)), "32-true")


def tokenizer():
    tok = byte_tokenizer()
    tok.chat_template = CHATML
    return tok


def write_prompts(path: Path, count: int) -> Path:
    rows = [{"prompt": "Say " + "more " * (i % 3) + f"{i}."} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config(tmp_path: Path, prompts: Path, *overrides: str):
    common = [
        "debug=smoke",
        f"generate.prompts={prompts}",
        "generate.max_new_tokens=6",
        "generate.batch_size=3",
    ]
    return compose_config([*common, *overrides], output_dir=tmp_path)


def test_batched_left_padded_completions_equal_one_at_a_time(teacher) -> None:
    prompts = [[{"role": "user", "content": text}] for text in ("Hi.", "A much longer prompt.")]
    spec = GenerateSpec(max_new_tokens=6)
    batched = complete(teacher, tokenizer(), prompts, spec, seed=0)
    alone = [complete(teacher, tokenizer(), [prompt], spec, seed=0)[0] for prompt in prompts]
    assert batched == alone and all(answer for answer, _ in batched)


def test_an_answer_that_ends_in_text_ends_there() -> None:
    """A template that closes an answer with markers the tokenizer reads as text: the
    teacher's answer ran on past them to generate.max_new_tokens, markers and invented turns
    kept in its text; it ends at the first, without it (plain's "User:" was the only one)."""
    prompts = [[{"role": "user", "content": "Hi."}]]
    spec = GenerateSpec(max_new_tokens=6)
    template = "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}"
    free = byte_tokenizer()
    free.chat_template = template + "{% endif %}{% endfor %}"
    wide = {**TINY_LLAMA, "tie_word_embeddings": False, "initializer_range": 0.5}
    letters = load_teacher(TeacherSpec(path=None, config=wide), "32-true")
    with torch.no_grad():  # it writes lowercase letters alone: one byte, one token each
        head = letters.get_output_embeddings().weight
        kept = free.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz"))
        head[[i for i in range(len(head)) if i not in kept]] = 0
    [(answer, ended)] = complete(letters, free, prompts, spec, seed=0)
    marker = answer[2:4]  # the prompt renders alike under both templates: the same answer
    assert not ended and answer[:4].isalpha() and marker not in answer[:3]
    marked = byte_tokenizer()
    marked.chat_template = template + "{% raw %}" + marker + "{% endraw %}{% endif %}{% endfor %}"
    assert complete(letters, marked, prompts, spec, seed=0) == [(answer[:2], True)]


@pytest.mark.parametrize("sampled", [False, True])
def test_a_stopped_run_resumes_to_the_uninterrupted_file(teacher, tmp_path, sampled) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 7)
    options = ["generate.do_sample=true", "generate.temperature=1.5"] if sampled else []
    whole = generate(config(tmp_path / "a", prompts, *options), teacher, tokenizer())
    expected = whole.read_text()
    assert len(expected.splitlines()) == 7
    stopped = tmp_path / "b" / "completions.jsonl"
    stopped.parent.mkdir()
    lines = expected.splitlines(keepends=True)
    stopped.write_text("".join(lines[:4]) + lines[4][:10])  # mid-batch, a torn last row
    shutil.copy(record_path(whole), record_path(stopped))  # written before the first row
    resumed = generate(config(tmp_path / "b", prompts, *options), teacher, tokenizer())
    assert resumed.read_text() == expected


def test_a_finished_generation_run_again_says_it_generated_nothing(teacher, tmp_path, capsys):
    """It printed what the first run printed: a user could not tell whether it had regenerated,
    appended or skipped (probe 34)."""
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    assert "nothing generated" not in capsys.readouterr().out
    before = out.read_text()
    generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    assert f"all 3 prompts are answered in {out} already: nothing generated" in (
        capsys.readouterr().out
    )
    assert out.read_text() == before


def test_a_stop_during_a_batch_ends_it_at_the_next_token_unwritten(teacher, tmp_path) -> None:
    """SIGTERM decoded the whole batch on (2 min 37 s of 200-token answers on a CPU, past a
    scheduler's grace): now the batch ends at the next token, is not written, and the rerun
    generates it whole again, to the uninterrupted file."""
    prompts = write_prompts(tmp_path / "p.jsonl", 7)
    expected = generate(config(tmp_path / "a", prompts), teacher, tokenizer()).read_text()
    calls = []

    def stop_on_the_fourth_token(module, args) -> None:  # inside the second batch's decoding
        calls.append(1)
        if len(calls) == 10:
            STOP.signum = signal.SIGTERM

    hook = teacher.register_forward_pre_hook(stop_on_the_fourth_token)
    try:
        with pytest.raises(Interrupted, match="3 of 7 answers kept"):
            generate(config(tmp_path / "b", prompts), teacher, tokenizer())
    finally:
        hook.remove()
        STOP.signum = None
    assert len(calls) == 10  # no token decoded after the request
    written = (tmp_path / "b" / "completions.jsonl").read_text()
    assert written == "".join(expected.splitlines(keepends=True)[:3])
    # Read as a corpus now, it was the whole of one: 3 of 7 answers, without a word (probe 59).
    partial = str(tmp_path / "b" / "completions.jsonl")
    unfinished = rf"^data.files entry {partial}: a generation stopped before answering its 7 "
    with pytest.raises(DataError, match=unfinished + r"prompts \(completions.meta.json beside"):
        ChatDataModule(tokenizer(), files=[partial], val_fraction=0.3)
    record = tmp_path / "b" / "completions.meta.json"
    whole = record.read_bytes()
    record.write_bytes(whole[:60])  # damaged: whether it finished is unknown (verify 60)
    with pytest.raises(DataError, match=r"completions.meta.json beside it cannot be read, so"):
        ChatDataModule(tokenizer(), files=[partial], val_fraction=0.3)
    record.write_bytes(whole)
    resumed = generate(config(tmp_path / "b", prompts), teacher, tokenizer())
    assert resumed.read_text() == expected
    ChatDataModule(tokenizer(), files=[partial], val_fraction=0.3)  # finished: read


def test_completions_are_chat_rows_that_data_chat_reads(teacher, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt_line"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert all(row["messages"][-1]["role"] == "assistant" for row in rows)
    data = ChatDataModule(tokenizer(), files=[str(out)], val_fraction=0.3)
    data.setup()
    assert all(example.scored > 0 for example in data.train_examples)


def test_an_answer_cut_at_max_new_tokens_is_marked_and_counted(teacher, tmp_path, capsys):
    """The tiny random teacher never ends its turn within 6 tokens: each answer is marked
    "finished": false (written like a finished one, it was trained with an end of turn after
    it), and generate says how many were cut and what to raise."""
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(row["messages"][-1]["finished"] is False for row in rows)
    assert (
        "4 of 4 answers reached generate.max_new_tokens=6 before the teacher ended them"
        in capsys.readouterr().out
    )
    data = ChatDataModule(tokenizer(), files=[str(out)], val_fraction=0.25)
    data.setup()
    for example in data.train_examples:
        scored = tokenizer().decode(example.labels[example.labels != -100])
        assert "<|im_end|>" not in scored, "a cut answer's end of turn is not scored"
    ended = answer_row(1, [{"role": "user", "content": "q"}], "a", finished=True)
    assert ended["messages"][-1] == {"role": "assistant", "content": "a"}, "nothing added"


def test_the_prompts_of_a_data_split_are_completed(teacher, tmp_path) -> None:
    """generate.prompts=train_split answers the training prompts of data=chat, split as a run
    splits them: the held-out prompts are never answered for training."""
    rows = [{"prompt": f"Say {i}.", "completion": "x"} for i in range(10)]
    chats = tmp_path / "c.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = ["data=chat", f"data.files=[{chats}]", "data.val_fraction=0.3"]
    module = ChatDataModule(tokenizer(), files=[str(chats)], val_fraction=0.3)
    train, val = module.split()
    for split, expected in (("train_split", train), ("val_split", val)):
        cfg = config(tmp_path / split, Path(split), *data)
        cfg.generate.prompts = split
        out = generate(cfg, teacher, tokenizer())
        written = [json.loads(line) for line in out.read_text().splitlines()]
        assert [row["messages"][:-1] for row in written] == [c.messages[:-1] for c in expected]
        assert [row["prompt_line"] for row in written] == [c.where for c in expected]
    assert len(train) == 7 and len(val) == 3
    text = config(tmp_path / "text", Path("val_split"))
    text.generate.prompts = "val_split"
    # A Refused (exit 2 with the message), where it was a ValueError traceback.
    with pytest.raises(Refused, match=r"with data=text use generate.prompts=train_split \(its"):
        generate(text, teacher, tokenizer())
    stream = ["data=chat", "data.streaming=true", "data.dataset.path=json"]
    streamed = config(tmp_path / "stream", Path("train_split"), *stream)
    streamed.generate.prompts = "train_split"
    with pytest.raises(Refused, match=r"train_split with data.streaming=true: a stream's"):
        generate(streamed, teacher, tokenizer())


def test_sampled_answers_to_a_repeated_prompt_train_each_occurrence(teacher, tmp_path) -> None:
    """A prompt the training data asks three times (with three answers), answered by sampling:
    three different answers, which data.teacher_answers gives to the occurrences in order (it
    refused the file before, and its advice could not help)."""
    rows = [{"prompt": "Say hi.", "completion": f"hi {i}"} for i in range(3)]
    rows += [{"prompt": f"Say {i}.", "completion": "x"} for i in range(5)]
    chats = tmp_path / "c.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in rows))
    sampled = ["generate.do_sample=true", "generate.temperature=2.0", "generate.max_new_tokens=8"]
    data = ["data=chat", f"data.files=[{chats}]", "data.val_fraction=0.25"]
    cfg = config(tmp_path / "gen", Path("train_split"), *data, *sampled)
    cfg.generate.prompts = "train_split"
    out = generate(cfg, teacher, tokenizer())
    written = [json.loads(line) for line in out.read_text().splitlines()]
    hi = [r["messages"][-1]["content"] for r in written if "hi" in r["messages"][0]["content"]]
    module = ChatDataModule(tokenizer(), files=[str(chats)], val_fraction=0.25)
    train, _ = module.split()
    asked = sum("hi" in c.messages[0]["content"] for c in train)
    assert len(hi) == asked >= 2 and len(set(hi)) == asked  # sampled: each answer differs
    answered = ChatDataModule(
        tokenizer(), files=[str(chats)], val_fraction=0.25, teacher_answers=str(out)
    )
    answered.setup()
    texts = [answered.tokenizer.decode(e.tokens) for e in answered.train_examples]
    assert [a for a in hi if any(a in t and "hi" in t for t in texts)] == hi


def test_a_file_of_other_prompts_is_not_continued(teacher, tmp_path) -> None:
    out = generate(config(tmp_path, write_prompts(tmp_path / "p.jsonl", 3)), teacher, tokenizer())
    other = tmp_path / "q.jsonl"
    other.write_text(json.dumps({"prompt": "Something else."}) + "\n")
    with pytest.raises(Refused, match=r"row 1 answers another prompt.*overwrite=true"):
        generate(config(tmp_path, other), teacher, tokenizer())
    generate(config(tmp_path, other, "overwrite=true"), teacher, tokenizer())
    assert len(out.read_text().splitlines()) == 1


def test_prompt_rows_and_settings_are_checked(teacher, tmp_path) -> None:
    fields = ChatFields()
    answered = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    }
    assert prompt_messages(answered, "r", fields) == answered["messages"][:1]  # answered anew
    with pytest.raises(Refused, match=r"r has neither 'prompt' nor 'messages'"):
        prompt_messages({"text": "x"}, "r", fields)
    with pytest.raises(Refused, match=r"nothing but assistant turns"):  # exit 2, no traceback
        prompt_messages({"messages": answered["messages"][1:]}, "r", fields)
    with pytest.raises(Refused, match=r"r has no messages: there is no prompt"):
        prompt_messages({"messages": []}, "r", fields)
    with pytest.raises(Refused, match=r"r: the prompt's last turn \(message 0, user\) is empty"):
        prompt_messages({"prompt": " "}, "r", fields)
    with pytest.raises(Refused, match=r"r has role\(s\) \['robot'\], none of"):
        prompt_messages({"messages": [{"role": "robot", "content": "Hi"}]}, "r", fields)
    with pytest.raises(Refused, match=r"r has both 'prompt' and 'messages'"):
        prompt_messages({"prompt": "q", **answered}, "r", fields)
    with pytest.raises(MissingData, match=r"generate.prompts='.*none.jsonl' does not exist; give"):
        generate(config(tmp_path, tmp_path / "none.jsonl"), teacher, tokenizer())
    prompts = write_prompts(tmp_path / "p.jsonl", 1)
    missing = config(tmp_path, prompts, "generate.chat_template=none.jinja")
    with pytest.raises(FileNotFoundError, match=r"generate.chat_template='none.jinja' is neither"):
        generate(missing, teacher, tokenizer())
    with pytest.raises(ValueError, match=r"set generate.prompts=FILE.jsonl"):
        generate(compose_config(["debug=smoke"], output_dir=tmp_path), teacher, tokenizer())
    with pytest.raises(ValueError, match=r"generate.temperature=0.0 must be positive"):
        GenerateSpec(temperature=0.0)
    with pytest.raises(ValueError, match=r"generate.max_new_tokens=0"):
        GenerateSpec(max_new_tokens=0)


@pytest.mark.integration  # runs the command line in a subprocess
def test_the_command_line_writes_completions(tmp_path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    command = [sys.executable, "-m", "lightning_kd", "generate", "debug=smoke"]
    command += [f"generate.prompts={prompts}", f"generate.chat_template={template}"]
    command += ["generate.max_new_tokens=4", f"hydra.run.dir={tmp_path / 'g'}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((tmp_path / "g" / "completions.jsonl").read_text().splitlines()) == 2


def test_an_encoder_teacher_is_refused_before_it_loads(tmp_path, capsys) -> None:
    """experiment=minilm: the encoder was loaded, then BertModel has no generate (a Hydra
    traceback, an empty completions.jsonl left behind)."""
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    argv = ["generate", "experiment=minilm", f"generate.prompts={prompts}"]
    with pytest.raises(SystemExit) as exit_:
        cli_main([*argv, f"hydra.run.dir={tmp_path / 'g'}"])
    assert exit_.value.code == 2
    assert "teacher.task=encoder: lightning-kd generate writes a causal LM's text" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "g" / "completions.jsonl").exists()


def test_a_damaged_row_inside_the_file_is_named(tmp_path) -> None:
    out = tmp_path / "completions.jsonl"
    out.write_text('{"prompt": "a"}\ngarbage\n{"prompt": "c"}\n')
    with pytest.raises(CompletionsMismatch, match=rf"{out}:2 is not a completion row"):
        completed_rows(out, [(1, "a"), (2, "b"), (3, "c")])


def test_no_prompts_is_refused_with_the_template_they_would_need(teacher, tmp_path) -> None:
    # byte_tokenizer() has no chat template, as the debug teacher's: the first refusal names both
    # settings, so following it works.
    cfg = compose_config(["debug=smoke"], output_dir=tmp_path)
    with pytest.raises(Refused, match=r"prompts=null: .*also need generate.chat_template=plain"):
        generate(cfg, teacher, byte_tokenizer())
    cfg = compose_config(["debug=smoke", "generate.chat_template=plain"], output_dir=tmp_path)
    with pytest.raises(Refused, match=r"generate.prompts=null") as refused:
        generate(cfg, teacher, byte_tokenizer())
    assert "chat_template" not in str(refused.value)  # set: no longer asked for


def cli_generate(tmp_path: Path, *overrides: str) -> int:
    """The exit status of ``lightning-kd generate debug=smoke <overrides>``, in this process."""
    try:
        cli_main(["generate", "debug=smoke", *overrides, f"hydra.run.dir={tmp_path / 'g'}"])
    except SystemExit as leaving:  # a refusal leaves through SystemExit
        return leaving.code or 0
    return 0


def test_the_command_follows_its_advice_to_completions(tmp_path, capsys) -> None:
    assert cli_generate(tmp_path, "generate.chat_template=plain") == 2  # was a traceback, exit 1
    err = capsys.readouterr().err
    assert "generate.prompts=null: set generate.prompts=" in err and "Traceback" not in err
    # A prompt file that is not there: refused with the config (a traceback after the precision).
    assert cli_generate(tmp_path, f"generate.prompts={tmp_path / 'none.jsonl'}") == 2
    printed = capsys.readouterr()
    assert "none.jsonl' does not exist; give a .jsonl file" in printed.err
    assert "Traceback" not in printed.err and "precision" not in printed.out
    settings = ["generate.max_prompts=1", "generate.max_new_tokens=2"]
    assert cli_generate(tmp_path, "generate.prompts=train_split", *settings) == 0
    assert len((tmp_path / "g" / "completions.jsonl").read_text().splitlines()) == 1


class ScriptedTeacher(torch.nn.Module):
    """Answers with a fixed run of ids, stopping (as ``generate`` does) at the first of the end
    tokens it is given; its generation config's EOS is not the template's end of turn."""

    def __init__(self, answer: list[int], eos: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.answer = answer
        self.generation_config = GenerationConfig(eos_token_id=eos)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def generate(self, input_ids, attention_mask=None, **options):
        ends = options.get("eos_token_id", self.generation_config.eos_token_id)
        ends = ends if isinstance(ends, list) else [ends]
        cut = next((i + 1 for i, t in enumerate(self.answer) if t in ends), len(self.answer))
        rows = torch.tensor([self.answer[:cut]] * len(input_ids))
        return torch.cat([input_ids, rows], dim=1)


def test_a_chat_answer_ends_with_its_turn_whatever_the_generation_config_says() -> None:
    """A teacher whose EOS is not its template's end of turn ran on into a turn of its own,
    whose markers decoding dropped: "Hi<|im_end|>\\n<|im_start|>user\\nnext" was written "Hi\\nuser
    \\nnext"."""
    from tests.unit.data.test_encoding import chatml_tokenizer

    tokenizer = chatml_tokenizer()
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    said = [tokenizer.convert_tokens_to_ids(c) for c in ("H", "i")]
    rest = [tokenizer.convert_tokens_to_ids(c) for c in ("Ċ", "u", "s")]
    teacher = ScriptedTeacher([*said, end, *rest[:1], start, *rest[1:]], tokenizer.eos_token_id)
    prompts = [[{"role": "user", "content": "Say hi."}]]
    assert complete(teacher, tokenizer, prompts, GenerateSpec(max_new_tokens=8), 0) == [
        ("Hi", True)
    ]


def test_prompt_rows_are_read_as_the_runs_chat_data_reads_them() -> None:
    """generate read 'prompt' or 'messages' alone: the run's data.messages_field, ShareGPT and
    Alpaca rows, which training reads, were refused (probe 46)."""
    fields = ChatFields.of(compose_config(["data=chat", "data.messages_field=conversation"]).data)
    assert fields == ChatFields(messages="conversation")
    assert ChatFields.of(compose_config([]).data) == ChatFields()  # data=text: the defaults
    turn = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    asked = [{"role": "user", "content": "Hi."}]
    assert prompt_messages({"conversation": turn}, "r", fields) == asked
    sharegpt = [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Hello."}]
    assert prompt_messages({"conversations": sharegpt}, "r", ChatFields()) == asked
    alpaca = {"instruction": "Hi.", "input": "", "output": "Hello."}
    assert prompt_messages(alpaca, "r", ChatFields()) == asked
