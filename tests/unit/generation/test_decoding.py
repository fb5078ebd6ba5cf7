"""``generation/decoding.py``: decoding is what the caller asks for, and nothing a model's
``generation_config`` or transformers' defaults add."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.data.chat_tokens import PLAIN_TEMPLATE
from lightning_kd.generation.decoding import generate_in_eval, stop_and_pad, text_stop
from lightning_kd.models.loading import TeacherSpec, load_teacher
from tests.conftest import TINY_LLAMA

LEFT = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4).long()}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return load_teacher(TeacherSpec(path=None, config=dict(TINY_LLAMA)), "32-true")


def test_sampling_draws_from_the_whole_distribution(model) -> None:
    """transformers' default top_k=50 drew every token from the model's 50 likeliest (here
    under a quarter of its mass): the sampled teacher was not the teacher."""
    with torch.no_grad():
        top = set(model(**LEFT).logits[0, -1].topk(50).indices.tolist())
    drawn = []
    for seed in range(40):
        torch.manual_seed(seed)
        new = generate_in_eval(model, LEFT, max_new_tokens=1, do_sample=True, pad_token_id=0)
        drawn.append(int(new[0, 0]))
    assert sum(token not in top for token in drawn) > 10


def test_the_models_generation_config_does_not_change_what_is_decoded(model) -> None:
    """A generation_config.json's processors (a chat model's repetition_penalty,
    no_repeat_ngram_size) changed greedy and sampled text alike, recorded nowhere."""
    options = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    plain = generate_in_eval(model, LEFT, **options)
    model.generation_config.no_repeat_ngram_size = 1
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.top_k = 5
    with torch.no_grad():
        processed = model.generate(**LEFT, **options)[:, LEFT["input_ids"].shape[1] :]
    assert not torch.equal(processed, plain), "the processors would change this text"
    assert torch.equal(generate_in_eval(model, LEFT, **options), plain)
    torch.manual_seed(1)
    sampled = generate_in_eval(model, LEFT, **options | {"do_sample": True})
    model.generation_config.no_repeat_ngram_size = 0
    model.generation_config.repetition_penalty = 1.0
    model.generation_config.top_k = 50
    torch.manual_seed(1)
    assert torch.equal(generate_in_eval(model, LEFT, **options | {"do_sample": True}), sampled)


def test_every_end_id_and_the_chat_templates_end_of_turn_stop_a_completion(model) -> None:
    """Only the first of a generation config's EOS ids was kept (Llama 3's <|end_of_text|>, not
    <|eot_id|>), and a template's end of turn that is no EOS was none (probe 43)."""
    from tests.unit.data.test_encoding import chatml_tokenizer

    tokenizer = chatml_tokenizer()
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = [256, 7]
    model.generation_config.pad_token_id = model.config.pad_token_id = None
    assert stop_and_pad(model, "--prompts") == ((256, 7), 256)
    assert stop_and_pad(model, "--prompts", tokenizer) == ((256, 7, end_of_turn), 256)
    model.generation_config.eos_token_id = [256, end_of_turn]
    assert stop_and_pad(model, "--prompts", tokenizer) == ((256, end_of_turn), 256)


def test_a_template_that_ends_answers_in_text_cuts_completions_there() -> None:
    """plain ends an answer with a newline, which shows only at the next "User:"; ChatML's
    markers read as text end it themselves; a special end of turn needs no text (probe 44)."""
    from tests.conftest import byte_level_bpe
    from tests.unit.data.test_chat import chat_tokenizer
    from tests.unit.data.test_encoding import chatml_tokenizer

    plain = text_stop(chat_tokenizer(PLAIN_TEMPLATE))
    assert (plain.marker, plain.keep) == ("\nUser:", 1)
    ids = plain.tokenizer("Four.\nTwo lines.\nUser: and?\nAssistant: Five.\n")["input_ids"]
    assert plain.tokenizer.decode(plain.cut(torch.tensor(ids))) == "Four.\nTwo lines.\n"
    unended = torch.tensor(plain.tokenizer("Four.\nUser")["input_ids"])
    assert torch.equal(plain.cut(unended), unended)
    as_text = text_stop(chat_tokenizer())
    ids = as_text.tokenizer("Four.<|im_end|>\n<|im_start|>user\n")["input_ids"]
    assert as_text.tokenizer.decode(as_text.cut(torch.tensor(ids))) == "Four.<|im_end|>"
    assert text_stop(chatml_tokenizer()) is None
    assert text_stop(chat_tokenizer(None)) is None
    bpe = byte_level_bpe()  # pieces of several characters, and of part of one ("’")
    bpe.chat_template = PLAIN_TEMPLATE
    ends = text_stop(bpe)
    ids = bpe("it’s ok\nUser: naïve café\n")["input_ids"]
    assert bpe.decode(ends.cut(torch.tensor(ids))) == "it’s ok\n"
