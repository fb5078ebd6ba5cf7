"""GGUF conversion: each file's content converted once, under its own sha256, and checked."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_kd.models import sources
from lightning_kd.models.sources import CONVERTED_SOURCE, convert_gguf
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
