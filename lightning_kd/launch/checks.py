"""Every numeric config value checked before anything loads: finite, of the right kind, in range.

A bad value found here costs a second; found by the run, it costs a model load, or a whole run that
trains on NaN. Each rule names its key, its allowed range and an example value, and
:func:`config_errors` lists every bad key at once (``entry.check_entry`` refuses them), each with
the value it got and the fix. Choices that would fail only after the models load are checked here
too: a logger not installed or a callback that needs one (``logger_checks.py``), peft or torchao
missing for ``student.lora`` or an int8 teacher (``package_checks.py``), an int8 teacher where it
cannot run, an objective whose every weight is 0. The rules themselves are ``rules.py``'s; the
commands' own options are checked by the same rules, and every command runs both through
``entry.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from omegaconf.errors import OmegaConfBaseException

from lightning_kd.distill.objective import NOTHING_TO_LEARN, learns_nothing, on_policy_weight_error
from lightning_kd.export.gguf import type_errors
from lightning_kd.launch.data_checks import data_setting_errors
from lightning_kd.launch.device_checks import (
    accelerator_errors,
    devices_errors,
    strategy_name_errors,
)
from lightning_kd.launch.keys import unknown_setting_errors
from lightning_kd.launch.length_checks import run_length_errors
from lightning_kd.launch.logger_checks import logger_errors
from lightning_kd.launch.package_checks import package_errors
from lightning_kd.launch.paths import (
    cache_dir_errors,
    cache_root_errors,
    run_dir_errors,
    run_subdirectory_errors,
)
from lightning_kd.launch.precision_checks import precision_errors, zero3_dtype_errors
from lightning_kd.launch.rules import (
    ABSENT,
    CountOrFraction,
    MetricName,
    Number,
    followed,
    lookup,
    value_errors,
)
from lightning_kd.launch.teacher_list import teachers_errors
from lightning_kd.models.quantize import STRATEGIES, backend_errors

RULES: dict[str, Number | CountOrFraction | MetricName] = {
    # numpy's seed range: a seed outside it fails in numpy once the run directory is claimed.
    "seed": Number(low=0, high=2**32 - 1, integer=True, example="0"),
    "optimizer.lr": Number(low=0, low_open=True, example="1e-3"),
    "optimizer.weight_decay": Number(low=0, example="0.01"),
    "optimizer.eps": Number(low=0, low_open=True, example="1e-8"),
    "optimizer.momentum": Number(low=0, high=1, high_open=True, example="0.9"),
    "scheduler.warmup_fraction": Number(low=0, high=1, high_open=True, example="0.05"),
    "scheduler.final_lr_fraction": Number(low=0, high=1, example="0.1"),
    # objective.MIN_TEMPERATURE: 1e-30 trained a KD term of 0.0 (T² underflows; probe 59)
    "distill.temperature": Number(low=0.01, example="1.0"),
    "distill.kd_weight": Number(low=0, example="0.5"),
    "distill.ce_weight": Number(low=0, example="0.5"),
    "distill.feature_weight": Number(low=0, example="1.0"),
    "distill.beta": Number(low=0, high=1, example="0.5"),
    "distill.skew": Number(low=0, high=1, high_open=True, example="0.1"),
    "distill.chunk_size": Number(low=1, integer=True, nullable=True, example="null"),
    "distill.on_policy": Number(low=0, high=1, example="0.5"),
    "distill.on_policy_tokens": Number(low=1, integer=True, example="128"),
    "distill.on_policy_temperature": Number(low=0, low_open=True, example="1.0"),
    "distill.on_policy_warmup": Number(low=0, integer=True, example="0"),
    "distill.on_policy_teacher_top_k": Number(low=1, integer=True, nullable=True, example="25"),
    "distill.blockwise_passes": Number(low=0, integer=True, example="3"),
    "distill.blockwise_lr": Number(low=0, low_open=True, example="1e-3"),
    "distill.cross_top_k": Number(low=1, integer=True, example="64"),
    "distill.cross_uld_weight": Number(low=0, example="1.0"),
    "distill.cross_span_weight": Number(low=0, example="0.0"),
    "distill.cross_min_aligned": Number(low=0, high=1, example="0.9"),
    "cache.k": Number(low=1, integer=True, example="32"),
    "cache.temperature": Number(low=0.01, example="1.0"),
    "cache.shard_blocks": Number(low=1, integer=True, example="64"),
    "cache.batch_size": Number(low=1, integer=True, example="8"),
    "data.split_seed": Number(low=0, high=2**32 - 1, integer=True, example="0"),
    "data.block_size": Number(low=2, integer=True, example="256"),
    "data.batch_size": Number(low=1, integer=True, example="4"),
    "data.val_batch_size": Number(low=1, integer=True, nullable=True, example="8"),
    "data.val_fraction": Number(low=0, high=1, low_open=True, high_open=True, example="0.05"),
    "data.max_train_examples": Number(low=1, integer=True, nullable=True, example="180"),
    "data.num_workers": Number(low=0, integer=True, example="0"),
    "data.val_size": Number(low=1, integer=True, example="64"),
    "data.shuffle_buffer": Number(low=1, integer=True, example="1024"),
    "student.num_layers": Number(low=1, integer=True, nullable=True, example="6"),
    "student.calibration_blocks": Number(low=1, integer=True, example="4"),
    "teacher.init_seed": Number(integer=True, example="0"),
    "trainer.max_steps": Number(low=1, integer=True, special=(-1,), example="140"),
    "trainer.max_epochs": Number(low=1, integer=True, nullable=True, special=(-1,), example="1"),
    "trainer.accumulate_grad_batches": Number(low=1, integer=True, example="1"),
    "trainer.val_check_interval": CountOrFraction(example="100"),
    "trainer.check_val_every_n_epoch": Number(low=1, integer=True, nullable=True, example="1"),
    "trainer.limit_train_batches": CountOrFraction(),
    # 0 would switch validation off, but the run validates after training to report the student.
    "trainer.limit_val_batches": CountOrFraction(),
    "trainer.log_every_n_steps": Number(low=1, integer=True, example="5"),
    "trainer.gradient_clip_val": Number(low=0, nullable=True, example="1.0"),
    "trainer.num_sanity_val_steps": Number(low=-1, integer=True, example="0"),
    "trainer.num_nodes": Number(low=1, integer=True, example="1"),
    "checkpoint.every": Number(low=1, integer=True, example="50"),
    "checkpoint.keep": Number(low=-1, integer=True, example="3"),
    "checkpoint.best": MetricName(),
    "callbacks.early_stopping.patience": Number(low=0, integer=True, example="3"),
    "callbacks.early_stopping.min_delta": Number(low=0, example="0.0"),
    "callbacks.samples.every": Number(low=1, integer=True, example="50"),
    "callbacks.samples.prompts": Number(low=1, integer=True, example="3"),
    "callbacks.samples.max_new_tokens": Number(low=1, integer=True, example="48"),
    "callbacks.samples.text_prompt": Number(low=1, integer=True, example="32"),
    "generate.max_new_tokens": Number(low=1, integer=True, example="256"),
    "generate.prefix_chars": Number(low=1, integer=True, example="128"),
    "generate.max_prompts": Number(low=1, integer=True, nullable=True, example="64"),
    "generate.temperature": Number(low=0, low_open=True, example="1.0"),
    "generate.top_p": Number(low=0, high=1, low_open=True, example="1.0"),
    "generate.batch_size": Number(low=1, integer=True, example="8"),
    "lm_eval.batch_size": Number(low=1, integer=True, example="8"),
    "lm_eval.limit": Number(low=1, integer=True, nullable=True, example="100"),
}
"""Every numeric key a run reads, by dotted path; a key a config does not have is skipped."""


def config_errors(cfg: Mapping) -> list[str]:
    """One message per bad numeric value in ``cfg`` (empty when all are fine)."""
    each = {key: value_errors({key: lookup(cfg, key)}, RULES) for key in RULES}
    # A value that repeats a refused one (${distill.temperature}) is refused once, there.
    errors = [e for key, found in each.items() if not each.get(followed(cfg, key)) for e in found]
    errors += _list_errors(cfg) + devices_errors(cfg) + accelerator_errors(cfg)
    errors += _encoder_errors(cfg) + strategy_name_errors(cfg)
    errors += run_length_errors(cfg)
    errors += _weight_errors(cfg) + _quantize_errors(cfg) + logger_errors(cfg)
    errors += package_errors(cfg) + _sharding_errors(cfg) + _repair_errors(cfg) + _flag_errors(cfg)
    errors += data_setting_errors(cfg) + unknown_setting_errors(cfg) + teachers_errors(cfg)
    errors += precision_errors(cfg) + _output_dir_errors(cfg) + cache_root_errors()
    errors += cache_dir_errors(lookup(cfg, "cache.dir"))
    return errors + _export_errors(cfg)


def _export_errors(cfg: Mapping) -> list[str]:
    """``export.gguf``: null or a GGUF type, and a student exported to convert."""
    kind = lookup(cfg, "export.gguf")
    if kind is ABSENT or kind is None:
        return []
    if errors := type_errors(kind):
        return errors
    if lookup(cfg, "export_student") is False:
        return [
            f"export.gguf={kind} converts the exported student (RUN_DIR/student), which "
            "export_student=false does not write; set export_student=true, or export.gguf=null"
        ]
    return []


def _output_dir_errors(cfg: Mapping) -> list[str]:
    """The run directory (``output_dir``, Hydra's ``hydra.run.dir``): not a file, no ``~``."""
    try:
        run_dir = lookup(cfg, "output_dir")
    except OmegaConfBaseException:  # ${hydra:...} outside a launch: no directory to judge yet
        return []
    if not isinstance(run_dir, str):
        return []
    return run_dir_errors(run_dir) or run_subdirectory_errors(run_dir)


FLAGS = ("validate_before", "export_student", "overwrite", "resume_reset_optimizer")
"""Top-level switches: a YAML boolean each (``overwrite=yes`` is one; ``overwrite=1`` is not)."""


def _flag_errors(cfg: Mapping) -> list[str]:
    errors = [
        f"{key}={value!r}: use true or false"
        for key in FLAGS
        if (value := lookup(cfg, key)) is not ABSENT and not isinstance(value, bool)
    ]
    mode = lookup(cfg, "resume_mismatch")
    if mode is not ABSENT and mode not in ("error", "warn"):
        errors.append(f"resume_mismatch={mode!r}: use error or warn")
    if lookup(cfg, "resume_reset_optimizer") is True and "deepspeed" in str(_strategy_target(cfg)):
        errors.append(
            "resume_reset_optimizer=true with strategy=deepspeed: DeepSpeed restores its "
            "optimizer itself and cannot start it afresh; resume without it"
        )
    return errors


WEIGHTS = ("distill.kd_weight", "distill.ce_weight", "distill.feature_weight")


def _weight_errors(cfg: Mapping) -> list[str]:
    """An objective whose every term weighs 0 would train on a loss of 0.0 and change nothing;
    so would on-policy completions without the divergence that scores them."""
    weights = [lookup(cfg, key) for key in WEIGHTS]
    features = lookup(cfg, "distill.features")
    features = None if features is ABSENT else features
    if any(not isinstance(w, int | float) or isinstance(w, bool) for w in weights):
        return []  # absent or not a number: not an objective to judge (or refused above)
    if learns_nothing(*weights, features):
        return [NOTHING_TO_LEARN]  # the spec's own message: two checks, said once
    on_policy = lookup(cfg, "distill.on_policy")
    if not isinstance(on_policy, int | float) or isinstance(on_policy, bool):
        return []
    error = on_policy_weight_error(on_policy, weights[0], weights[2], features)
    return [] if error is None else [error]


def _encoder_errors(cfg: Mapping) -> list[str]:
    if lookup(cfg, "teacher.task") == "encoder" and not lookup(cfg, "distill.features"):
        return [
            "teacher.task=encoder with distill.features unset: an encoder has no logits, so "
            "feature matching is the whole objective; e.g. distill.features=uniform"
        ]
    return []


def _quantize_errors(cfg: Mapping) -> list[str]:
    """``teacher.quantize`` against the accelerator and strategy, or (the teacher group's model
    full precision) the first ``teachers`` entry quantized of its own, under its own key."""
    accelerator = lookup(cfg, "trainer.accelerator")
    accelerator = None if accelerator is ABSENT else accelerator
    mode = lookup(cfg, "teacher.quantize")
    if mode not in (ABSENT, None):
        return backend_errors(mode, accelerator, _strategy_target(cfg))
    entries = lookup(cfg, "teachers")
    own = [
        (index, entry["quantize"])
        for index, entry in enumerate(entries if isinstance(entries, Sequence) else ())
        if isinstance(entry, Mapping) and entry.get("quantize") is not None
    ]
    if not own:
        return []
    index, mode = own[0]
    errors = backend_errors(mode, accelerator, _strategy_target(cfg))
    return [error.replace("teacher.quantize", f"teachers[{index}].quantize") for error in errors]


def _strategy_target(cfg: Mapping) -> str | None:
    """``trainer.strategy``'s name or ``_target_`` (None when unset)."""
    strategy = lookup(cfg, "trainer.strategy")
    if isinstance(strategy, Mapping):
        strategy = strategy.get("_target_")
    return None if strategy is ABSENT else strategy


SHARDED_REFUSALS = {
    "distill.blockwise_passes": "the repair trains whole student layers outside the sharded step",
}


def _sharding_errors(cfg: Mapping) -> list[str]:
    if not any(kind in str(_strategy_target(cfg)).lower() for kind in STRATEGIES):
        return []
    errors = [
        f"{key} with a sharding strategy: {why}; use strategy=ddp (or {key}=0)"
        for key, why in SHARDED_REFUSALS.items()
        if isinstance(value := lookup(cfg, key), int | float) and value > 0
    ]
    if lookup(cfg, "callbacks.samples") not in (None, ABSENT):
        # Rank 0 alone generates them, outside the step: with sharded weights each forward is
        # a collective the other ranks never join, and the run would hang there.
        errors.append(
            "callbacks.samples with a sharding strategy: rank 0 alone writes the samples, and "
            "each forward of a sharded model needs every rank; use strategy=ddp, or drop "
            "+callbacks=samples (score the exported student with lightning-kd evaluate)"
        )
    return errors + zero3_dtype_errors(cfg, lookup(cfg, "trainer.strategy"))


def _repair_errors(cfg: Mapping) -> list[str]:
    passes = lookup(cfg, "distill.blockwise_passes")
    if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
        return []
    return [
        f"distill.blockwise_passes={passes} with {key} set: the repair trains whole layers "
        "copied from the teacher (student.num_layers or student.layers); set "
        "distill.blockwise_passes=0"
        for key in ("student.path", "student.config", "student.lora")
        if lookup(cfg, key) not in (None, ABSENT)
    ]


def _list_errors(cfg: Mapping) -> list[str]:
    betas = lookup(cfg, "optimizer.betas")
    rule = Number(low=0, high=1, high_open=True)
    if betas is ABSENT or betas is None:
        return []
    if (
        isinstance(betas, str)
        or not isinstance(betas, Sequence)
        or len(betas) != 2
        or not all(map(rule.accepts, betas))
    ):
        return [f"optimizer.betas={betas!r}: must be two numbers in [0, 1); e.g. [0.9, 0.95]"]
    return []
