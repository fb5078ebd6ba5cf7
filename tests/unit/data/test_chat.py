"""Chat data: the answers alone scored, token by token; packed and padded; every bad input named."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from lightning_kd.data.batches import IndexedBlocks, Unscored, pad_for_ranks
from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.chat_tokens import encode_chat
from lightning_kd.data.conversations import ChatFields, row_messages
from lightning_kd.data.reading import read_documents
from lightning_kd.losses.logits import IGNORE_INDEX, scored_mask
from lightning_kd.models.loading import byte_tokenizer
from tests.integration.test_cli import run_cli

# SmolLM2-Instruct's template (ChatML, a default system turn): on the byte-level tokenizer every
# character is a token, so the expected labels can be written character by character.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TURNS = [
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another?"},
    {"role": "assistant", "content": "Eleven."},
]


def chat_tokenizer(template: str | None = CHATML):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_only_the_assistant_turns_are_labelled_token_by_token() -> None:
    tokenizer = chat_tokenizer()
    example = encode_chat(tokenizer, TURNS, "row")
    text = tokenizer.decode(example.tokens)
    expected = torch.full_like(example.tokens, IGNORE_INDEX)
    for answer in ("Seven.<|im_end|>\n", "Eleven.<|im_end|>\n"):
        start = text.index(answer)  # one byte, one token
        expected[start : start + len(answer)] = example.tokens[start : start + len(answer)]
    assert torch.equal(example.labels, expected)
    assert tokenizer.decode(example.labels[example.labels != IGNORE_INDEX]) == (
        "Seven.<|im_end|>\nEleven.<|im_end|>\n"
    )
    # Scored positions are those predicting an answer token: the one before each answer (the
    # template's "assistant\n" header end) predicts its first token; the prompt predicts nothing.
    mask = scored_mask(example.labels[None])[0]
    assert int(mask.sum()) == example.scored == len("Seven.<|im_end|>\nEleven.<|im_end|>\n")


@pytest.mark.parametrize("finished", [True, False, None])
def test_an_answer_cut_off_is_scored_up_to_the_end_of_its_text(finished) -> None:
    """ "finished": false marks an answer cut off before its end (generate.max_new_tokens): its
    text is scored, the end of turn after it is not; an earlier, finished answer keeps its own."""
    cut = {} if finished is None else {"finished": finished}
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Count"},
        {"role": "assistant", "content": "one two  ", **cut},  # its trailing spaces are text
    ]
    example = encode_chat(chat_tokenizer(), messages, "row 1")
    scored = byte_tokenizer().decode(example.labels[example.labels != IGNORE_INDEX])
    ending = "" if finished is False else "<|im_end|>\n"
    assert scored == f"Hello<|im_end|>\none two  {ending}"


def test_a_finished_flag_that_is_not_a_boolean_is_named() -> None:
    row = {"messages": [TURNS[0], {**TURNS[1], "finished": "no"}]}
    with pytest.raises(ValueError, match=r'row 3: a message\'s "finished" is true or false'):
        row_messages(row, "row 3", ChatFields())


def test_prompt_completion_rows_are_the_same_conversation() -> None:
    fields = ChatFields()
    as_pair = row_messages({"prompt": "Name a prime.", "completion": "Seven."}, "r", fields)
    assert as_pair == TURNS[:2]
    listed = {"prompt": TURNS[:1], "completion": TURNS[1:2]}
    assert row_messages(listed, "r", fields) == TURNS[:2]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, r"r has no assistant turn"),
        ({"body": "plain"}, r"neither 'messages' nor 'prompt' and 'completion'.*messages_field"),
        ({"text": "plain"}, r"'completion'; it holds 'text': read text rows with data=text"),
        ({"messages": [{"role": "user"}]}, r"r: message 0 has the content NoneType null, not"),
        # probe 36: each was one message for all, naming neither the message nor the fault
        ({"messages": [{"content": "hi"}]}, r"r: message 0 has no 'role' \(its keys"),
        ({"messages": [*TURNS[:1], {"role": "assistant", "content": 42}]}, r"message 1 has the "),
        ({"messages": "hi"}, r"r: the conversation is str \"hi\"; a conversation is a list of"),
        ({"messages": [["user", "hi"]]}, r"message 0 is list \[\"user\", \"hi\"\], not a mapping"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]},
            r"message 0 has content parts other than text",
        ),
        ({"prompt": 3, "completion": "x"}, r"a prompt or completion is a string or a list"),
        (
            {
                "messages": [
                    {"role": "User", "content": "hi"},
                    {"role": "Assistant", "content": "x"},
                ]
            },
            r"r has role\(s\) \['Assistant', 'User'\], none of \['system', .*lower case",
        ),
        (  # a typo beside a real answer: it was unscored context, as templates render any role
            {
                "messages": [
                    *TURNS[:2],
                    {"role": "user", "content": "y"},
                    {"role": "asistant", "content": "z"},
                ]
            },
            r"role\(s\) \['asistant'\]",
        ),
    ],
)
def test_bad_rows_are_named(row, message) -> None:
    with pytest.raises(ValueError, match=message):
        row_messages(row, "r", ChatFields())


def test_text_content_parts_are_read_as_their_text() -> None:
    """Hugging Face's and OpenAI's chat rows give content as parts, ``[{"type": "text", ...}]``:
    refused as no conversation at all (probe 36). Their texts, joined, are the content."""
    parts = [{"type": "text", "text": "Name a "}, {"type": "text", "text": "prime."}]
    row = {"messages": [{"role": "user", "content": parts}, TURNS[1]]}
    assert row_messages(row, "r", ChatFields()) == [
        {"role": "user", "content": "Name a prime."},
        TURNS[1],
    ]


# ChatML with tool calls rendered (as Qwen2.5's does, shortened): the call is the turn's answer.
TOOL_CHATML = CHATML.replace(
    "message['content'] + '<|im_end|>'",
    "message['content'] + (message['tool_calls'] | map(attribute='function')"
    " | map(attribute='name') | join(',') if message['tool_calls'] else '') + '<|im_end|>'",
)
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
TOOL_TURNS = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "sunny", "name": "get_weather", "tool_call_id": "c1"},
    {"role": "assistant", "content": "It is sunny."},
]


def test_a_tool_call_reaches_the_template_and_is_learnt() -> None:
    """The keys of a message beside role and content go to the template (they were dropped:
    the calling turn was learnt as an empty answer)."""
    messages = row_messages({"messages": TOOL_TURNS}, "r", ChatFields())
    assert messages[1]["tool_calls"] == [CALL] and messages[1]["content"] == ""
    assert messages[2]["tool_call_id"] == "c1"
    tokenizer = chat_tokenizer(TOOL_CHATML)
    example = encode_chat(tokenizer, messages, "row")
    scored = tokenizer.decode(example.labels[example.labels != IGNORE_INDEX])
    assert scored == "get_weather<|im_end|>\nIt is sunny.<|im_end|>\n"


def test_a_tool_call_the_template_leaves_out_is_refused() -> None:
    messages = row_messages({"messages": TOOL_TURNS}, "r", ChatFields())
    left_out = r"row: message 1 \(assistant\) has 'tool_calls', which the chat template does not"
    with pytest.raises(ValueError, match=left_out):
        encode_chat(chat_tokenizer(), messages, "row")


@pytest.mark.parametrize("answer", ["", "   \n"])
def test_an_empty_answer_is_refused_unless_the_teacher_gave_it(answer) -> None:
    """It taught the student to end its turn at once (its only scored tokens the end of turn);
    a row ``generate`` wrote (``prompt_line``) holds what the teacher answered."""
    empty = r"r: the assistant's turn 1 is empty, so the student would learn to end its turn"
    with pytest.raises(ValueError, match=empty):
        row_messages({"prompt": "say nothing", "completion": answer}, "r", ChatFields())
    with pytest.raises(ValueError, match=r"turn 3 is empty"):
        row_messages(
            {"messages": [*TURNS[:3], {"role": "assistant", "content": answer}]}, "r", ChatFields()
        )
    generated = {"messages": [TURNS[0], {"role": "assistant", "content": answer}], "prompt_line": 1}
    assert row_messages(generated, "r", ChatFields())[1]["content"] == answer


def test_a_template_that_cannot_render_the_roles_is_named() -> None:
    strict = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tool role') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    turns = [*TURNS[:1], {"role": "tool", "content": "x"}, TURNS[1]]
    with pytest.raises(ValueError, match=r"row: the chat template cannot render roles .*tool"):
        encode_chat(chat_tokenizer(strict), turns, "row")


def test_a_template_that_does_not_parse_is_named_as_such() -> None:
    """It was told as the row's roles being unrenderable, with "fix the row"."""
    broken = "{% for m in messages %}{{ m.content }"
    with pytest.raises(ValueError, match=r"^the chat template does not parse: unexpected '}'"):
        encode_chat(chat_tokenizer(broken), TURNS, "row")


