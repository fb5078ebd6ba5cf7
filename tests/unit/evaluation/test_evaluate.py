"""lightning-kd evaluate: perplexity of saved models on held-out text."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from lightning_kd.cli.evaluate import main
from lightning_kd.export.gguf import export_saved
from lightning_kd.models.loading import byte_tokenizer
from lightning_kd.utils.refusal import Refused
from tests.conftest import TEXT, TINY_LLAMA


def save_tiny(directory, seed: int) -> AutoModelForCausalLM:
    torch.manual_seed(seed)
    config = dict(TINY_LLAMA)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(config.pop("model_type"), **config)
    )
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return model.eval()


def test_perplexities_match_a_direct_computation(tmp_path) -> None:
    first, second = save_tiny(tmp_path / "a", 0), save_tiny(tmp_path / "b", 1)
    text = tmp_path / "heldout.jsonl"
    text.write_text("".join(json.dumps({"text": line}) + "\n" for line in TEXT.split(". ")))
    out = tmp_path / "ppl.json"
    rows = main(
        [
            "--files",
            str(text),
            "--block-size",
            "32",
            "--out",
            str(out),
            "--",
            str(tmp_path / "a"),
            str(tmp_path / "b"),
        ]
    )
    assert json.loads(out.read_text()) == {"files": [str(text)], "block_size": 32, "rows": rows}
    # by hand: each document [EOS, bytes..., EOS] (no BOS), in windows of 32 overlapping by one
    tokenizer = byte_tokenizer()
    # the blank one skipped, each repeated sentence scored once
    documents = list(dict.fromkeys(line.encode() for line in TEXT.split(". ") if line))
    windows = []
    for document in documents:
        ids = tokenizer(document.decode(), add_special_tokens=False)["input_ids"]
        ids = [tokenizer.eos_token_id, *ids, tokenizer.eos_token_id]
        windows += [torch.tensor([ids[s : s + 32]]) for s in range(0, len(ids) - 1, 31)]
    assert max(len(document) for document in documents) > 32  # some take two windows
    for model, row in zip((first, second), rows, strict=True):
        with torch.no_grad():
            nll = sum(
                F.cross_entropy(model(input_ids=w).logits[0, :-1], w[0, 1:], reduction="sum")
                for w in windows
            )
        tokens = sum(w.shape[1] - 1 for w in windows)
        assert row["tokens"] == tokens == sum(len(document) + 1 for document in documents)
        assert row["perplexity"] == pytest.approx(math.exp(nll.item() / tokens), rel=1e-4)
        assert row["bytes"] == sum(len(document) for document in documents)
        assert row["bits_per_byte"] == pytest.approx(nll.item() / math.log(2) / row["bytes"])


def test_files_without_text_are_an_error(tmp_path) -> None:
    save_tiny(tmp_path / "a", 0)
    (tmp_path / "blank.txt").write_text("  \n")
    with pytest.raises(ValueError, match="hold no text"):
        main(["--files", str(tmp_path / "blank.txt"), "--block-size", "64", str(tmp_path / "a")])


def test_a_gguf_export_is_scored_beside_its_source(tmp_path, monkeypatch) -> None:
    """``lightning-kd evaluate -- RUN/student RUN/student.q8_0.gguf``: the GGUF read by
    transformers' GGUF loader, converted once into the cache as a GGUF teacher is.

    That loader adds GPT-2's ``<|endoftext|>`` to a byte-level vocabulary without it (the two
    would then count as different tokenizers): SmolLM2's has it, so the tiny model's tokenizer
    is given it too, at the model's last row."""
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = dict(TINY_LLAMA, vocab_size=258)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(config.pop("model_type"), **config)
    )
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>"]})
    model.save_pretrained(tmp_path / "student")
    tokenizer.save_pretrained(tmp_path / "student")
    gguf = export_saved(tmp_path / "student", "q8_0")
    text = tmp_path / "heldout.txt"
    text.write_text(TEXT)
    rows = main(
        ["--files", str(text), "--block-size", "32", "--", str(tmp_path / "student"), str(gguf)]
    )
    assert rows[1]["model"] == str(gguf) and rows[1]["tokens"] == rows[0]["tokens"]
    assert rows[1]["tokenizer"] == str(tmp_path / "student")  # the same: perplexities compare
    assert rows[1]["perplexity"] == pytest.approx(rows[0]["perplexity"], rel=0.02)
    with pytest.raises(ValueError, match=r"student\.f16\.gguf: no such GGUF file"):  # exit 2
        main(["--files", str(text), "--", str(tmp_path / "student.f16.gguf")])
    # Under another name, known by its magic (it said "does not exist"), the fix named.
    renamed = tmp_path / "student.bin"
    renamed.write_bytes(gguf.read_bytes())
    with pytest.raises(ValueError, match=r"student.bin is a GGUF file without the .gguf suffix"):
        main(["--files", str(text), "--", str(renamed)])


