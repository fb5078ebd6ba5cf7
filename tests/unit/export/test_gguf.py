"""export.gguf: the smoke model written as GGUF and read back by transformers' GGUF loader (the
one the teacher goes through) scores held-out text as the model does; what a GGUF cannot hold is
refused by name, and a failed write leaves nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from lightning_kd.cli import main
from lightning_kd.evaluation.perplexity import documents_of, nll_sum, windows_of
from lightning_kd.export.gguf import (
    export_saved,
    exported_here,
    gguf_architecture_errors,
    write_gguf,
)
from lightning_kd.export.gguf_names import gguf_path
from lightning_kd.export.gguf_vocab import GGUFFile
from lightning_kd.models.loading import byte_tokenizer, model_from_config
from lightning_kd.utils.refusal import Refused
from tests.conftest import ROOT, TEXT, TINY_GPT2
from tests.unit.cli.test_refused_values import small_gguf

HELD_OUT = (
    "A river runs past the old mill, and in spring the water rises over the stones. "
    "Children walk along the bank to school; the miller waves from his window. "
    "In winter the wheel stops, the ice grows thick, and the village is quiet. "
) * 6
"""Text the model never trains on (it trains on ``TEXT``)."""
LIMITS = {"f16": 0.005, "q8_0": 0.02}
"""The largest relative change of held-out perplexity each type may make."""


def smoke_model(layers: int = 2, steps: int = 40):
    """``debug=smoke``'s model (the tiny_llama teacher's config, the smoke student's 2 layers),
    trained briefly on ``TEXT``: a peaked model shows weight errors a random one hides."""
    config = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/teacher/tiny_llama.yaml"))
    torch.manual_seed(0)
    model = model_from_config({**config["config"], "num_hidden_layers": layers}, "causal_lm")
    tokenizer = byte_tokenizer()
    ids = torch.tensor(tokenizer(TEXT)["input_ids"])
    blocks = ids[: len(ids) // 64 * 64].view(-1, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        batch = blocks[torch.arange(8) + 8 * step % (len(blocks) - 8)]
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The trained smoke model saved as a run exports it, and its two GGUFs beside it."""
    directory = tmp_path_factory.mktemp("run") / "student"
    model, tokenizer = smoke_model()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    for kind in LIMITS:
        export_saved(directory, kind)
    return directory


def held_out_perplexity(model, tmp_path: Path) -> float:
    text = tmp_path / "held_out.txt"
    text.write_text(HELD_OUT)
    windows = windows_of(documents_of([str(text)], "text"), byte_tokenizer(), 64, "held-out")
    return math.exp(nll_sum(model, windows, batch_size=8) / windows.tokens)


@pytest.mark.parametrize("kind", LIMITS)
def test_the_gguf_scores_held_out_text_as_the_model_does(saved, kind, tmp_path) -> None:
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    gguf = gguf_path(saved, kind)
    assert gguf == saved.parent / f"student.{kind}.gguf"
    back = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    reference = held_out_perplexity(model, tmp_path)
    assert reference < 60  # trained: far from a random model's 257
    assert abs(held_out_perplexity(back, tmp_path) / reference - 1) < LIMITS[kind]


def test_f16_holds_each_tensor_to_f16_rounding_and_norms_whole(saved) -> None:
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    gguf = gguf_path(saved, "f16")
    back = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).state_dict()
    for key, tensor in model.state_dict().items():
        # The loader permutes the query and key rows back: an exact round trip, as f16 allows.
        assert torch.equal(back[key], tensor.half().float() if tensor.dim() > 1 else tensor), key
    assert back["lm_head.weight"].data_ptr() == back["model.embed_tokens.weight"].data_ptr()


