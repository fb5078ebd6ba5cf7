"""Copied students of tiny random teachers of many families, each checked layer by layer.

    python scripts/copied_layers_sweep.py [--families llama gpt2 ...]

For each transformers family below, a 4-layer (Gemma 3: 6) random teacher in fp32 and in bf16 gives
students of layers [0, 3], [1, 2] and [0, 1] (``models.student.student_from_teacher``), each run
through ``models.copy_check.check_copied_layers``. A line per family and dtype says ``ok`` or the
refusal. RecurrentGemma's [1, 2] are refused before the check, rightly: a recurrent and an
attention layer, where a 2-layer config builds two recurrent ones. Any other refusal is a false
alarm of the check, or a family that changed.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lightning_kd.models.copy_check import check_copied_layers
from lightning_kd.models.student import student_from_teacher
from lightning_kd.utils.refusal import Refused

ATTENTION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4}
ATTENTION |= {"num_attention_heads": 4, "num_key_value_heads": 2}
GPT = {"n_embd": 64, "n_layer": 4, "n_head": 4}
WINDOW = {"sliding_window": 4}
FAMILIES = {
    "llama": ATTENTION,
    "mistral": ATTENTION | WINDOW,
    "qwen2": ATTENTION | WINDOW | {"use_sliding_window": True, "max_window_layers": 2},
    "qwen3": ATTENTION | {"head_dim": 16},
    "qwen2_moe": ATTENTION
    | {"moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_experts": 4}
    | {"num_experts_per_tok": 2},
    "olmoe": ATTENTION | {"intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
    "gemma2": ATTENTION | WINDOW | {"head_dim": 16},
    "gemma3_text": ATTENTION | WINDOW | {"head_dim": 16, "num_hidden_layers": 6},
    "cohere": ATTENTION,
    "cohere2": ATTENTION | WINDOW,
    "starcoder2": ATTENTION | WINDOW,
    "olmo2": ATTENTION,
    "stablelm": ATTENTION,
    "granite": ATTENTION | {"residual_multiplier": 0.5, "logits_scaling": 2.0},
    "smollm3": ATTENTION | {"pad_token_id": 0},
    "phi3": ATTENTION | {"pad_token_id": 0},
    "phi": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4},
    "gpt_neox": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4}
    | {"num_attention_heads": 4, "rotary_pct": 0.25},
    "falcon": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4},
    "opt": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "ffn_dim": 128}
    | {"word_embed_proj_dim": 32},
    "gpt_neo": {"hidden_size": 64, "num_layers": 4, "num_heads": 4, "window_size": 4}
    | {"attention_types": [[["global", "local"], 2]]},
    "gpt2": GPT,
    "gptj": GPT | {"rotary_dim": 8},
    "gpt_bigcode": GPT,
    "bloom": {"hidden_size": 64, "n_layer": 4, "n_head": 4},
    "mamba": {"hidden_size": 64, "state_size": 8, "num_hidden_layers": 4},
    "recurrent_gemma": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4}
    | {"num_attention_heads": 4, "lru_width": 64, "attention_window_size": 4},
}
"""Tiny configs of each family (vocabulary 257), some with windows shorter than the probe."""
CHOICES = ([0, 3], [1, 2], [0, 1])


def outcome(teacher: torch.nn.Module, layers: list[int]) -> str:
    """``ok``, or the refusal of a student of ``teacher``'s ``layers``."""
    try:
        check_copied_layers(teacher, student_from_teacher(teacher, layers), layers)
    except Refused as refused:
        return f"refused: {str(refused)[:120]}"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    for family in parser.parse_args().families:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            config = AutoConfig.for_model(family, vocab_size=257, **FAMILIES[family])
            teacher = AutoModelForCausalLM.from_config(config).to(dtype).eval()
            found = {str(layers): outcome(teacher, layers) for layers in CHOICES}
            print(f"{family} {str(dtype).removeprefix('torch.')}: {found}", flush=True)


if __name__ == "__main__":
    main()
