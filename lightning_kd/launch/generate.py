"""The teacher's completions for a composed config: the library half of ``lightning-kd generate``
(prompts from a file or from a split of the run's chat data, the teacher loaded as a run loads
it)."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.chat_tokens import prompt_ids
from lightning_kd.data.conversations import ChatFields, prompt_of
from lightning_kd.generation.teacher_completions import (
    OUTPUT_NAME,
    SPLITS,
    GenerateSpec,
    read_prompts,
    use_chat_template,
    write_completions,
)
from lightning_kd.launch.build import with_precision
from lightning_kd.launch.config import record_job
from lightning_kd.launch.entry import check_entry, teacher_length
from lightning_kd.launch.paths import training_run_errors
from lightning_kd.models.loading import load_teacher, load_tokenizer
from lightning_kd.models.positions import room_error, teacher_positions
from lightning_kd.models.quantize import quantize_teacher
from lightning_kd.utils.refusal import refuse


def split_prompts(cfg: DictConfig, tokenizer, split: str) -> list[tuple[str, list[dict]]]:
    """``(file:line, prompt messages)`` of the ``data=chat`` split ``split`` ("train"/"val"),
    split as a run with the same data settings splits it."""
    data = instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    if not isinstance(data, ChatDataModule):
        raise ValueError(
            f"generate.prompts={split}_split reads the prompts of data=chat's {split} split; this "
            "config's data is not chat data: add data=chat (or experiment=instruct) and its files"
        )
    if data.stream is not None:
        raise ValueError(
            f"generate.prompts={split}_split with data.streaming=true: a stream's split is never "
            "held whole; set data.streaming=false (the prompts are read once, as a run reads them)"
        )
    train, val = data.split()
    return [(c.where, prompt_of(c.messages)) for c in (train if split == "train" else val)]


def config_prompts(
    cfg: DictConfig, spec: GenerateSpec, tokenizer: PreTrainedTokenizerBase
) -> list[tuple[int | str, list[dict]]]:
    """The prompts ``generate.prompts`` names: a file's rows, or a split of ``data=chat``."""
    if spec.prompts is None:
        raise ValueError(
            "set generate.prompts=FILE.jsonl (rows with 'prompt' or 'messages'), or "
            "generate.prompts=train_split (val_split) for the prompts of data=chat's split"
        )
    if spec.prompts in SPLITS:
        return split_prompts(cfg, tokenizer, SPLITS[spec.prompts])
    return read_prompts(Path(spec.prompts).expanduser(), ChatFields())


def prepared(
    cfg: DictConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[GenerateSpec, list[tuple[int | str, list[dict]]]]:
    """``cfg.generate`` and the prompts it names, ``tokenizer`` given its chat template."""
    spec = instantiate(cfg.generate, _convert_="all")
    use_chat_template(tokenizer, spec)
    return spec, config_prompts(cfg, spec, tokenizer)


def generate(cfg: DictConfig, teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Write (or finish writing) ``output_dir/completions.jsonl`` for ``cfg.generate``."""
    spec, prompts = prepared(cfg, tokenizer)
    return answer(cfg, teacher, tokenizer, spec, prompts)


def answer(cfg: DictConfig, teacher, tokenizer, spec: GenerateSpec, prompts: list) -> Path:
    """The completions of ``prompts`` into ``output_dir/completions.jsonl``."""
    out = Path(cfg.output_dir) / OUTPUT_NAME
    overwrite = bool(cfg.get("overwrite"))
    source = {key: cfg.teacher.get(key) for key in ("path", "gguf_file")}
    return write_completions(teacher, tokenizer, prompts, spec, out, cfg.seed, overwrite, source)


def run_generate(cfg: DictConfig) -> Path:
    """Load the teacher as a run would (``teacher.quantize`` applied) and write its completions;
    every value, and each prompt with ``generate.max_new_tokens`` after it against the teacher's
    positions, checked before the teacher loads."""
    check_entry(
        cfg,
        lengths=[teacher_length(cfg, "generate.max_new_tokens")],
        extra=training_run_errors(Path(cfg.output_dir), "generate"),
    )
    cfg, _ = with_precision(cfg)
    teacher_spec = instantiate(cfg.teacher, _convert_="all")
    tokenizer = load_tokenizer(teacher_spec)
    spec, prompts = prepared(cfg, tokenizer)
    lengths = [len(ids) for ids in prompt_ids(tokenizer, [messages for _, messages in prompts])]
    limit = teacher_positions(teacher_spec)
    if error := room_error(
        "generate.max_new_tokens", spec.max_new_tokens, lengths, limit, "the teacher"
    ):
        refuse([error])
    teacher = load_teacher(teacher_spec, cfg.trainer.precision)
    if teacher_spec.quantize is not None:
        quantize_teacher(teacher, teacher_spec.quantize)
    teacher.to("cuda" if torch.cuda.is_available() else "cpu")
    written = answer(cfg, teacher, tokenizer, spec, prompts)
    # Recorded once written: a generate refused for an output another one holds leaves it be.
    record_job(cfg, Path(cfg.output_dir))
    return written