def test_a_template_whose_turns_are_not_prefixes_is_refused() -> None:
    # Renders the last message differently from the same message mid-conversation.
    odd = "{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match=r"not render this conversation's turns as prefixes"):
        encode_chat(chat_tokenizer(odd), TURNS, "row")


def test_missing_template_and_missing_files_are_named(tmp_path) -> None:
    rows = write_rows(tmp_path / "c.jsonl", [{"messages": TURNS}] * 2)
    with pytest.raises(
        ValueError, match=r"has no chat template; set data.chat_template to one \(plain: "
    ):
        ChatDataModule(chat_tokenizer(None), files=[str(rows)])
    with pytest.raises(ValueError, match=r"set data.files=\[chats.jsonl\]"):
        ChatDataModule(chat_tokenizer(), files=None)
    text = tmp_path / "notes.txt"
    text.write_text("plain text")
    data = ChatDataModule(chat_tokenizer(), files=[str(text)])
    with pytest.raises(ValueError, match=r"chat data is read from .jsonl files"):
        data.setup()
    given = ChatDataModule(byte_tokenizer(), files=[str(rows)], chat_template=CHATML)
    assert given.tokenizer.chat_template == CHATML
    with pytest.raises(FileNotFoundError, match=r"neither a Jinja template nor a file"):
        ChatDataModule(byte_tokenizer(), files=[str(rows)], chat_template="chatml.jinja")


