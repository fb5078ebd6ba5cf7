"""lightning-kd evaluate --files: models of different tokenizers compared by bits per byte."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from lightning_kd.cli.evaluate import main
from lightning_kd.evaluation.perplexity import document_windows, windows_of
from lightning_kd.models.loading import byte_tokenizer
from tests.conftest import TEXT, TINY_LLAMA

DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcode café, naïve — 1 ≤ 2 ✓",
    "Pack my box with five dozen liquor jugs. " * 3,
]


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of 320 tokens trained in code on ``TEXT``, which puts ``<bos>`` before a
    text by itself (as Gemma's does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([TEXT], trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", backend.token_to_id("<bos>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>")


def save_tiny(directory, tokenizer, seed: int) -> AutoModelForCausalLM:
    torch.manual_seed(seed)
    config = dict(TINY_LLAMA, vocab_size=len(tokenizer))
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(config.pop("model_type"), **config)
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model.eval()


def test_windows_score_every_token_after_the_start_once() -> None:
    ids = list(range(40))
    windows = list(document_windows(ids, context=1, block_size=16))
    assert [len(window) for window, _ in windows] == [16, 16, 10]  # overlapping by one
    targets = [label for _, labels in windows for label in labels[1:] if label != -100]
    assert targets == ids[1:]


def test_two_tokenizers_count_the_documents_bytes() -> None:
    """Every byte of the text is scored once whatever the tokenizer: no unscored first token of
    a block, no dropped tail; the EOS closing each document adds none."""
    text_bytes = sum(len(document.encode()) for document in DOCUMENTS)
    bytewise = windows_of(DOCUMENTS, byte_tokenizer(), 16, "bytes")
    bpe = windows_of(DOCUMENTS, bpe_tokenizer(), 16, "bpe")
    assert bytewise.text_bytes == bpe.text_bytes == text_bytes
    assert bytewise.tokens == text_bytes + len(DOCUMENTS)  # a token per byte, and each EOS
    assert bpe.tokens < bytewise.tokens
    assert bpe.start == (bpe_tokenizer().bos_token_id,) and bytewise.start == (256,)  # its EOS
    assert max(len(row) for row in bpe.ids + bytewise.ids) == 16


def test_bits_per_byte_is_the_nll_over_the_text_bytes(tmp_path) -> None:
    bpe = bpe_tokenizer()
    save_tiny(tmp_path / "bytes", byte_tokenizer(), seed=0)
    model = save_tiny(tmp_path / "bpe", bpe, seed=1)
    text = tmp_path / "heldout.jsonl"
    text.write_text("".join(json.dumps({"text": document}) + "\n" for document in DOCUMENTS))
    out = tmp_path / "scores.json"
    argv = ["--files", str(text), "--block-size", "128", "--out", str(out), "--"]
    rows = main([*argv, str(tmp_path / "bytes"), str(tmp_path / "bpe")])

    assert json.loads(out.read_text())["rows"] == rows
    assert json.loads(out.read_text())["block_size"] == 128  # the numbers depend on it
    assert [row["tokenizer"] for row in rows] == [str(tmp_path / "bytes"), str(tmp_path / "bpe")]
    text_bytes = sum(len(document.encode()) for document in DOCUMENTS)
    assert rows[0]["bytes"] == rows[1]["bytes"] == text_bytes
    nll, tokens = 0.0, 0
    for document in DOCUMENTS:  # each one window: <bos> document <eos>, every token scored
        ids = torch.tensor([[*bpe(document)["input_ids"], bpe.eos_token_id]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        nll += F.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
        tokens += ids.shape[1] - 1
    assert rows[1]["tokens"] == tokens
    assert rows[1]["bits_per_byte"] == pytest.approx(nll / (math.log(2) * text_bytes), rel=1e-5)
    assert rows[1]["perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)


def test_a_tokenizer_that_rewrites_the_text_is_marked_and_not_called_the_same(
    tmp_path, capsys
) -> None:
    """The byte tokenizer with a lower-casing normaliser: its tokens spell other text, so its
    bits per byte are of that text. It was labelled the first model's tokenizer (the same
    vocabulary) and its bits per byte put beside the others without a word."""
    from tokenizers import normalizers

    lower = byte_tokenizer()
    lower.backend_tokenizer.normalizer = normalizers.Lowercase()
    save_tiny(tmp_path / "bytes", byte_tokenizer(), seed=0)
    save_tiny(tmp_path / "lower", lower, seed=0)
    text = tmp_path / "heldout.txt"
    text.write_text("Upper Case Letters Here")
    rows = main(
        [
            "--files",
            str(text),
            "--block-size",
            "64",
            "--",
            *(str(tmp_path / name) for name in ("bytes", "lower")),
        ]
    )
    out = capsys.readouterr().out
    assert [row["tokenizer"] for row in rows] == [str(tmp_path / "bytes"), str(tmp_path / "lower")]
    assert [row["rewritten_documents"] for row in rows] == [0, 1]
    assert "spells 1 of the 1 documents back as other text" in out
    table = [line for line in out.splitlines() if line.startswith(f"| {tmp_path}")]
    assert ["†" in line for line in table] == [False, True] and "but those marked †" in out


def test_a_model_that_reads_ahead_is_refused(tmp_path, capsys) -> None:
    """A BERT loaded as a causal LM without is_decoder sees the tokens it predicts: scored, it
    gave a bits per byte like any other row's."""
    from transformers import BertConfig, BertLMHeadModel

    from lightning_kd.evaluation.saved_models import reads_ahead

    config = BertConfig(
        vocab_size=257,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        is_decoder=False,
    )
    bert = BertLMHeadModel(config).eval()
    assert reads_ahead(bert)
    assert not reads_ahead(save_tiny(tmp_path / "causal", byte_tokenizer(), seed=0))
    bert.save_pretrained(tmp_path / "bert")
    byte_tokenizer().save_pretrained(tmp_path / "bert")
    text = tmp_path / "heldout.txt"
    text.write_text("some held-out text")
    from lightning_kd.cli import main as cli

    assert (
        cli(["evaluate", "--files", str(text), "--block-size", "32", "--", str(tmp_path / "bert")])
        == 2
    )
    assert "reads ahead" in capsys.readouterr().err