@pytest.mark.parametrize("kind", LIMITS)
def test_the_file_is_laid_out_as_llama_cpps_converter_writes_it(saved, kind) -> None:
    reader = GGUFReader(gguf_path(saved, kind))
    types = {tensor.name: tensor.tensor_type for tensor in reader.tensors}
    assert "output.weight" not in types  # tied: the head is the token embedding
    wanted = GGMLQuantizationType.F16 if kind == "f16" else GGMLQuantizationType.Q8_0
    for name, stored in types.items():
        one_d = name.endswith("_norm.weight")
        assert stored == (GGMLQuantizationType.F32 if one_d else wanted), name
    assert len(types) == 2 * 9 + 2  # nine per block, the embedding and the final norm
    fields = {key: field.contents() for key, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == 2 and fields["llama.embedding_length"] == 64
    assert fields["llama.attention.head_count_kv"] == 2 and fields["llama.context_length"] == 512
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.merges"] == []
    assert fields["tokenizer.ggml.eos_token_id"] == 256


def test_the_byte_tokenizer_reads_back_with_the_same_ids(saved) -> None:
    gguf = gguf_path(saved, "q8_0")
    back = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "Héllo, wörld 42!<eos>\n\tdone"
    assert back(text)["input_ids"] == byte_tokenizer()(text)["input_ids"]
    assert back.eos_token == "<eos>" and back.pad_token == "<eos>"


def trained_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE with merges and SmolLM2's pre-tokenizer (digits one by one)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet
    )
    backend.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


def test_a_bpe_tokenizer_keeps_its_merges_and_is_named_for_llama_cpp(tmp_path) -> None:
    tokenizer = trained_bpe()
    model = model_from_config({**TINY_LLAMA_CONFIG, "vocab_size": len(tokenizer)}, "causal_lm")
    path = write_gguf(model, tokenizer, tmp_path / "bpe.f16.gguf", "f16")
    fields = {key: field.contents() for key, field in GGUFReader(path).fields.items()}
    assert fields["tokenizer.ggml.pre"] == "smollm"
    assert len(fields["tokenizer.ggml.merges"]) == len(tokenizer) - 257
    back = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    text = "The quick brown fox judges my vow, and how quick!"
    assert back(text)["input_ids"] == tokenizer(text)["input_ids"]


TINY_LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
}


def test_another_architecture_is_refused_by_name_and_nothing_is_written(tmp_path) -> None:
    gpt2 = model_from_config(dict(TINY_GPT2), "causal_lm")
    with pytest.raises(Refused) as refused:
        write_gguf(gpt2, byte_tokenizer(), tmp_path / "gpt2.q8_0.gguf", "q8_0")
    assert "the student is a gpt2 model (model_type='gpt2')" in str(refused.value)
    assert "convert_hf_to_gguf.py" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_weight_beyond_f16_is_refused_by_name_and_nothing_is_written(saved, tmp_path) -> None:
    """f16 turned it into inf: a file whose every logit was NaN, written with "wrote" and
    exit 0 (numpy's overflow warning the only sign)."""
    model = AutoModelForCausalLM.from_pretrained(saved)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = 1e6
    tokenizer = AutoTokenizer.from_pretrained(saved)
    with pytest.raises(
        Refused, match=r"weights \['model.layers.0.mlp.down_proj.weight \(1e\+06\)'\]"
    ):
        write_gguf(model, tokenizer, tmp_path / "big.f16.gguf", "f16")
    write_gguf(model, tokenizer, tmp_path / "big.q8_0.gguf", "q8_0")  # its f16 scale: 1e6 / 127
    assert [p.name for p in tmp_path.iterdir()] == ["big.q8_0.gguf"]


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_a_weight_of_nan_or_infinity_is_refused_by_name_and_nothing_is_written(
    saved, kind, tmp_path
) -> None:
    """NaN compared False with the f16 limit, and a norm's inf is stored in f32: a damaged
    student was written with "wrote" and exit 0 (probe 59)."""
    model = AutoModelForCausalLM.from_pretrained(saved)
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight[0, :4] = float("nan")
        model.model.norm.weight[0] = float("inf")
    tokenizer = AutoTokenizer.from_pretrained(saved)
    names = r"\['model.layers.0.self_attn.v_proj.weight', 'model.norm.weight'\] hold NaN"
    with pytest.raises(Refused, match=names):
        write_gguf(model, tokenizer, tmp_path / f"nan.{kind}.gguf", kind)
    assert list(tmp_path.iterdir()) == []