def test_rows_of_the_other_kind_are_told_to_take_the_other_data_module(tmp_path) -> None:
    """A text file under data=chat (and a chat file under data=text) was told to set the field
    names, when the fix is the data module."""
    text_rows = write_rows(tmp_path / "t.jsonl", [{"text": "plain prose " * 20}] * 4)
    with pytest.raises(ValueError, match=r"it holds 'text': read text rows with data=text"):
        ChatDataModule(chat_tokenizer(), files=[str(text_rows)]).setup()
    chat_rows = write_rows(tmp_path / "c.jsonl", conversations(4))
    with pytest.raises(ValueError, match=r"it holds a conversation: read chat rows with data=chat"):
        list(read_documents(chat_rows))


def conversations(count: int) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": f"Count to {i}."}, *TURNS[1:2]]}
        if i % 2
        else {"prompt": f"Say {i}.", "completion": f"{i}, said."}
        for i in range(count)
    ]


def test_too_few_conversations_are_named_with_the_file_and_the_fix(tmp_path) -> None:
    """An empty file was "0 distinct prompt(s) in [PosixPath('...')]" (probe 36)."""
    empty = write_rows(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match=rf"^{empty} holds no row; two distinct prompts are"):
        ChatDataModule(chat_tokenizer(), files=[str(empty)]).setup()
    one = write_rows(tmp_path / "one.jsonl", [{"messages": TURNS[:2]}] * 3)
    with pytest.raises(ValueError, match=r"holds 1 distinct prompt; .*: add conversations"):
        ChatDataModule(chat_tokenizer(), files=[str(one)]).setup()


def test_a_conversation_of_the_embedded_corpus_is_placed_by_the_corpus_name(tmp_path) -> None:
    """Its place is generate's prompt_line: it was the install's absolute path (probe 41), where
    text documents were ``smollm2_generated:190``; another file keeps its path."""
    own = write_rows(tmp_path / "c.jsonl", [{"messages": TURNS}])
    files = ["smollm2_generated", str(own)]
    module = ChatDataModule(chat_tokenizer(), files=files, completion_field="text")
    places = [chat.where for chat in module.file_chats()]
    assert places[0] == "smollm2_generated:1" and places[-1] == f"{own}:1"


