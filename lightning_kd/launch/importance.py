"""``student.layers=importance``: the student copies the teacher layers that matter most.

The teacher runs over ``student.calibration_blocks`` blocks of the *training* split (never
validation), every layer is scored (``lightning_kd.models.layer_scores``: block influence, skip KL,
optionally greedy KL) and the ``student.num_layers`` best by ``student.importance`` are kept,
first and last always unless ``student.keep_ends=false``.

A run resolves the choice before the module is built (``launch.auto.resolve`` calls
:func:`choose_layers`): the indices replace ``importance`` in the config, the scores go to
``RUN_DIR/importance.json`` and into the summary. A resumed run takes the indices its checkpoint
was trained with, so it rebuilds the same student whatever a new scoring would say.

    lightning-kd importance                       # the table for the default run
    lightning-kd importance student.num_layers=8 student.importance=greedy_kl
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lightning_kd.data.batches import first_training_examples
from lightning_kd.data.text import TextDataModule
from lightning_kd.launch.build import build_datamodule, with_precision, with_values
from lightning_kd.launch.data_checks import dataset_errors
from lightning_kd.launch.entry import check_entry, teacher_length
from lightning_kd.launch.model_checks import model_setting_errors
from lightning_kd.launch.nodes import one_process_note
from lightning_kd.models.layer_scores import Batch, Ranking, rank_layers
from lightning_kd.models.loading import StudentSpec, load_teacher, load_tokenizer
from lightning_kd.models.positions import spec_config
from lightning_kd.models.student import check_num_layers
from lightning_kd.training.checkpoint_files import load_local
from lightning_kd.utils.atomic import atomic_write_bytes

FILENAME = "importance.json"
"""Where a run writes its layer scores, in its run directory."""


def calibration_batches(datamodule: TextDataModule, blocks: int) -> list[Batch]:
    """The first ``blocks`` examples of the training split (already a seeded shuffle; streamed:
    the stream's first), one batch each. Validation examples are never among them."""
    datamodule.setup("fit")
    examples = first_training_examples(datamodule, blocks)
    if blocks > len(examples):
        raise ValueError(
            f"student.calibration_blocks={blocks} but the training split has only "
            f"{len(examples)} blocks; choose 1..{len(examples)}"
        )
    return [datamodule.collate([example]) for example in examples]


def rank_for_student(teacher, spec: StudentSpec, batches: list[Batch]) -> Ranking:
    """Score ``teacher``'s layers on ``batches`` and keep ``spec.num_layers`` of them the way
    ``spec`` asks (``importance``, ``keep_ends``)."""
    check_count(spec, teacher.config.num_hidden_layers)
    start = time.perf_counter()
    shown = rank_zero_only.rank == 0
    ranking = rank_layers(
        teacher, batches, spec.num_layers, spec.importance, spec.keep_ends, progress=shown
    )
    ranking.seconds = time.perf_counter() - start
    return ranking


def check_count(spec: StudentSpec, teacher_layers: int) -> None:
    """Raise unless ``student.num_layers`` is set and within the teacher's depth."""
    if spec.num_layers is None:
        raise ValueError("student.layers=importance keeps student.num_layers layers; set it")
    check_num_layers(spec.num_layers, teacher_layers)


def score_config(cfg: DictConfig) -> Ranking:
    """The ranking ``cfg`` asks for: its teacher (``teacher.dtype`` concrete or ``auto``), its
    student's count and score, calibration blocks from its data's training split."""
    spec = instantiate(cfg.student, _convert_="all")
    teacher_spec = instantiate(cfg.teacher, _convert_="all")
    teacher = load_teacher(teacher_spec, cfg.trainer.get("precision"))
    check_count(spec, teacher.config.num_hidden_layers)
    datamodule = build_datamodule(cfg, load_tokenizer(teacher_spec))
    return rank_for_student(teacher, spec, calibration_batches(datamodule, spec.calibration_blocks))


SOURCE = (
    "student.source={source}: lightning-kd importance ranks the teacher's layers, and a student "
    "copied from student.source takes its layers from that model instead; drop student.source "
    "to rank the teacher's layers for a student copied from the teacher"
)
"""The refusal of a ranking the run's student would not be built from."""


def run(cfg: DictConfig) -> Ranking:
    """The library half of ``lightning-kd importance``: ``cfg`` checked as a run of
    ``student.layers=importance`` is (before anything loads), its precision resolved, and the
    teacher's layers ranked as that run would rank them."""
    # The command ranks as student.layers=importance does: its settings are checked as such.
    ranked = with_values(cfg, {"student.layers": "importance"})
    source = cfg.student.get("source")
    extra = dataset_errors(cfg) + (
        [SOURCE.format(source=source)] if source is not None else model_setting_errors(ranked)
    )
    check_entry(cfg, lengths=[teacher_length(cfg, "data.block_size")], extra=extra)
    if note := one_process_note(cfg, "importance: one process ranks the layers"):
        print(note, flush=True)
    cfg, _ = with_precision(cfg)
    if (mode := cfg.teacher.get("quantize")) is not None:  # as training builds its student
        print(
            f"teacher.quantize={mode} applies in training, once the student is built: the "
            f"layers are ranked with the teacher at teacher.dtype={cfg.teacher.dtype}, as "
            "student.layers=importance ranks them"
        )
    return score_config(cfg)


def choose_layers(
    cfg: DictConfig, ckpt_path: Path | None = None
) -> tuple[list[int], Ranking | None] | None:
    """With ``student.layers=importance``, the teacher layers the student copies and the
    ranking behind them (None otherwise); ``cfg`` is not changed. A resume takes the
    checkpoint's indices."""
    if cfg.student.get("layers") != "importance":
        return None
    output_dir = Path(cfg.output_dir)
    if ckpt_path is not None:
        layers = recorded_layers(ckpt_path, output_dir)
        return layers, saved_ranking(output_dir, layers)
    if (every := every_layer(cfg)) is not None:
        return every, None
    ranking = score_config(cfg)
    if rank_zero_only.rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(ranking.as_dict(), indent=2) + "\n"
        atomic_write_bytes(output_dir / FILENAME, text.encode())
        print(f"student layers by {ranking.by}: {ranking.kept} ({ranking.seconds:.0f} s)")
    return list(ranking.kept), ranking


def every_layer(cfg: DictConfig) -> list[int] | None:
    """All the teacher's layers when ``student.num_layers`` keeps every one (nothing to rank:
    the teacher's config is read, not its weights), else None."""
    count = cfg.student.get("num_layers")
    config = spec_config(instantiate(cfg.teacher, _convert_="all"))
    if config is None or count != config.num_hidden_layers:
        return None
    if rank_zero_only.rank == 0:
        print(f"student.layers=importance: student.num_layers={count} keeps every teacher layer")
    return list(range(count))


def recorded_layers(ckpt_path: Path, output_dir: Path) -> list[int]:
    """The teacher layers the checkpoint's student was copied from (its hyper-parameters), or
    those of this run directory's ``importance.json``."""
    if ckpt_path.is_file():
        checkpoint = load_local(ckpt_path, "cpu", mmap=True)
        layers = checkpoint.get("hyper_parameters", {}).get("student", {}).get("layers")
        if isinstance(layers, list):
            return [int(i) for i in layers]
    saved = output_dir / FILENAME
    if saved.is_file():
        return list(json.loads(saved.read_text())["kept"])
    raise ValueError(
        f"resuming with student.layers=importance, but neither {ckpt_path} nor {saved} records "
        "which layers the student copied; resume with student.layers=[...] set to them"
    )


def saved_ranking(output_dir: Path, layers: list[int]) -> Ranking | None:
    """This run directory's ranking, if it is the one behind ``layers``."""
    saved = output_dir / FILENAME
    if not saved.is_file():
        return None
    ranking = Ranking.from_dict(json.loads(saved.read_text()))
    return ranking if ranking.kept == layers else None