def test_lm_eval_scores_each_model_beside_the_teacher(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_tiny(tmp_path / "teacher", 0), save_tiny(tmp_path / "student", 1)
    out = tmp_path / "scores.json"
    argv = ["--lm-eval", "kd_heldout_choice", "--lm-eval-limit", "4", "--teacher"]
    argv += [str(tmp_path / "teacher"), "--out", str(out), "--", str(tmp_path / "student")]
    rows = main(argv)

    assert [(row["model"], row["teacher"]) for row in rows] == [
        (str(tmp_path / "teacher"), True),
        (str(tmp_path / "student"), False),
    ]
    assert json.loads(out.read_text()) == {"lm_eval": ["kd_heldout_choice"], "rows": rows}
    teacher, student = (row["scores"]["kd_heldout_choice"] for row in rows)
    assert set(student) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert all(value in (0, 0.25, 0.5, 0.75, 1) for value in (student["acc"], teacher["acc"]))
    table = capsys.readouterr().out
    assert "| task | metric | model | value | ± stderr | ÷ teacher |" in table
    ratio = f"{student['acc'] / teacher['acc']:.3f}" if teacher["acc"] else "—"
    line = f"| kd_heldout_choice | acc | {tmp_path / 'student'} | {student['acc']:.4f} | "
    assert f"{line}{student['acc_stderr']:.4f} | {ratio} |" in table


def test_lm_eval_of_a_hub_id_out_of_reach_is_refused_before_any_model_loads(
    tmp_path, monkeypatch
) -> None:
    """lm-eval met an unreachable id only when loading it: a traceback after the teacher's whole
    pass (`--files` refused it up front; probe 33)."""
    from lightning_kd.launch import evaluate
    from lightning_kd.utils.refusal import Refused

    def unreachable(location, *args, **kwargs):
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {location}.\nmore")

    monkeypatch.setattr(evaluate.AutoConfig, "from_pretrained", unreachable)
    monkeypatch.setattr(evaluate, "score_models", lambda *args: pytest.fail("scored"))
    save_tiny(tmp_path / "student", 1)
    argv = ["--lm-eval", "kd_heldout_choice", "--", str(tmp_path / "student"), "org/absent"]
    with pytest.raises(Refused, match=r"model org/absent: We couldn't connect to .* org/absent\.$"):
        main(argv)


CUSTOM = """
from transformers import LlamaConfig, LlamaForCausalLM


class OwnConfig(LlamaConfig):
    model_type = "ownllama"


class OwnForCausalLM(LlamaForCausalLM):
    config_class = OwnConfig
"""


def save_custom(tmp_path, monkeypatch):
    """A tiny Llama of code of its own (config.json's auto_map), saved with its module."""
    (tmp_path / "own_arch.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    import own_arch

    own_arch.OwnConfig.register_for_auto_class()
    own_arch.OwnForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    config = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
    torch.manual_seed(0)
    model = own_arch.OwnForCausalLM(own_arch.OwnConfig(**config))
    model.save_pretrained(tmp_path / "own")
    byte_tokenizer().save_pretrained(tmp_path / "own")
    return model.eval()


def test_a_model_of_code_of_its_own_is_scored_with_trust_remote_code(tmp_path, monkeypatch) -> None:
    """A custom architecture train distils could not be scored: transformers told the user to
    pass trust_remote_code=True, which evaluate had no way to (probe 45)."""
    model = save_custom(tmp_path, monkeypatch)
    text = tmp_path / "heldout.jsonl"
    text.write_text("".join(json.dumps({"text": line}) + "\n" for line in TEXT.split(". ")))
    argv = ["--files", str(text), "--block-size", "32", "--", str(tmp_path / "own")]
    with pytest.raises(
        Refused, match=r"refused:\n  model .*own runs code of its own .*--trust-re"
    ) as no:
        main(argv)
    assert "trust_remote_code=True" not in str(no.value)  # transformers' advice, for Python
    [row] = main(["--trust-remote-code", *argv])
    plain = save_tiny(tmp_path / "plain", 0)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(tmp_path / "plain")
    [same] = main([*argv[:-1], str(tmp_path / "plain")])
    assert row["bits_per_byte"] == pytest.approx(same["bits_per_byte"], rel=1e-6)