def test_padded_batches_carry_each_conversations_labels(tmp_path) -> None:
    rows = write_rows(tmp_path / "c.jsonl", conversations(12))
    data = ChatDataModule(chat_tokenizer(), files=[str(rows)], val_fraction=0.25, pack=False)
    data.setup()
    assert len(data.val_examples) == 3 and len(data.train_examples) == 9
    items = IndexedBlocks(pad_for_ranks(data.val_examples[:2], 3))
    batch = data.collate([items[i] for i in range(len(items))])
    assert batch["block_index"].tolist() == [0, 1, -1]
    for row, example in enumerate(data.val_examples[:2]):
        length = len(example)
        assert torch.equal(batch["labels"][row, :length], example.labels)
        assert (batch["labels"][row, length:] == IGNORE_INDEX).all()
        assert batch["attention_mask"][row].sum() == length
    assert (batch["labels"][2] == IGNORE_INDEX).all()  # the unscored copy counts nowhere
    assert isinstance(items[2][1], Unscored)


def test_answers_cut_to_the_block_are_counted_in_a_warning(tmp_path) -> None:
    long = [{"prompt": f"Say {i}.", "completion": "word " * 30} for i in range(8)]
    rows = write_rows(tmp_path / "c.jsonl", long)
    data = ChatDataModule(chat_tokenizer(), files=[str(rows)], val_fraction=0.25, pack=False)
    data.block_size = 120
    with pytest.warns(UserWarning, match=r"6 train conversation\(s\) of 6 are longer .*answer"):
        data.setup()


def test_conversations_that_share_a_prompt_fall_on_one_side_of_the_split(tmp_path) -> None:
    """A held-out prompt is never trained on, whatever answer another row gives it."""
    prompts = [f"Count to {i}." for i in range(10)]
    rows = [{"prompt": p, "completion": f"answer {k}"} for p in prompts for k in range(3)]
    data = ChatDataModule(chat_tokenizer(), files=[str(write_rows(tmp_path / "c.jsonl", rows))])
    train, val = data.split()
    assert len(train) + len(val) == 30 and len(val) == 3  # one prompt of ten, its three rows
    held_out = {c.messages[0]["content"] for c in val}
    assert len(held_out) == 1 and held_out.isdisjoint(c.messages[0]["content"] for c in train)
    again = data.split()  # the same split each time (data.split_seed)
    assert [[c.where for c in side] for side in again] == [
        [c.where for c in side] for side in (train, val)
    ]


def continued(count: int) -> list[dict]:
    """Each question as a one-turn conversation, its continuation (a dataset storing each
    prefix of a dialogue) and the one turn under a system prompt: three rows of one opening."""
    rows = []
    for i in range(count):
        turn = [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}]
        more = [{"role": "user", "content": "And?"}, {"role": "assistant", "content": f"B{i}."}]
        system = [{"role": "system", "content": "Be brief."}]
        rows += [{"messages": turn}, {"messages": turn + more}, {"messages": system + turn}]
    return rows


def scored_answers(chats) -> set[str]:
    return {m["content"] for chat in chats for m in chat.messages if m["role"] == "assistant"}


def test_a_conversation_and_its_continuation_fall_on_one_side_of_the_split(tmp_path) -> None:
    """A held-out [Q, A] was trained on as the scored first turn of [Q, A, And?, B], or of
    [system, Q, A]: the split keyed whole prompts (probe 46). It keys openings now."""
    rows = write_rows(tmp_path / "c.jsonl", continued(10))
    train, val = ChatDataModule(chat_tokenizer(), files=[str(rows)]).split()
    assert len(val) == 3 and len(train) == 27  # one opening of ten, its three rows
    assert scored_answers(val).isdisjoint(scored_answers(train))


def test_packed_conversations_past_the_last_block_are_counted_in_a_warning(tmp_path) -> None:
    """Two of eight training conversations lost their last answer to the tail (probe 46)."""
    rows = write_rows(tmp_path / "c.jsonl", conversations(40))
    packed = ChatDataModule(
        chat_tokenizer(), files=[str(rows)], pack=True, block_size=160, val_fraction=0.25
    )
    with pytest.warns(UserWarning, match=r"of the train conversations fill no block of data.block"):
        packed.setup()


