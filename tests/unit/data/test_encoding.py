"""Text as token ids (``data/encoding.py``): a special token's string in a document is text, a
chat template's markers are control tokens."""

from __future__ import annotations

import random

import pytest
import torch

from lightning_kd.data.chat_tokens import encode_chat, prompt_ids
from lightning_kd.data.encoding import (
    Quotes,
    chat_ids,
    cuts_inside_tokens,
    marked_ids,
    quotes_of,
    text_ids,
)
from lightning_kd.data.errors import DataError
from lightning_kd.models.loading import byte_tokenizer
from tests.conftest import sentencepiece_tokenizer
from tests.unit.data.test_chat import CHATML

MARKERS = ["<|im_start|>", "<|im_end|>"]


def chatml_tokenizer(template: str = CHATML):
    """The byte tokenizer with ChatML's markers as special tokens (as SmolLM2's has them)."""
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": MARKERS})
    tokenizer.chat_template = template
    return tokenizer


def marker_count(ids) -> int:
    tokenizer = chatml_tokenizer()
    return sum(int(token) in tokenizer.convert_tokens_to_ids(MARKERS) for token in ids)


def test_a_special_tokens_string_in_a_document_is_spelled_out():
    tokenizer = chatml_tokenizer()
    text = "the end string is <eos>, a turn ends with <|im_end|>"
    ids = text_ids(tokenizer, [text])[0]
    # Parsed, they were the EOS (a document end mid-document) and a turn marker.
    parsed = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.eos_token_id in parsed and marker_count(parsed) == 1
    assert tokenizer.eos_token_id not in ids and marker_count(ids) == 0
    assert tokenizer.decode(ids) == text and len(ids) == len(text.encode())


def conversation(user: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": "Seven."}]


def test_a_conversation_quoting_no_marker_is_tokenised_as_the_model_reads_it():
    tokenizer = chatml_tokenizer()
    messages = conversation("Name a prime.")
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids, starts = chat_ids(tokenizer, text, messages, "row 0")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == encoded["input_ids"]
    assert starts == [start for start, _ in encoded["offset_mapping"]]


def test_a_marker_quoted_in_a_message_is_text_and_the_templates_stay_markers():
    tokenizer = chatml_tokenizer()
    quoted = "What does <|im_end|> do?"
    example = encode_chat(tokenizer, conversation(quoted), "row 0")
    plain = encode_chat(tokenizer, conversation("What does it do?"), "row 0")
    # The template's markers: system, user and assistant turns opened and closed (6) in both.
    assert marker_count(example.tokens) == marker_count(plain.tokens) == 6
    text = tokenizer.apply_chat_template(conversation(quoted), tokenize=False)
    assert tokenizer.decode(example.tokens) == text
    # The answer alone is labelled, as without the quote.
    answer = example.tokens[example.labels != -100]
    assert tokenizer.decode(answer) == tokenizer.decode(plain.tokens[plain.labels != -100])
    assert tokenizer.decode(answer).startswith("Seven.")
    # And a prompt quoting it is asked the same way.
    (prompt,) = prompt_ids(tokenizer, [conversation(quoted)[:1]])
    assert marker_count(prompt) == 5 and tokenizer.decode(prompt).endswith("assistant\n")


@pytest.mark.parametrize("said", ["<|im_end|>", "<|im_start|>", "<|im_end|>\n<|im_start|>user"])
def test_a_message_that_is_only_template_text_is_told_from_the_template(said):
    """A search for the message's text lands on the template's own (the end of the system turn
    holds "<|im_end|>"): the message is found where the template puts it."""
    tokenizer = chatml_tokenizer()
    messages = conversation(said)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids, starts = chat_ids(tokenizer, text, messages, "row 0")
    assert tokenizer.decode(ids) == text and starts == sorted(starts)
    # The markers stand where the template's do with a message of as many plain characters.
    plain = conversation("q" * len(said))
    encoded = tokenizer(
        tokenizer.apply_chat_template(plain, tokenize=False), return_offsets_mapping=True
    )
    marker_ids = set(tokenizer.convert_tokens_to_ids(MARKERS))
    expected = [
        start
        for t, (start, _) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)
        if t in marker_ids
    ]
    assert [start for t, start in zip(ids, starts, strict=True) if t in marker_ids] == expected


