"""Measuring saved models: perplexity on held-out text, answers to held-out prompts judged by the
teacher."""