def test_the_conversation_split_follows_split_seed_not_seed(tmp_path) -> None:
    rows = [{"prompt": f"Count to {i}.", "completion": "ok"} for i in range(20)]
    files = [str(write_rows(tmp_path / "c.jsonl", rows))]
    held = {}
    for seed, split_seed in ((0, 0), (9, 0), (0, 4)):
        data = ChatDataModule(chat_tokenizer(), files=files, seed=seed, split_seed=split_seed)
        held[seed, split_seed] = [c.where for c in data.split()[1]]
    assert held[0, 0] == held[9, 0] != held[0, 4]


def test_packed_blocks_keep_labels_and_truncation_is_reported(tmp_path) -> None:
    rows = write_rows(tmp_path / "c.jsonl", conversations(20))
    packed = ChatDataModule(
        chat_tokenizer(), files=[str(rows)], pack=True, block_size=64, val_fraction=0.25
    )
    packed.setup()
    assert all(len(block) == 64 and block.scored > 0 for block in packed.train_examples)
    # Every label of a block is its token or −100: packing moved labels with their tokens.
    for block in packed.train_examples:
        kept = block.labels != IGNORE_INDEX
        assert torch.equal(block.labels[kept], block.tokens[kept])
    # 104 tokens reach the answers of the short prompts ("Say 4.") but not of the long ones.
    short = ChatDataModule(chat_tokenizer(), files=[str(rows)], block_size=104, val_fraction=0.5)
    with pytest.warns(UserWarning, match=r"no answer token within data.block_size=104"):
        short.setup()
    assert all(example.scored > 0 for example in short.train_examples + short.val_examples)
    none_left = ChatDataModule(chat_tokenizer(), files=[str(rows)], block_size=40)
    with (
        pytest.warns(UserWarning),
        pytest.raises(ValueError, match=r"no val example keeps an answer token"),
    ):
        none_left.setup()


