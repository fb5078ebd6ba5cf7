"""What the student learns from: the logit divergence, its weight against plain CE, and the
feature-matching pairs. Built from ``conf/distill/`` and checked as it is built."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from lightning_kd.losses.divergences import get_divergence
from lightning_kd.losses.logits import LogitObjective

MIN_TEMPERATURE = 0.01
"""The least ``distill.temperature``: at 1e-30 the KD term was exactly 0.0 at every step."""


@dataclass
class DistillConfig:
    """What the student learns from: the logit divergence and its weight against plain CE."""

    divergence: str = "forward_kl"
    """forward_kl | reverse_kl | jsd | skew_kl | tvd (see ``lightning_kd.losses.divergences``)."""
    temperature: float = 1.0
    """Softmax temperature of the divergence; the term is multiplied by T² (Hinton et al.)."""
    kd_weight: float = 0.5
    """Weight of the divergence term."""
    ce_weight: float = 0.5
    """Weight of the student's own next-token cross-entropy (at T = 1)."""
    beta: float = 0.5
    """JSD mixture weight of the teacher: m = β p_t + (1 − β) p_s."""
    skew: float = 0.1
    """skew_kl mixture weight α of the teacher: KL(p_t ‖ α p_t + (1 − α) p_s)."""
    chunked: bool = True
    """Compute the logit losses from hidden states a chunk of tokens at a time (never holding
    ``[batch, seq, vocab]`` logits); false uses the models' full logits (for checking)."""
    chunk_size: int | None = None
    """Tokens per chunk; None picks about 8M logits per chunk (``losses.chunked``)."""
    compile: bool = True
    """Run the chunked loss's vocab-sized math through ``torch.compile`` (forward_kl and
    reverse_kl): one fused kernel per chunk instead of a dozen passes, after a one-off compile
    (≈15 s on a CPU). Falls back to eager, with a warning, where compiling fails."""
    features: str | list[dict[str, Any]] | None = None
    """Feature matching: ``spans`` (each layer of a copied student against the last teacher
    layer of the span it stands for; the commands' default), ``uniform`` (each against the teacher
    layer it was copied from) or a list of ``{student, teacher, loss, weight}`` module pairs
    (paths on the unwrapped Hugging Face models); None: logits only."""
    feature_loss: str = "cosine"
    """Default loss of a pair (each pair of ``spans`` and ``uniform``): cosine | mse | l1."""
    feature_weight: float = 1.0
    """Default weight of a pair (each pair of ``spans`` and ``uniform``)."""
    blockwise_passes: int = 0
    """Before end-to-end training, passes over the training blocks in which each layer of a
    student copied from the teacher learns alone to map the teacher's state entering the span of
    layers it stands for to the state leaving it (``repair.py``); 0: none. Not run on a resume."""
    blockwise_lr: float = 8e-3
    """Peak AdamW learning rate of the block-wise repair (5 % warmup, cosine to 0)."""
    projector: str = "linear"
    """Where a pair's widths differ: ``linear`` (a trained nn.Linear, student → teacher) or
    ``none`` (an error)."""
    teacher_cache: str | None = None
    """A directory written by ``lightning-kd cache`` for this run: the divergence runs
    over the teacher's cached top-k (+ tail) records and the teacher does not run. It is loaded
    once at the start — to build a copied student and check that the cache is its own (weights,
    tokenizer, data, block size, temperature; with ``distill.features``, the mapped teacher
    modules' outputs, written with ``cache.features=true``) — and released before training.
    ``auto`` (``conf/distill/default.yaml``): ``lightning-kd train`` finds or writes one in the
    shared cache directory (``cache.dir``, else ``~/.cache/lightning_kd/teacher_caches``), keyed
    by what the run reads, when the teacher would read each block a cache holds often enough
    for it to pay (``launch/teacher_cache.py``); built from Python, without that resolution,
    ``auto`` is the online teacher."""
    on_policy: float = 0.0
    """λ of on-policy / mixed KD (GKD): the probability that a training micro-batch's answers are
    replaced by the student's own sampled completions of its prompts (``on_policy.py``); 0: the
    dataset's answers only, 1: the student's only. Completions are scored by the divergence (and
    the features), never by ``ce_weight``'s CE, which trains on the dataset's answers alone."""
    on_policy_tokens: int = 128
    """Tokens the student samples at most per completion."""
    on_policy_temperature: float = 1.0
    """Sampling temperature of the student's completions."""
    on_policy_warmup: int = 0
    """Optimizer steps trained on the dataset's answers alone before λ applies (a warm start:
    a student that cannot answer yet samples little worth scoring)."""
    on_policy_teacher_top_k: int | None = None
    """Interleaved sampling (speculative KD, ``interleaved.py``): a token the student samples
    outside the teacher's top k is replaced by the teacher's own sample, so a weak student's
    completions stay text the teacher can judge. None: the student's samples as they are."""
    on_policy_seed: int = 0
    """Seeds which micro-batches are sampled and what (``conf/distill/default.yaml``: ``seed``)."""
    cross_tokenizer: str = "auto"
    """``auto``: when the student's tokenizer is not the teacher's (``student.source``, a
    pretrained ``student.path``), the teacher reads its own tokenisation of each batch and its
    distribution is compared at aligned positions (``distill/cross_tokenizer.py``); ``always``:
    that path even for one shared tokenizer (to check it: it then equals the same-tokenizer
    loss at ``cross_top_k`` = vocabulary)."""
    cross_loss: str = "hybrid"
    """``hybrid``: the run's divergence over the tokens both vocabularies spell alike (plus "any
    other token") and ULD over the rest, weighted ``cross_uld_weight``; ``uld``: ULD alone
    (Wasserstein-1 of the sorted distributions, Boizard et al. 2024); ``projected``: the run's
    divergence against the teacher's distribution projected onto the student's vocabulary (each
    teacher token credited to the student token its text starts with). See
    ``losses/cross_vocab.py``."""
    cross_top_k: int = 64
    """Teacher tokens kept per aligned position (its top k at the temperature)."""
    cross_uld_weight: float = 1.0
    """Weight of the hybrid's ULD term over the tokens without a twin."""
    cross_span_weight: float = 0.0
    """Weight of the span-level term (any ``cross_loss``): the binarised KL between the two
    models' probabilities of the text between consecutive aligned positions
    (``losses/cross_spans.py``); 0: none."""
    cross_min_aligned: float = 0.9
    """Refuse, before step 0, a teacher whose tokenisation spells back less than this share of
    the student's text bytes (tokenizers that normalise text differently)."""

    def __post_init__(self) -> None:
        if self.teacher_cache == "auto":  # unresolved: the command resolves it, not the object
            self.teacher_cache = None
        self._check_finite()
        get_divergence(self.divergence, beta=self.beta, skew=self.skew)  # raises on bad values
        self._check_on_policy()
        if not self.temperature >= MIN_TEMPERATURE:
            raise ValueError(
                f"distill.temperature={self.temperature}; it must be >= {MIN_TEMPERATURE} (below, "
                "the KD term's T² factor underflows to 0)"
            )
        for name in ("kd_weight", "ce_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"distill.{name}={getattr(self, name)}: must be >= 0")
        if learns_nothing(self.kd_weight, self.ce_weight, self.feature_weight, self.features):
            raise ValueError(NOTHING_TO_LEARN)
        if self.teacher_cache is not None:
            self._check_cached()
        # Each named alone, as the launch checks name it: the two are then said once.
        if self.blockwise_passes < 0:
            raise ValueError(f"distill.blockwise_passes={self.blockwise_passes}: must be >= 0")
        if self.blockwise_lr <= 0:
            raise ValueError(f"distill.blockwise_lr={self.blockwise_lr}: must be > 0")
        self._check_cross()
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(
                f"distill.chunk_size={self.chunk_size}; use null (auto) or a count >= 1"
            )

    def _check_finite(self) -> None:
        """Every float setting finite: a NaN passes each range check below (it compares false)."""
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(
                    f"distill.{field.name}={value}: give a finite number (default {field.default})"
                )

    @property
    def uses_teacher_in_training(self) -> bool:
        """Whether a training step needs the teacher at all (a CE-only run skips it)."""
        return self.kd_weight > 0 or bool(self.features)

    def _check_on_policy(self) -> None:
        if not 0.0 <= self.on_policy <= 1.0:
            raise ValueError(f"distill.on_policy={self.on_policy}: a probability, in [0, 1]")
        checks = (  # each bad one alone: the good ones were listed as if at fault (probe 36)
            ("on_policy_tokens", self.on_policy_tokens, self.on_policy_tokens >= 1, ">= 1"),
            (
                "on_policy_temperature",
                self.on_policy_temperature,
                self.on_policy_temperature > 0,
                "> 0",
            ),
            ("on_policy_warmup", self.on_policy_warmup, self.on_policy_warmup >= 0, ">= 0"),
        )
        if wrong := [
            f"distill.{key}={value}: must be {bound}" for key, value, ok, bound in checks if not ok
        ]:
            raise ValueError("; ".join(wrong))
        top_k = self.on_policy_teacher_top_k
        if top_k is not None and (top_k < 1 or self.on_policy == 0):
            raise ValueError(
                f"distill.on_policy_teacher_top_k={top_k}: the teacher's top k (>= 1) vetoes "
                "the student's sampled tokens, so it needs distill.on_policy > 0; or null"
            )
        if error := on_policy_weight_error(
            self.on_policy, self.kd_weight, self.feature_weight, self.features
        ):
            raise ValueError(error)
        if self.on_policy > 0 and self.teacher_cache is not None:
            raise ValueError(
                "distill.on_policy scores the student's own completions, which no teacher cache "
                "holds: drop distill.teacher_cache (the teacher must run)"
            )

    def _check_cross(self) -> None:
        from lightning_kd.losses.cross_vocab import LOSSES

        if self.cross_tokenizer not in ("auto", "always"):
            raise ValueError(
                f"distill.cross_tokenizer={self.cross_tokenizer!r}; choose auto (when the "
                "tokenizers differ) or always"
            )
        if self.cross_loss not in LOSSES:
            raise ValueError(f"distill.cross_loss={self.cross_loss!r}; choose one of {LOSSES}")
        bad = [
            f"distill.{key}={value} must be >= {low}"
            for key, value, low in (
                ("cross_top_k", self.cross_top_k, 1),
                ("cross_uld_weight", self.cross_uld_weight, 0),
                ("cross_span_weight", self.cross_span_weight, 0),
            )
            if value < low
        ]
        if bad:  # each bad one alone: the valid ones read as refused (probe 32)
            raise ValueError("; ".join(bad))
        if not 0.0 <= self.cross_min_aligned <= 1.0:
            raise ValueError(
                f"distill.cross_min_aligned={self.cross_min_aligned}: a share, in [0, 1]"
            )

    def cross_errors(self, repairs_from_source: bool = False, main: bool = True) -> list[str]:
        """What the cross-tokenizer path cannot serve in this config (empty: nothing);
        ``repairs_from_source``: the student was copied from ``student.source``, which the
        block-wise repair then reads instead of the teacher; ``main=False``: for one of several
        teachers, which hidden states, the repair and interleaved sampling never read."""
        errors = []
        if self.features and main:
            errors.append(
                "distill.features matches hidden states position by position, and the two "
                "tokenisations have different positions: set distill.features=null"
            )
        if self.blockwise_passes and not repairs_from_source and main:
            errors.append(
                "distill.blockwise_passes repairs a student copied from a model's layers "
                "(student.source, read with the student's tokenizer): set student.source or "
                "distill.blockwise_passes=0"
            )
        if not self.chunked:
            errors.append("the cross-tokenizer loss is chunked only: set distill.chunked=true")
        if self.on_policy_teacher_top_k is not None and main:  # the main teacher interleaves
            errors.append(
                "distill.on_policy_teacher_top_k swaps in the teacher's tokens, which are not "
                "the student's: set it to null"
            )
        return errors

    def _check_cached(self) -> None:
        """What a cache of top-k logits cannot serve, refused before anything loads."""
        if not self.chunked:
            raise ValueError(
                "distill.teacher_cache needs distill.chunked=true: the cached records are read "
                "by the chunked loss (the full-logit path is for checking online KD)"
            )

    def logit_objective(self) -> LogitObjective:
        """The logit terms and their weights, as the losses take them."""
        divergence = get_divergence(self.divergence, beta=self.beta, skew=self.skew)
        return LogitObjective(divergence, self.temperature, self.kd_weight, self.ce_weight)


NOTHING_TO_LEARN = (
    "distill.kd_weight, distill.ce_weight and the feature weights (distill.feature_weight, each "
    "pair's weight) are all 0: the loss would be 0.0 and nothing would train; e.g. "
    "distill.kd_weight=0.5"
)


def learns_nothing(kd_weight: float, ce_weight: float, feature_weight: float, features) -> bool:
    """Whether every term of the objective weighs 0, so the loss is 0.0 whatever the student
    does: ``uniform``/``spans`` pairs weigh ``feature_weight``, listed pairs their own
    ``weight`` (``feature_weight`` where they give none)."""
    if kd_weight != 0 or ce_weight != 0:
        return False
    if not features:
        return True
    if isinstance(features, str):
        return feature_weight == 0
    if not isinstance(features, Sequence):
        return False  # not a feature list: refused where the pairs are read
    weights = [
        pair.get("weight", feature_weight) if isinstance(pair, Mapping) else None
        for pair in features
    ]
    return all(isinstance(w, int | float) and not isinstance(w, bool) and w == 0 for w in weights)


def on_policy_weight_error(
    on_policy: float, kd_weight: float, feature_weight: float, features
) -> str | None:
    """Why on-policy KD that trains nothing on its completions is refused (None where it does):
    the student's sampled completions are scored by the divergence (and any feature matching
    over them), never by CE, so with both weighing 0 they would train nothing."""
    if not (on_policy > 0 and learns_nothing(kd_weight, 0.0, feature_weight, features)):
        return None
    return (
        f"distill.on_policy={on_policy} with distill.kd_weight=0 and no feature matching: the "
        "student's sampled completions are scored by the divergence to the teacher (and "
        "distill.features), never by CE (its own text is no target), so they would train "
        "nothing and shrink the other batches' share of each step; set distill.kd_weight > 0, "
        "or distill.on_policy=0"
    )