def test_a_saved_model_of_nan_weights_is_named_not_called_an_encoder(tmp_path, capsys) -> None:
    """Its NaN logits differed from themselves: "reads ahead ... a bidirectional encoder" of a
    plain causal LM whose file was damaged (probe 59)."""
    model = save_tiny(tmp_path / "damaged", byte_tokenizer(), seed=0)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[:2] = float("nan")
    model.save_pretrained(tmp_path / "damaged")
    text = tmp_path / "heldout.txt"
    text.write_text("some held-out text")
    from lightning_kd.cli import main as cli

    damaged = str(tmp_path / "damaged")
    assert cli(["evaluate", "--files", str(text), "--block-size", "32", "--", damaged]) == 2
    err = capsys.readouterr().err
    assert "has weights that are NaN or infinite: model.layers.0.mlp.up_proj.weight (" in err
    assert "reads ahead" not in err


def test_models_evaluate_cannot_score_are_refused_with_the_fix(tmp_path, capsys) -> None:
    """Each was a traceback: an encoder-decoder (a ValueError listing 300 config classes), a
    tokenizer with no document boundary; a run's directory said only "has no config.json"."""
    from transformers import T5Config, T5ForConditionalGeneration

    from lightning_kd.cli import main as cli

    text = tmp_path / "heldout.txt"
    text.write_text("some held-out text")
    t5 = tmp_path / "t5"
    T5ForConditionalGeneration(
        T5Config(vocab_size=257, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8)
    ).save_pretrained(t5)
    byte_tokenizer().save_pretrained(t5)
    bare = tmp_path / "bare"
    save_tiny(bare, byte_tokenizer(), seed=0)
    (bare / "tokenizer_config.json").unlink()  # no special tokens: no EOS, no BOS
    run = tmp_path / "run"
    save_tiny(run / "student", byte_tokenizer(), seed=0)
    expected = {
        t5: "is no causal language model",
        bare: "adds no BOS and has no EOS",
        run: f"has no config.json; the saved model is {run / 'student'}",
    }
    for model, message in expected.items():
        argv = ["evaluate", "--files", str(text), "--block-size", "32", "--", str(model)]
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_a_document_repeated_across_files_is_scored_once(tmp_path) -> None:
    """``--files a.txt a.jsonl`` of one text scored it twice; data.files keeps a repeat once."""
    from lightning_kd.evaluation.perplexity import documents_of

    (tmp_path / "a.txt").write_text("the same text")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "the same text"}) + "\n")
    with pytest.warns(UserWarning, match="1 of 2 documents repeat another"):
        documents = documents_of([str(tmp_path / "a.txt"), str(tmp_path / "a.jsonl")], "text")
    assert documents == ["the same text"]


