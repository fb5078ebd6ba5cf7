"""What ``distill.teacher_cache=auto`` can tell from a config alone: whether it is still
``auto``, and why a run keeps its teacher online whatever its length (``teacher_cache.py``
weighs the rest: the teacher's reads per block)."""

from __future__ import annotations

from omegaconf import DictConfig

AUTO = "auto"


def unresolved(value: object) -> bool:
    """Whether ``distill.teacher_cache`` is ``auto`` (not yet resolved by a run)."""
    return value == AUTO


def why_online(cfg: DictConfig) -> str | None:
    """Why ``cfg`` trains with the teacher online whatever its length, or None."""
    distill = cfg.distill
    reasons = (
        (distill.kd_weight == 0, "distill.kd_weight=0: training uses no teacher logits"),
        (distill.get("on_policy", 0) > 0, "on-policy KD scores the student's own completions"),
        (not distill.get("chunked", True), "distill.chunked=false computes full teacher logits"),
        (cfg.teacher.get("task", "causal_lm") != "causal_lm", "only causal LM logits are cached"),
        (str(cfg.data.get("_target_", "")).endswith("ChatDataModule"), "chat data is not cached"),
        (cfg.data.get("streaming") is True, "a streamed corpus has no fixed blocks to cache"),
    )
    return next((reason for applies, reason in reasons if applies), None)
