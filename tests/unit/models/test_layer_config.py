"""A student of some of the teacher's layers: what hangs on a layer's index moves with it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, Qwen2MoeConfig, SmolLM3Config

from lightning_kd.models.layer_config import pruned_config
from lightning_kd.models.loading import StudentSpec
from lightning_kd.models.student import student_from_teacher

SMALL = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}


def test_smollm3_layers_keep_their_rotary_positions_or_their_lack() -> None:
    """SmolLM3's last layer of four has no rotary positions: copied as the student's second it
    kept the teacher's list, [1, 1, 1, 0], and ran with them (a silent other function)."""
    config = SmolLM3Config(num_hidden_layers=4, intermediate_size=64, pad_token_id=0, **SMALL)
    assert config.no_rope_layers == [1, 1, 1, 0]
    teacher = AutoModelForCausalLM.from_config(config)
    student = student_from_teacher(teacher, [0, 3])
    assert student.config.no_rope_layers == [1, 0]
    assert [layer.self_attn.use_rope for layer in student.model.layers] == [1, 0]


@pytest.mark.parametrize("indices", [[0, 3], [1, 2], [2, 1, 0]])
def test_qwen2_moe_layers_keep_their_kind(indices: list[int]) -> None:
    """Every second layer has experts (decoder_sparse_step=2): layers [1, 2] crashed in
    load_state_dict, a sparse layer copied where the student's config built a dense one."""
    config = Qwen2MoeConfig(
        num_hidden_layers=4,
        decoder_sparse_step=2,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        **SMALL,
    )
    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_config(config)
    student = student_from_teacher(teacher, indices)
    kinds = [type(layer.mlp).__name__ for layer in teacher.model.layers]
    assert [type(layer.mlp).__name__ for layer in student.model.layers] == [
        kinds[i] for i in indices
    ]
    assert student.config.decoder_sparse_step == 1


def test_gpt2_attention_scaled_by_the_layer_index_refuses_a_moved_layer() -> None:
    config = GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=64)
    config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(ValueError, match=r"teacher layer 3 as student layer 1"):
        pruned_config(config, [0, 3])
    assert pruned_config(config, [0, 1]).num_hidden_layers == 2  # the first layers keep theirs


def test_diffllama_layers_initialised_from_their_index_refuse_a_moved_layer() -> None:
    """DiffLlama's λ comes from the layer's index: a copied layer computed something else, with
    equal weights, silently (0.13 off the teacher's logits with layers [0, 3]; probe 31)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("diffllama", num_hidden_layers=4, intermediate_size=64, **SMALL)
    with pytest.raises(ValueError, match=r"λ is initialised from its index.*layer 3 as student"):
        pruned_config(config, [0, 3])
    assert pruned_config(config, [0, 1]).num_hidden_layers == 2


@pytest.mark.parametrize("layers", [[], [0.5], [True, 2], ["0"]])
def test_layer_indices_that_are_not_integers_are_named(layers) -> None:
    """[0.5] reached range() as a raw TypeError from Distiller.from_specs."""
    with pytest.raises(ValueError, match=r"student.layers=.*: list teacher layer indices"):
        StudentSpec(layers=layers)
    StudentSpec(layers=[0, 3])


@pytest.mark.parametrize("indices", [[0, 3], [0, 2], [1, 3]])
def test_gpt_neo_layers_keep_their_global_or_local_attention(indices: list[int], tmp_path) -> None:
    """GPT-Neo reads a layer's kind from ``attention_layers[index]``: [0, 2] (global, global)
    ran as (global, local) silently, and saving the student failed for the list's length
    (probe 31). The saved student is rebuilt from ``attention_types``."""
    from transformers import GPTNeoConfig

    config = GPTNeoConfig(
        vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, window_size=8,
        attention_types=[[["global", "local"], 2]], max_position_embeddings=64,
    )  # fmt: skip
    teacher = AutoModelForCausalLM.from_config(config).eval()
    student = student_from_teacher(teacher, indices).eval()
    kinds = [config.attention_layers[i] for i in indices]
    assert student.config.attention_layers == kinds
    sliced = AutoModelForCausalLM.from_config(config).eval()
    sliced.load_state_dict(teacher.state_dict())
    sliced.transformer.h = torch.nn.ModuleList([sliced.transformer.h[i] for i in indices])
    ids = torch.randint(0, 64, (1, 24))  # longer than the local window
    with torch.no_grad():
        expected = sliced(ids, use_cache=False).logits
        assert torch.equal(student(ids, use_cache=False).logits, expected)
    student.save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.attention_layers == kinds


def test_a_per_layer_list_the_config_derives_is_left_to_it() -> None:
    """Mamba's ``layer_types`` is a read-only property: setting it was an AttributeError."""
    from transformers import MambaConfig

    config = MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=4)
    student = student_from_teacher(AutoModelForCausalLM.from_config(config), [0, 3])
    assert student.config.layer_types == config.layer_types[:2]  # one kind: derived alike