def test_a_gguf_export_read_back_with_a_token_added_past_the_end_is_its_sources() -> None:
    """transformers' GGUF reader adds <|endoftext|> (id 257) to the byte vocabulary: the export
    of a byte-level student was labelled another tokenizer than its source's, and the table
    said their perplexities did not compare (probe 26). Other ids for the text still split."""
    from lightning_kd.evaluation.score_table import tokenizer_names

    source, export = byte_tokenizer(), byte_tokenizer()
    export.add_tokens(["<|endoftext|>"], special_tokens=True)
    assert export.convert_tokens_to_ids("<|endoftext|>") == len(source)
    tokenizers = {"source": source, "export": export}
    same = {"source": [[1, 2, 3]], "export": [[1, 2, 3]]}
    assert tokenizer_names(["source", "export"], tokenizers, same) == ["source", "source"]
    moved = same | {"export": [[1, 2, 4]]}
    assert tokenizer_names(["source", "export"], tokenizers, moved) == ["source", "export"]


def test_an_encoders_wordpiece_tokenizer_is_refused_as_an_encoders() -> None:
    """It was refused with the distillation's words, "Cross-tokenizer distillation needs ... on
    both sides", for a command that compares no pair (probe 34)."""
    from lightning_kd.utils.refusal import Refused
    from tests.unit.data.test_alignment import wordpiece_tokenizer

    with pytest.raises(Refused) as refused:
        windows_of(DOCUMENTS, wordpiece_tokenizer(), 16, "runs/minilm/student")
    message = str(refused.value)
    assert message.startswith("runs/minilm/student's tokenizer is WordPiece (BERT-style)")
    assert "evaluate scores causal language models" in message
    assert "Cross-tokenizer" not in message


def test_a_row_cut_at_generates_budget_has_no_closing_eos_scored(tmp_path) -> None:
    """``--files completions.jsonl`` scored the EOS after a ``"finished": false`` row, a
    document that did not end there (probe 46); training leaves that separator out."""
    from lightning_kd.evaluation.perplexity import documents_of

    rows = [{"text": "a whole answer.", "finished": True}, {"text": "cut mid", "finished": False}]
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    documents = documents_of([str(path)], "text")
    windows = windows_of(documents, byte_tokenizer(), 64, "bytes")
    eos = byte_tokenizer().eos_token_id
    ends = sorted(labels[-1] == eos for labels in windows.labels)
    assert ends == [False, True]  # the finished row ends on its EOS target, the cut one not
    assert windows.tokens == len("a whole answer.") + 1 + len("cut mid")
    assert windows.text_bytes == len("a whole answer.cut mid")