@pytest.mark.integration  # runs the command line in a subprocess
@pytest.mark.parametrize(
    "objective",
    [
        ["distill.features=uniform"],
        [
            "distill.on_policy=0.5",
            "distill.on_policy_tokens=8",
            "+callbacks=samples",
            "callbacks.samples.every=3",
            "callbacks.samples.max_new_tokens=4",
        ],
        [
            "distill.on_policy=0.5",
            "distill.on_policy_tokens=8",
            "distill.on_policy_teacher_top_k=99",
        ],
    ],
    ids=["features", "on_policy", "interleaved"],
)
def test_a_chat_run_trains_on_the_answers(tmp_path, objective) -> None:
    """Through run.py: the dataset's answers (with feature matching), and mixed on-policy KD."""
    rows = write_rows(tmp_path / "c.jsonl", conversations(40))
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    run_dir = tmp_path / "run"
    result = run_cli(
        "debug=smoke",
        "data=chat",
        f"data.files=[{rows}]",
        f"data.chat_template={template}",
        "data.block_size=160",
        *objective,
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["after"]["val/ppl"] > 1
    if "+callbacks=samples" in objective:  # both models' completions at steps 3 and 6
        with open(run_dir / "samples.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        steps = [row["step"] for row in rows]  # 3 prompts, or all 2 validation examples
        assert set(steps) == {"3", "6"} and steps.count("3") == steps.count("6") == 2
        assert all(row["prompt"].endswith("<|im_start|>assistant\n") for row in rows)
        assert "Completions at step 6" in (run_dir / "summary.md").read_text()
    if "distill.on_policy_teacher_top_k=99" in objective:  # a step that sampled nothing: NaN
        with open(run_dir / "logs" / "metrics.csv", newline="") as handle:
            logged = [row for row in csv.DictReader(handle) if row.get("train/loss")]
        shares = [row["train/student_token_share"] for row in logged]
        first = next(i for i, share in enumerate(shares) if share not in ("", "nan"))
        assert "nan" in shares[first:], shares  # it was the last step's share again (probe 44)


def test_a_teacher_cache_of_chat_data_is_refused_by_name(tmp_path) -> None:
    from lightning_kd.cache.format import cache_key

    rows = write_rows(tmp_path / "c.jsonl", conversations(8))
    data = ChatDataModule(chat_tokenizer(), files=[str(rows)], val_fraction=0.25)
    data.setup()
    with pytest.raises(ValueError, match=r"ChatDataModule \(data=chat\) is not cached yet"):
        cache_key(None, data.tokenizer, data, k=8, temperature=1.0)


def test_a_conversation_that_opens_with_the_answer_is_named() -> None:
    turns = [TURNS[1], TURNS[0], TURNS[1]]
    with pytest.raises(ValueError, match=r"row: the conversation opens with the assistant's turn"):
        encode_chat(chat_tokenizer(), turns, "row")


def test_alpaca_and_sharegpt_rows_are_read_as_their_conversations(tmp_path) -> None:
    """Alpaca's instruction/input/output and ShareGPT's from/value turns were refused, and read
    through data.prompt_field=instruction, an Alpaca row's input was left out (probe 46)."""
    alpaca = {"instruction": "Translate.", "input": "Bonjour", "output": "Hello", "system": "Be"}
    assert row_messages(alpaca, "r", ChatFields()) == [
        {"role": "system", "content": "Be"},
        {"role": "user", "content": "Translate.\n\nBonjour"},
        {"role": "assistant", "content": "Hello"},
    ]
    bare = {"instruction": "Name a prime.", "input": "", "output": "7"}
    assert row_messages(bare, "r", ChatFields())[0] == {"role": "user", "content": "Name a prime."}
    with pytest.raises(ValueError, match=r"r is an Alpaca row whose 'input' data.prompt_field="):
        row_messages(alpaca, "r", ChatFields(prompt="instruction", completion="output"))
    turns = [{"from": "system", "value": "Be"}, {"from": "human", "value": "Hi"}]
    turns.append({"from": "gpt", "value": "Hello"})
    expected = [
        {"role": "system", "content": "Be"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert row_messages({"conversations": turns}, "r", ChatFields()) == expected
    assert row_messages({"chat": turns}, "r", ChatFields(messages="chat")) == expected
    odd = [{"from": "bot", "value": "Hi"}, *turns[2:]]
    with pytest.raises(ValueError, match=r"has role\(s\) \['bot'\]"):
        row_messages({"conversations": odd}, "r", ChatFields())
    rows = write_rows(tmp_path / "a.jsonl", [alpaca | {"input": f"{i}"} for i in range(8)])
    data = ChatDataModule(chat_tokenizer(), files=[str(rows)], val_fraction=0.25)
    data.setup()
    assert "Translate.\n\n3" in chat_tokenizer().decode(
        torch.cat([e.tokens for e in [*data.train_examples, *data.val_examples]])
    )


def test_repeated_conversations_are_counted_in_a_warning(tmp_path) -> None:
    """Each conversation three times: two of three rows went without a word (probe 46)."""
    rows = write_rows(tmp_path / "c.jsonl", conversations(12) * 3)
    data = ChatDataModule(chat_tokenizer(), files=[str(rows)])
    said = r"removed 24 duplicate conversation\(s\) of 36 .*c.jsonl:13 repeats .*c.jsonl:1"
    with pytest.warns(UserWarning, match=said):
        train, val = data.split()
    assert len(train) + len(val) == 12


def test_a_developer_turn_the_template_does_not_name_is_said() -> None:
    """OpenAI's 'developer' role rendered after SmolLM2's default system prompt, unsaid
    (probe 46); a template that names the role, or a system turn, is quiet."""
    import warnings

    from lightning_kd.data.chat_tokens import render

    developer = [{"role": "developer", "content": "Be brief."}, *TURNS[:2]]
    with pytest.warns(UserWarning, match="a 'developer' turn, a role the chat template does not"):
        text = render(chat_tokenizer(), developer, "row 1")
    assert text.startswith("<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>developer")
    named = CHATML.replace("!= 'system'", "not in ('system', 'developer')")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render(chat_tokenizer(named), developer, "row 1")
        render(chat_tokenizer(), [{"role": "system", "content": "Be brief."}, *TURNS[:2]], "r")
