"""Measuring saved models: perplexity (and bits per byte) on held-out text, answers to held-out
prompts judged by the teacher, and lm-eval's tasks (``harness.py``)."""