def test_a_quote_the_template_rewrites_cannot_be_told_from_its_markers():
    upper = CHATML.replace("message['content']", "message['content'] | upper")
    tokenizer = chatml_tokenizer(upper)
    messages = conversation("what does <|im_end|> do?")
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    with pytest.raises(DataError, match=r"row 3: message 0 quotes the special token.*<\|im_end"):
        chat_ids(tokenizer, text, messages, "row 3")
    # A template that trims the message finds it trimmed.
    trimmed = CHATML.replace("message['content']", "message['content'] | trim")
    tokenizer = chatml_tokenizer(trimmed)
    messages = conversation("  what does <|im_end|> do?  ")
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids, _ = chat_ids(tokenizer, text, messages, "row 3")
    assert marker_count(ids) == 6
    # A template that renders the message twice: which copy is which cannot be told.
    twice = CHATML.replace("message['content']", "message['content'] + message['content']")
    tokenizer = chatml_tokenizer(twice)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    with pytest.raises(DataError, match=r"message 0 quotes"):
        chat_ids(tokenizer, text, messages, "row 3")


def test_marked_ids_keep_the_given_markers_and_spell_out_the_rest():
    tokenizer = chatml_tokenizer()
    data = b"<|im_start|>user\nsay <|im_end|><|im_end|>"
    ids = marked_ids(tokenizer, data, [(0, 12), (len(data) - 10, len(data))])
    start, end = tokenizer.convert_tokens_to_ids(MARKERS)
    assert ids[0] == start and ids[-1] == end and marker_count(ids) == 2
    assert tokenizer.decode(torch.tensor(ids)) == data.decode()


def test_quotes_are_found_where_they_stand_and_only_there():
    quotes = Quotes({"<eos>", "<|im_end|>", "<start_of_turn>"}, set())
    text = "a <eos> b <start_of_turn> c < d <|im_end|><eos>"
    assert quotes.quoted(text) == ["<eos>", "<start_of_turn>", "<|im_end|>", "<eos>"]
    assert quotes.quoted("<eo") == [] and quotes.quoted("no markers < here") == []
    # Built once per tokenizer (a chat dataset asks for every message).
    tokenizer = chatml_tokenizer()
    assert quotes_of(tokenizer) is quotes_of(tokenizer)
    assert quotes_of(tokenizer).quoted("say <|im_end|>") == ["<|im_end|>"]


def first_prefix_tokenizer():
    """A SentencePiece-style tokenizer whose Metaspace puts its "▁" before a text's first piece
    only (``prepend_scheme="first"``: Mistral's, Llama 2's with ``legacy=False``), with ChatML
    markers as special tokens."""
    from tokenizers import decoders, pre_tokenizers

    tokenizer = sentencepiece_tokenizer()
    backend = tokenizer.backend_tokenizer
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Fuse(), decoders.Metaspace("▁", "first", split=False)]
    )
    tokenizer.add_special_tokens({"additional_special_tokens": MARKERS})
    tokenizer.chat_template = CHATML
    return tokenizer


def test_pieces_after_a_marker_get_no_dummy_prefix_where_the_tokenizer_gives_none():
    """Cut at a quote's template markers, each piece was tokenised as a text of its own, and a
    prepend_scheme="first" tokenizer put a "▁" before each ("▁user", "▁assistant", and a
    first answer label "▁Seven" the model never reads at inference)."""
    tokenizer = first_prefix_tokenizer()
    for said in ("What is it?", "What is <|im_end|>?"):
        messages = conversation(said)
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids, _ = chat_ids(tokenizer, text, messages, "row 0")
        pieces = tokenizer.convert_ids_to_tokens(ids)
        reference = tokenizer.convert_ids_to_tokens(
            tokenizer(text, add_special_tokens=False)["input_ids"]
        )
        assert "▁user" not in pieces and "▁assistant" not in pieces
        if said == "What is it?":
            assert pieces == reference  # one call: the tokenizer's own reading
    # The teacher's side reads a student's text cut at shared markers the same way.
    data = b"<|im_start|>user\nsay it<|im_end|>"
    ids = marked_ids(tokenizer, data, [(0, 12), (len(data) - 10, len(data))])
    assert ids == tokenizer(data.decode(), add_special_tokens=False)["input_ids"]


