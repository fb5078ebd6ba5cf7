"""Whether a model's config describes what a task distils, read before any weights load.

A causal-LM teacher or student must be a decoder that predicts each token from the ones before it.
transformers' ``AutoModelForCausalLM`` also builds BERT-like encoders (``BertLMHeadModel``),
whose attention reads both ways unless ``is_decoder`` is set: the run trained, exit 0, a student
whose logits saw the tokens they predict. An encoder-decoder (T5, BART) failed inside
transformers with a list of several hundred classes; a multimodal checkpoint (Gemma-3-4B and up)
with ``AttributeError: ... num_hidden_layers``.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from lightning_kd.models.loading import auto_class

BIDIRECTIONAL = frozenset(
    {
        "albert",
        "bert",
        "big_bird",
        "camembert",
        "data2vec-text",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "megatron-bert",
        "modernbert",
        "mpnet",
        "rembert",
        "roberta",
        "roberta-prelayernorm",
        "roc_bert",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)
"""Encoder families whose attention reads both ways unless the config says ``is_decoder``."""


def architecture_errors(config: PretrainedConfig, task: str, key: str) -> list[str]:
    """Why the model ``config`` describes (given by setting ``key``) cannot be distilled as
    ``task``; empty when it can."""
    kind = getattr(config, "model_type", type(config).__name__)
    if getattr(config, "is_encoder_decoder", False):
        return [
            f"{key}: an encoder-decoder model ({kind}) is not distilled here: choose a "
            "decoder-only causal LM (Llama, Qwen, Gemma, ...)"
        ]
    if getattr(config, "num_hidden_layers", None) is None and hasattr(config, "text_config"):
        return [
            f"{key}: a multimodal checkpoint ({kind}) holds its language model inside "
            "(config.text_config); distil a text-only model of the family (its causal LM "
            "checkpoint), or save the language model alone and give its directory"
        ]
    bidirectional = kind in BIDIRECTIONAL and not getattr(config, "is_decoder", False)
    if task == "causal_lm" and bidirectional:
        return [
            f"{key}: a {kind} model reads its text both ways, so as a causal LM its logits would "
            "see the tokens they predict: distil it as an encoder (teacher.task=encoder, as "
            "experiment=minilm does), or choose a decoder-only causal LM"
        ]
    return []


def checkpointing_errors(config: PretrainedConfig, task: str) -> list[str]:
    """Why ``student.activation_checkpointing=true`` cannot be turned on for the model
    ``config`` describes: a family whose transformers class has no activation checkpointing
    (openai-gpt, ctrl, xlnet, ...) raised its ValueError once the models had loaded, exit 1
    (probe 45). Empty where it can, or the class is not transformers' own (custom code)."""
    model_class = auto_class(task)._model_mapping.get(type(config), None)
    if model_class is None or getattr(model_class, "supports_gradient_checkpointing", True):
        return []
    return [
        f"student.activation_checkpointing=true: {model_class.__name__} "
        f"({getattr(config, 'model_type', '?')}) has no activation checkpointing in "
        "transformers; set student.activation_checkpointing=false"
    ]
