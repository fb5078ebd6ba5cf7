"""Shared fixtures: tiny models built from config and a small text corpus, all in milliseconds."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch import Trainer
from transformers import PreTrainedTokenizerFast

from lightning_kd.data.text import TextDataModule
from lightning_kd.launch.config import compose_config
from lightning_kd.models.loading import TeacherSpec, byte_tokenizer
from lightning_kd.training.module import DistillationModule

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION = ROOT / "tests" / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tiers: tests under ``tests/integration`` (and tests marked ``integration`` elsewhere:
    they run a command in a subprocess) are the integration tier, the rest the unit tier;
    tests marked ``slow`` are the slow tier alone, out of the default run."""
    for item in items:
        if item.get_closest_marker("slow") is not None:
            continue
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def root_logging_restored():
    """The root logger as it was before the test: a command run in-process configures Hydra's
    job logging, a console handler on the ``sys.stdout`` of that moment, a test's captured
    stream closed when the test ends. Where ``CI`` is set, transformers' logger propagates to
    the root, and its next warning in a later test met that closed stream as a traceback."""
    root = logging.getLogger()
    level = root.level
    yield
    # Hydra's console handler is a plain StreamHandler; pytest's own (LogCaptureHandler, ...)
    # are subclasses, added and removed around each phase by pytest itself.
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 257,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}

# GPT-2 computes everything in the parameters' dtype (Llama's RMSNorm computes in fp32 whatever
# the input), so fp64 tests of whole-model gradients use it. Dropout off: steps are compared.
TINY_GPT2 = {
    "model_type": "gpt2",
    "vocab_size": 257,
    "n_embd": 32,
    "n_layer": 4,
    "n_head": 4,
    "n_positions": 64,
    "tie_word_embeddings": True,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 256,
    "eos_token_id": 256,
}

TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. "
) * 20


@pytest.fixture
def tiny_teacher() -> TeacherSpec:
    # float32, not auto: a teacher loaded with no trainer takes what the machine computes fast,
    # bf16 on a CPU with native bf16, and the tests compare it with fp32 students and references.
    return TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32")


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny matrices on cores other work shares run several
    times faster than on threads that spin waiting for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def datasets_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``datasets`` offline, with its cache and the tokenized-data cache under ``tmp_path``, in
    this process; the environment a command run in a subprocess needs for the same."""
    import datasets

    env = {
        "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets"),
        "LIGHTNING_KD_CACHE": str(tmp_path / "kd_cache"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    monkeypatch.setenv("LIGHTNING_KD_CACHE", env["LIGHTNING_KD_CACHE"])
    # datasets reads both when imported: the values it holds are the ones to set.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(env["HF_DATASETS_CACHE"]))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return env


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    return path


def checkpoints_activations(model: torch.nn.Module) -> bool:
    """Whether any of the model's layers checkpoints its activations (either transformers API)."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def make_datamodule(files: list[Path], **kwargs) -> TextDataModule:
    """A byte-tokenized data module over ``files`` (block 32, batch 4 unless overridden)."""
    options = {"block_size": 32, "batch_size": 4, "val_fraction": 0.2} | kwargs
    return TextDataModule(byte_tokenizer(), files=[str(f) for f in files], **options)


def make_module(
    teacher: TeacherSpec, student: dict | None = None, teachers: list | None = None, **distill
) -> DistillationModule:
    """A module distilling ``teacher`` into ``debug=smoke``'s student (a 2-layer copy) with its
    objective — the CLI's defaults plus the smoke test's, logits only unless ``features`` is
    given (the default run's hidden-state matching is tested where it is named) — overridden by
    ``student`` and ``distill``, with ``teachers`` (a ``teachers`` list) if given; AdamW (lr
    1e-3)."""
    cfg = compose_config(["debug=smoke"])
    distill = {"features": None, **distill}
    return DistillationModule(
        teacher=teacher,
        student=instantiate(cfg.student, _convert_="all", **(student or {})),
        distill=instantiate(cfg.distill, _convert_="all", **distill),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        tokenizer=byte_tokenizer(),
        teachers=teachers,
    )


def make_trainer(tmp_path: Path | None = None, **kwargs) -> Trainer:
    """A quiet CPU trainer; checkpointing only when ``tmp_path`` is given."""
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 3,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": tmp_path is not None,
        "default_root_dir": tmp_path,
        "num_sanity_val_steps": 0,
    } | kwargs
    return Trainer(**options)


def sentencepiece_tokenizer(normalizer=None) -> PreTrainedTokenizerFast:
    """A SentencePiece-style tokenizer unlike :func:`byte_tokenizer`: ``▁`` for spaces, BPE merges
    learnt on :data:`TEXT`, ``<0xNN>`` byte pieces for what they do not cover, a BOS before
    every text (as Gemma's and Llama 2's); ``normalizer`` (a ``tokenizers`` normalizer) rewrites
    the text first."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    specials = ["<pad>", "<eos>", "<bos>"]
    space = normalizers.Replace(" ", "▁")
    steps = [space] if normalizer is None else [normalizer, space]

    def configured(backend: Tokenizer) -> Tokenizer:
        backend.normalizer = normalizers.Sequence(steps)
        backend.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
        return backend

    trained = configured(Tokenizer(models.BPE()))
    trained.train_from_iterator([TEXT], BpeTrainer(vocab_size=120, special_tokens=specials))
    state = json.loads(trained.to_str())["model"]
    vocab = dict(state["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    backend = configured(Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True)))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )


def byte_level_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE like SmolLM2's and GPT-2's (297 ids, EOS 0), whose merges include
    fragments of characters: "âĢ" is bytes E2 80, two thirds of "’" or "—"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(["it’s “quoted” — naïve café, ok " * 30, TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