@pytest.mark.parametrize(("indices", "fits"), [([0, 3], True), ([1, 2, 3], True), ([3, 0], False)])
def test_deepseek_dense_first_layers_are_counted_again(indices: list[int], fits: bool) -> None:
    """DeepSeek-V3 makes its first ``first_k_dense_replace`` layers dense: the default student
    (first and last) never fit. Kept dense-first, the count is rewritten; otherwise it is a
    refusal (exit 2) naming the layers, not a ValueError traceback (probe 31)."""
    from transformers import DeepseekV3Config

    from lightning_kd.utils.refusal import Refused

    config = DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, first_k_dense_replace=2,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=16,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    )  # fmt: skip
    teacher = AutoModelForCausalLM.from_config(config)
    kinds = [type(layer.mlp).__name__ for layer in teacher.model.layers]
    if not fits:
        with pytest.raises(Refused, match=r"the teacher's layers \[3, 0\] do not fit"):
            student_from_teacher(teacher, indices)
        return
    student = student_from_teacher(teacher, indices)
    assert [type(layer.mlp).__name__ for layer in student.model.layers] == [
        kinds[i] for i in indices
    ]


def test_a_family_whose_depth_shapes_weights_outside_its_layers_is_refused_as_such() -> None:
    """Gemma 4's per-layer input embeddings are as wide as its depth: no choice of layers fits,
    so the advice to choose others could not work (probe 31)."""
    from transformers import AutoConfig

    from lightning_kd.utils.refusal import Refused

    config = AutoConfig.for_model(
        "gemma4_text", vocab_size=64, vocab_size_per_layer_input=64, hidden_size=32,
        hidden_size_per_layer_input=8, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    teacher = AutoModelForCausalLM.from_config(config)
    with pytest.raises(Refused, match="cannot be built with 2 of the teacher's layers") as error:
        student_from_teacher(teacher, [0, 1])
    assert "embed_tokens_per_layer" in str(error.value) and "student.config" in str(error.value)


def test_a_copied_layer_that_computes_otherwise_is_refused_by_its_update(monkeypatch) -> None:
    """The check behind the families named above: DiffLlama's λ, taken off the named list,
    is still found, since each student layer handed its source layer's input updates it
    otherwise; the same layers at their own indices pass (probe 31)."""
    from transformers import AutoConfig

    from lightning_kd.models import layer_config
    from lightning_kd.models.copy_check import check_copied_layers
    from lightning_kd.utils.refusal import Refused

    monkeypatch.setattr(layer_config, "INDEXED", {})
    config = AutoConfig.for_model("diffllama", num_hidden_layers=4, intermediate_size=64, **SMALL)
    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_config(config).eval()
    check_copied_layers(teacher, student_from_teacher(teacher, [0, 1]), [0, 1])
    moved = student_from_teacher(teacher, [0, 3])
    with pytest.raises(Refused, match="teacher layer 3, copied as student layer 1, computes"):
        check_copied_layers(teacher, moved, [0, 3])
    for dtype in (torch.float32, torch.bfloat16):  # a plain family passes, bf16's rounding too
        llama = AutoModelForCausalLM.from_config(
            AutoConfig.for_model("llama", num_hidden_layers=4, intermediate_size=64, **SMALL)
        ).to(dtype)
        check_copied_layers(llama, student_from_teacher(llama, [3, 0]), [3, 0])


def test_per_layer_overrides_and_mlp_kinds_move_with_their_layers(tmp_path) -> None:
    """NeoMME's per-layer windows stayed in the teacher's order ([257, 1025, full] for layers
    [0, 2, 3]: built, trained); EXAONE-MoE's mlp_layer_types stayed whole, and the student
    trained, then failed to save (probe 45)."""
    from transformers import AutoConfig, AutoModel

    neomme = AutoConfig.for_model("neomme", num_hidden_layers=4, intermediate_size=64, **SMALL)
    teacher = AutoModel.from_config(neomme)
    windows = [layer.self_attn.sliding_window for layer in teacher.layers]
    for indices in ([0, 2, 3], [1, 2, 3]):
        student = student_from_teacher(teacher, indices)
        assert [layer.self_attn.sliding_window for layer in student.layers] == [
            windows[i] for i in indices
        ]
    exaone = AutoConfig.for_model(
        "exaone_moe", num_hidden_layers=4, intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, **SMALL,
    )  # fmt: skip
    kinds = exaone.mlp_layer_types
    for indices in ([0, 3], [1, 2]):
        student = student_from_teacher(AutoModelForCausalLM.from_config(exaone), indices)
        assert student.config.mlp_layer_types == [kinds[i] for i in indices]
        student.save_pretrained(tmp_path / "-".join(map(str, indices)))


def test_the_copy_check_runs_past_the_longest_window() -> None:
    """16 tokens missed a copied layer whose window of 20 came from its index (probe 45): the
    probe runs 128 tokens at least, and past a window the config states, within its positions."""
    from transformers import AutoConfig

    from lightning_kd.models.copy_check import check_copied_layers, length
    from lightning_kd.utils.refusal import Refused

    assert length(AutoConfig.for_model("llama", **SMALL)) == 128
    assert length(AutoConfig.for_model("mistral", sliding_window=300, **SMALL)) == 302
    assert (
        length(
            AutoConfig.for_model(
                "mistral", sliding_window=300, max_position_embeddings=200, **SMALL
            )
        )
        == 200
    )
    gemma2 = AutoConfig.for_model(
        "gemma2", num_hidden_layers=2, intermediate_size=64, sliding_window=20, head_dim=8,
        layer_types=["sliding_attention", "sliding_attention"], **SMALL,
    )  # fmt: skip
    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_config(gemma2).eval()
    student = student_from_teacher(teacher, [0, 1])
    check_copied_layers(teacher, student, [0, 1])
    student.config.layer_types = ["sliding_attention", "full_attention"]  # as an index decides
    with pytest.raises(Refused, match="teacher layer 1, copied as student layer 1, computes"):
        check_copied_layers(teacher, student, [0, 1])


def test_the_decoder_layers_are_the_list_of_blocks_not_a_per_layer_list_before_it() -> None:
    """A custom model's per-layer gates, declared before its blocks, were taken for them
    (probe 45): the list of num_hidden_layers modules holding the most parameters is."""
    from types import SimpleNamespace

    from lightning_kd.models.layer_config import decoder_layers

    class Gated(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(num_hidden_layers=2)
            self.gates = torch.nn.ModuleList(torch.nn.Linear(1, 1) for _ in range(2))
            self.body = torch.nn.Module()
            self.body.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    model = Gated()
    assert decoder_layers(model) == ("body.layers", model.body.layers)