def test_llama_variants_it_does_not_write_are_named() -> None:
    model = model_from_config({**TINY_LLAMA_CONFIG, "vocab_size": 257}, "causal_lm")
    model.config.hidden_act = "gelu"
    model.config.attention_bias = True
    errors = gguf_architecture_errors(model.config)
    assert len(errors) == 2
    assert "hidden_act is 'gelu'" in errors[1] and "attention_bias is True" in errors[0]


def test_a_rope_scaling_given_without_its_base_is_refused_not_a_crash() -> None:
    """student.config={rope_scaling: {rope_type: linear, ...}} leaves the base unset: float(None)
    was a TypeError in the pre-training check."""
    config = {**TINY_LLAMA_CONFIG, "vocab_size": 257}
    model = model_from_config(config, "causal_lm")
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0}
    model.config.rope_theta = None
    errors = gguf_architecture_errors(model.config)
    assert any("linear" in error for error in errors), errors


def test_a_tokenizer_a_gguf_cannot_express_is_refused(tmp_path) -> None:
    model = model_from_config({**TINY_LLAMA_CONFIG, "vocab_size": 257}, "causal_lm")
    lowercasing = byte_tokenizer()
    lowercasing.backend_tokenizer.normalizer = normalizers.Lowercase()
    with pytest.raises(Refused, match=r"normalizes text first \(Lowercase\)"):
        write_gguf(model, lowercasing, tmp_path / "a.f16.gguf", "f16")
    with pytest.raises(Refused, match="ids up to 319 for a model of 257 embedding rows"):
        write_gguf(model, trained_bpe(), tmp_path / "b.f16.gguf", "f16")
    assert list(tmp_path.iterdir()) == []
    saved = tmp_path / "student"  # saved: refused before its weights load (they are no file)
    model.config.save_pretrained(saved)
    lowercasing.save_pretrained(saved)
    (saved / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(Refused, match=r"normalizes text first \(Lowercase\)"):
        export_saved(saved, "f16")
    assert not list(tmp_path.glob("*.gguf"))


def test_a_write_that_fails_leaves_the_previous_file_or_none(saved, tmp_path, monkeypatch):
    model, tokenizer = smoke_model(layers=1, steps=0)
    target = tmp_path / "student.q8_0.gguf"
    target.write_bytes(b"the previous export")

    def full_disk(self, **_):
        self.fout[0].write(b"half a tensor")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(GGUFFile, "write_tensors_to_file", full_disk)
    with pytest.raises(OSError, match=f"no space left on {target}: free space and export again"):
        write_gguf(model, tokenizer, target, "q8_0")
    assert target.read_bytes() == b"the previous export"
    assert [path.name for path in tmp_path.iterdir()] == [target.name]


def test_lightning_kd_export_writes_what_a_run_writes(saved, tmp_path, capsys) -> None:
    out = tmp_path / "copy.f16.gguf"
    assert main(["export", str(saved), "--gguf", "f16", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes() == gguf_path(saved, "f16").read_bytes()
    assert exported_here(out), "marked as an export: a later one may replace it"
    assert main(["export", str(saved), "--gguf", "q8_0", "--out", str(out)]) == 0  # replaced


def test_an_export_written_before_its_mark_is_replaced_where_exports_go(saved, tmp_path, capsys):
    """A GGUF at the path the command writes by default is an earlier export (those written
    before exports were marked hold no mark); elsewhere, an unmarked GGUF is refused, the advice
    another path than the one refused."""
    default = gguf_path(saved, "f16")
    unmarked = small_gguf(default, exported=False)
    assert main(["export", str(saved), "--gguf", "f16"]) == 0
    assert exported_here(unmarked)
    mine = small_gguf(tmp_path / "student.f16.gguf", exported=False)
    assert main(["export", str(saved), "--gguf", "f16", "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"--out {mine} exists and is not a file this command writes" in err
    assert f"e.g. --out {tmp_path / 'student.f16.new.gguf'}" in err


def test_an_untied_head_is_written_as_its_own_tensor(tmp_path) -> None:
    config = {**TINY_LLAMA_CONFIG, "vocab_size": 257, "tie_word_embeddings": False}
    model = model_from_config(config, "causal_lm")
    path = write_gguf(model, byte_tokenizer(), tmp_path / "untied.f16.gguf", "f16")
    assert "output.weight" in {tensor.name for tensor in GGUFReader(path).tensors}
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).state_dict()
    assert torch.equal(back["lm_head.weight"], model.lm_head.weight.half().float())


def test_a_checkpoint_without_its_head_is_refused_not_exported_with_a_random_one(
    tmp_path, capsys
) -> None:
    """A bare ``LlamaModel`` saved without ``lm_head``: from_pretrained started the head at
    random, said so in a log line, and the export wrote it."""
    config = {**TINY_LLAMA_CONFIG, "vocab_size": 257, "tie_word_embeddings": False}
    model = model_from_config(config, "causal_lm")
    directory = tmp_path / "headless"
    model.model.save_pretrained(directory)  # the body alone
    byte_tokenizer().save_pretrained(directory)
    assert main(["export", str(directory), "--gguf", "f16"]) == 2
    err = capsys.readouterr().err
    assert "lacks 1 weight(s) that LlamaForCausalLM needs (lm_head.weight)" in err
    assert "Traceback" not in err and not list(tmp_path.glob("*.gguf"))


@pytest.mark.parametrize(
    "config", ['{"model_type": "llama",', "{}"], ids=["not JSON", "no model_type"]
)
def test_a_config_that_is_no_model_config_is_refused(saved, config, tmp_path, capsys) -> None:
    directory = tmp_path / "student"
    directory.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (directory / name).write_bytes((saved / name).read_bytes())
    (directory / "config.json").write_text(config)
    assert main(["export", str(directory), "--gguf", "f16"]) == 2
    err = capsys.readouterr().err
    assert f"{directory / 'config.json'} is no model config transformers can read" in err
    assert "Traceback" not in err


def test_dot_and_dot_dot_name_the_folders_they_stand_for(tmp_path, monkeypatch) -> None:
    """``export ..`` from inside a student's subfolder wrote a hidden ``...f16.gguf`` inside
    the student; ``export .`` was a ValueError (an empty name)."""
    (tmp_path / "student" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "student" / "sub")
    assert gguf_path(Path(".."), "f16") == tmp_path / "student.f16.gguf"
    monkeypatch.chdir(tmp_path / "student")
    assert gguf_path(Path("."), "q8_0") == tmp_path / "student.q8_0.gguf"


def test_special_ids_the_tokenizer_lost_come_from_the_config_and_no_eos_is_refused(
    saved, tmp_path
) -> None:
    """A student saved without tokenizer_config.json: its tokenizer knows no special tokens, and
    the GGUF was written without an EOS id (llama.cpp then never stops an answer)."""
    directory = tmp_path / "student"
    directory.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (directory / name).write_bytes((saved / name).read_bytes())
    path = export_saved(directory, "f16")
    fields = GGUFReader(path).fields
    eos = AutoModelForCausalLM.from_pretrained(saved).config.eos_token_id
    assert int(fields["tokenizer.ggml.eos_token_id"].parts[-1][0]) == eos
    model, tokenizer = smoke_model(layers=1, steps=0)
    model.config.eos_token_id = None
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(Refused, match="neither the tokenizer nor the model's config has an EOS"):
        write_gguf(model, bare, tmp_path / "noeos.f16.gguf", "f16")


def test_a_student_of_code_of_its_own_is_refused_by_its_type_without_running_it(
    tmp_path, monkeypatch
) -> None:
    """export --gguf asked transformers' "[y/N]" to run the model's code, then advised saving
    it again (probe 45): its model_type is read from config.json, and refused as any other."""
    from lightning_kd.export.gguf import saved_errors
    from tests.unit.evaluation.test_evaluate import save_custom

    save_custom(tmp_path, monkeypatch)
    [error] = saved_errors(tmp_path / "own")
    assert error.startswith("the student is a ownllama model (model_type='ownllama'): the GGUF")
    assert "convert_hf_to_gguf.py" in error
