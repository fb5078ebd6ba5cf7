"""Conversations rendered to text, read as ``data=text``: said, since the run cannot tell.

A common SFT dataset shape is a ``text`` column of conversations already rendered with a chat
template (``<|im_start|>user\n...<|im_end|>``). Read as text, a special token's string is text
(``encoding.py``): the student learns ``<``, ``|``, ``im``, ``_``, ... where the template writes
one control token, and every prompt token is scored like an answer's (probe 46). Right for
prose about chat formats, so it is a warning, said once per marker.
"""

from __future__ import annotations

import warnings

MARKERS = (
    "<|im_start|>",
    "<|start_header_id|>",
    "<start_of_turn>",
    "<|user|>",
    "<|assistant|>",
    "[INST]",
)
"""The turn markers of the common chat templates (ChatML, Llama 3, Gemma, Zephyr, Mistral)."""


def note_rendered_chat(text: str) -> None:
    """Warn where ``text`` (a document of ``data=text``) holds a chat template's turn marker."""
    marker = next((marker for marker in MARKERS if marker in text), None)
    if marker is None:
        return
    warnings.warn(
        f"data=text: a document holds the chat turn marker {marker!r}, a conversation rendered "
        "to text: its markers are trained as characters, not the template's control tokens, "
        "and its prompts are scored like its answers; read conversations with data=chat from "
        "rows of messages (the answers alone scored), or let it be for text about chat formats",
        stacklevel=3,
    )
