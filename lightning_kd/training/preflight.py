"""Checks that need the built models, run once before the first validation or training batch.

Left to the step, each fails at step 1 (or later) with an error that names neither key nor fix:

- a sequence length (``data.block_size``) beyond a model's position embeddings;
- a feature module the step never runs — the step calls each model's body (``base_model``) and
  the chunked loss applies the output head itself, so a hook on ``lm_head`` would never fire;
- a projector whose widths were read off the module structure wrongly (``features.output_width``
  guesses, e.g., the residual width for an MLP's inner activation);
- a "causal" LM whose outputs at a position move with later tokens (an encoder loaded as one),
  and before it, weights that are NaN or infinite (``models/finite_weights.py``).

The feature and causality checks run each model forward on a 1 × 8 token batch, as the step runs
it (its captures armed). As training starts, a warning names feature pairs that no trained
parameter feeds (``student.freeze_layers``): their terms are constants computed for nothing.
Another names an on-policy warm-up that lasts the whole run, however its steps are counted.
Under FSDP and DeepSpeed, whose root parameters are sharded outside the step, only the length is
checked here; the first step's capture errors name a bad feature module.
"""

from __future__ import annotations

import warnings

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy
from torch import nn

from lightning_kd.models.batch_positions import max_positions
from lightning_kd.models.finite_weights import nonfinite_error
from lightning_kd.models.heads import final_hidden
from lightning_kd.models.positions import position_error
from lightning_kd.training.progress import total_steps
from lightning_kd.utils.refusal import Refused

SAMPLE_TOKENS = 8
DAMAGED_FIX = (
    "Load an intact copy (teacher.path, student.path), or resume from an earlier checkpoint"
)


def check_block_size(block_size: int, module: LightningModule) -> None:
    """Refuse ``data.block_size`` beyond the teacher's or the student's positions (a cached
    teacher is not here: its cache was written with this very block size)."""
    for role in ("teacher", "student"):
        if getattr(module, role) is None:
            continue
        limit = max_positions(getattr(module, role).config)
        if error := position_error("data.block_size", block_size, limit, f"the {role}"):
            raise Refused(error)


def sample_ids(model: nn.Module, device: torch.device) -> torch.Tensor:
    """``[1, SAMPLE_TOKENS]`` token ids ``model``'s embedding has rows for."""
    vocab = model.get_input_embeddings().num_embeddings
    return torch.arange(SAMPLE_TOKENS, device=device).remainder(vocab).unsqueeze(0)