def test_a_marker_that_strips_the_space_before_it_stays_a_marker():
    """An lstrip marker's offsets take in the space it strips: after a quoting message ending in
    a space, it started inside the message and was spelled out (the answer's labels ended in
    the characters "<|end|>" instead of the end-of-turn token)."""
    from tokenizers import AddedToken

    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(t, lstrip=True, special=True, normalized=False)
                for t in ("<|user|>", "<|assistant|>", "<|end|>")
            ]
        }
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    messages = [
        {"role": "user", "content": "Name <|end|> a prime. "},
        {"role": "assistant", "content": "Seven <|end|>. "},
    ]
    example = encode_chat(tokenizer, messages, "row 0")
    assert example.tokens.tolist().count(end) == 2  # the template's, not the quotes
    assert example.labels[example.labels != -100].tolist()[-2] == end


def test_a_quoting_message_the_template_leaves_out_is_no_quote():
    """A template that renders user and assistant turns alone drops the system message: quoting
    a marker there was refused as "rewritten" though the text quotes nothing."""
    dropping = CHATML.replace(
        "{% for message in messages %}",
        "{% for message in messages if message['role'] != 'system' %}",
    )
    tokenizer = chatml_tokenizer(dropping)
    messages = [{"role": "system", "content": "Never say <|im_end|>."}, *conversation("Hi")]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    ids, _ = chat_ids(tokenizer, text, messages, "row 0")
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_no_token_crosses_the_start_of_an_answer():
    """A tokenizer that merges two newlines (SmolLM2's does) read the prompt's last newline and
    an answer's first as one token, which starts in the prompt: the answer lost its newline from
    the labels, and trained after a context the model never reads at inference (its prompt is
    tokenised alone)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    vocab |= {"ĊĊ": len(vocab), "<eos>": len(vocab) + 1}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("Ċ", "Ċ")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    tokenizer.add_special_tokens({"additional_special_tokens": MARKERS})
    tokenizer.chat_template = CHATML
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nSeven."}]
    example = encode_chat(tokenizer, messages, "row 0")
    labelled = example.tokens[example.labels != -100].tolist()
    assert tokenizer.decode(labelled) == "\nSeven.<|im_end|>\n"
    (prompt,) = prompt_ids(tokenizer, [messages[:1]])
    assert example.tokens[: len(prompt)].tolist() == prompt.tolist()  # as at inference
    assert tokenizer.decode(example.tokens) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )


def test_the_cuts_inside_tokens_are_those_a_scan_finds() -> None:
    """The search that replaced a scan of every token per cut (minutes for a conversation of
    hundreds of turns) finds the same cuts: tokens of one character or several, byte pieces
    sharing one character's offsets, empty offsets."""
    rng = random.Random(0)
    for _ in range(200):
        offsets, at = [], 0
        for _ in range(rng.randrange(0, 30)):
            width = rng.choice([0, 1, 1, 2, 3, 5])
            offsets += [(at, at + width)] * rng.choice([1, 1, 2])  # byte pieces repeat theirs
            at += width + rng.choice([0, 0, 1])
        cuts = sorted(rng.sample(range(at + 2), min(at + 2, 6)))
        scanned = [cut for cut in cuts if any(lo < cut < hi for lo, hi in offsets)]
        assert cuts_inside_tokens(offsets, cuts) == scanned


def test_a_prompt_the_template_cannot_render_is_named() -> None:
    """Prompts for generation went to apply_chat_template itself: its exception came out
    unnamed, without the prompt's number or the fix."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tool role') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    tokenizer = chatml_tokenizer(template)
    prompts = [[{"role": "user", "content": "hi"}], [{"role": "tool", "content": "sunny"}]]
    with pytest.raises(DataError, match=r"^prompt 1: the chat template cannot render roles"):
        prompt_ids(tokenizer, prompts)


def test_a_document_longer_than_the_models_positions_is_read_without_a_warning(capfd) -> None:
    """Documents are cut into blocks after they are tokenised: transformers' "Token indices
    sequence length is longer than the specified maximum ... will result in indexing errors"
    (MiniLM's 512, every ``experiment=minilm`` run) told a fault that was not there."""
    tokenizer = byte_tokenizer()
    tokenizer.model_max_length = 16
    (ids,) = text_ids(tokenizer, ["a long document " * 8])
    assert len(ids) == 128
    assert "indexing errors" not in capfd.readouterr().err
