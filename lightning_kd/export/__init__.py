"""A trained student in formats other than ``save_pretrained``'s: GGUF, for llama.cpp."""