def captured_outputs(
    module: LightningModule, role: str, grad: bool = False
) -> dict[str, torch.Tensor]:
    """The first output of each of ``role``'s captured modules in one step-like forward of it;
    with ``grad``, autograd on, so that each says whether a trained parameter feeds it."""
    distiller = module.distiller
    capture = distiller.captures[role]
    model = getattr(distiller, role)
    ids = sample_ids(model, module.device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    try:
        with torch.set_grad_enabled(grad):
            distiller.run(role, batch)
        return {path: outputs[0] for path, outputs in capture.records.items()}
    finally:
        capture.clear()


def check_features(module: LightningModule) -> None:
    """Every feature pair's modules run in the step, and its projector fits their widths."""
    distiller = module.distiller
    if not distiller.layer_pairs:
        return
    # A cached teacher's outputs were captured by the writer from the step's own forward.
    roles = tuple(role for role in ("student", "teacher") if role in distiller.captures)
    outputs = {role: captured_outputs(module, role) for role in roles}
    widths = {role: {p: out.shape[-1] for p, out in outputs[role].items()} for role in roles}
    for pair, projector in zip(distiller.layer_pairs, distiller.projectors, strict=True):
        for role in roles:
            path = getattr(pair, role)
            if path not in widths[role]:
                raise Refused(
                    f"distill.features: the {role} module {path!r} never runs in the training "
                    "step, so its feature loss could not be computed: the step runs the model's "
                    "body (base_model) and the chunked loss applies the output head itself. "
                    "Match a module inside the body (a decoder layer, the final norm), or set "
                    "distill.chunked=false"
                )
        if "teacher" not in widths:
            continue
        got = (widths["student"][pair.student], widths["teacher"][pair.teacher])
        expected = (
            (projector.in_features, projector.out_features)
            if isinstance(projector, nn.Linear)
            else (got[1], got[1])
        )
        if got != expected:
            raise Refused(
                f"distill.features pair {pair.student} -> {pair.teacher}: the modules output "
                f"{got[0]} and {got[1]} wide features, but the projector was built for "
                f"{expected[0]} -> {expected[1]} (widths read off the module structure); "
                "match modules whose output is the residual stream (decoder layers, norms) or "
                "a linear layer"
            )


def warn_untrained(module: LightningModule) -> None:
    """Warn of feature pairs whose student module no trained parameter feeds (the layers up to
    it frozen, ``student.freeze_layers``, with the embeddings): the term is a constant that each
    step computes for nothing (a projector alone would learn from it). Run as training starts:
    a validation's hooks run under inference mode, where nothing requires grad (and a forward
    with grad there met the models' caches made in it)."""
    distiller = module.distiller
    if not distiller.layer_pairs or "student" not in distiller.captures:
        return
    outputs = captured_outputs(module, "student", grad=True)
    untrained = [
        f"{pair.student} -> {pair.teacher}"
        for pair in distiller.layer_pairs
        if pair.student in outputs and not outputs[pair.student].requires_grad
    ]
    if untrained:
        warnings.warn(
            f"distill.features: no trained parameter comes before the student's side of "
            f"{', '.join(untrained)} (student.freeze_layers and frozen embeddings), so those "
            "terms cannot move it and are computed each step for nothing; pair later student "
            "layers, or freeze fewer",
            stacklevel=2,
        )


def warmup_note(module: LightningModule, trainer: Trainer) -> str | None:
    """Where ``distill.on_policy_warmup`` lasts the whole run, its steps given or counted from
    its epochs: no step samples the student's own completions, and the run trains as
    ``distill.on_policy=0`` would. It said "on-policy KD scores the student's own completions"
    and trained the same student (probe 55; by epochs, re-check 57). A warning, not a refusal:
    an extension by resume can reach the warm-up's end."""
    on_policy = module.distiller.on_policy
    steps = total_steps(trainer)  # None: a stream, whose end nobody knows
    if on_policy is None or steps is None or on_policy.warmup < steps:
        return None
    ends = f"trainer.max_steps={steps}" if trainer.max_steps > 0 else f"the run's {steps} steps"
    return (
        f"distill.on_policy_warmup={on_policy.warmup} is not below {ends}: no step samples the "
        "student's own completions, and the run trains as distill.on_policy=0 would; lower the "
        f"warm-up, or extend the run past step {on_policy.warmup} (ckpt_path=last with a larger "
        "trainer.max_steps)"
    )


def check_causal(module: LightningModule) -> None:
    """Each causal LM (teacher, student) predicts a token from the ones before it alone: its
    outputs at the first positions do not move when the last token changes. A model whose
    attention reads both ways (a BERT-like encoder loaded as a causal LM, a config of one's own)
    would train a student on logits that saw the tokens they predict."""
    distiller = module.distiller
    if distiller.task.name != "causal_lm":
        return
    for role in ("teacher", "student"):
        model = getattr(distiller, role)
        if model is None:  # a cached teacher: its writer ran the same check's model
            continue
        if error := nonfinite_error(model, f"the {role}", DAMAGED_FIX):  # NaN ≠ NaN: "not causal"
            raise Refused(error)
        ids = sample_ids(model, module.device)
        changed = ids.clone()
        changed[0, -1] = (changed[0, -1] + 1) % model.get_input_embeddings().num_embeddings
        outputs = [final_hidden_eval(model, row) for row in (ids, changed)]
        before, after = (output[:, :-1].float() for output in outputs)
        if not torch.allclose(before, after, rtol=1e-3, atol=1e-4 * before.abs().max()):
            raise Refused(
                f"the {role} ({type(model).__name__}) is not causal: its outputs at the first "
                "positions change with the last token, so its logits would see the tokens they "
                "predict. Distil a decoder-only causal LM, or an encoder with teacher.task=encoder"
            )


def final_hidden_eval(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``model``'s final hidden states for ``ids`` in eval mode (no dropout), its mode restored."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            return final_hidden(model, batch, logits=False)
    finally:
        model.train(training)


class Preflight(Callback):
    """Runs the checks above once, before the first validation or training batch (the warning
    of untrained pairs as each ``fit`` starts)."""

    def __init__(self) -> None:
        self.done = False

    def _check(self, trainer: Trainer, module: LightningModule) -> None:
        if self.done:
            return
        block_size = getattr(trainer.datamodule, "block_size", None)
        if block_size is not None:
            check_block_size(block_size, module)
        # A forward outside the step would find FSDP's root parameters sharded: there the
        # features are checked by the first step itself (the capture errors name the module).
        if not isinstance(trainer.strategy, FSDPStrategy | DeepSpeedStrategy):
            check_features(module)
            check_causal(module)
        self.done = True

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer, pl_module)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not isinstance(trainer.strategy, FSDPStrategy | DeepSpeedStrategy):
            warn_untrained(pl_module)
        if trainer.is_global_zero and (note := warmup_note(pl_module, trainer)):
            warnings.warn(note, stacklevel=2)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer, pl_module)
