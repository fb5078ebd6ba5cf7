"""The teacher's completions for a composed config: the library half of ``lightning-kd generate``
(prompts from a file, from a split of the run's chat data or from the start of its training
documents, the teacher loaded as a run loads it)."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.chat_tokens import template_text
from lightning_kd.data.conversations import ChatFields, prompt_of
from lightning_kd.data.text import TextDataModule
from lightning_kd.generation.completion_rows import cut_report
from lightning_kd.generation.teacher_completions import (
    OUTPUT_NAME,
    SPLITS,
    GenerateSpec,
    Prompt,
    prompt_tokens,
    prompts_file_error,
    read_prompts,
    write_completions,
)
from lightning_kd.generation.text_continuations import document_prefix
from lightning_kd.launch.build import with_precision
from lightning_kd.launch.config import record_job
from lightning_kd.launch.data_checks import is_chat_data
from lightning_kd.launch.entry import check_entry, teacher_length
from lightning_kd.launch.nodes import one_process_note
from lightning_kd.launch.paths import training_run_errors
from lightning_kd.models.loading import load_teacher, load_tokenizer
from lightning_kd.models.positions import room_error, teacher_positions
from lightning_kd.models.quantize import quantize_teacher
from lightning_kd.models.student import student_tokenizer
from lightning_kd.utils.refusal import Refused, messages, refuse


def split_prompts(
    cfg: DictConfig, spec: GenerateSpec, tokenizer, split: str
) -> list[tuple[str, Prompt]]:
    """``(file:line, prompt)`` of the split ``split`` ("train"/"val") of the config's data, split
    as a run with the same data settings and ``tokenizer`` (the run's) splits it: the prompt
    messages of ``data=chat``'s conversations, or the start of ``data=text``'s training
    documents, in a seeded order."""
    data = instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    if data.stream is not None:
        held = "the prompts are read once, as a run reads them"
        refuse(
            [
                f"generate.prompts={split}_split with data.streaming=true: a stream's split is "
                f"never held whole; set data.streaming=false ({held})"
            ]
        )
    if isinstance(data, ChatDataModule):
        train, val = data.split()
        return [(c.where, prompt_of(c.messages)) for c in (train if split == "train" else val)]
    if not isinstance(data, TextDataModule) or split != "train":
        refuse(
            [
                f"generate.prompts={split}_split reads the prompts of data=chat's {split} split"
                + (
                    "; with data=text use generate.prompts=train_split (its training documents: "
                    "held-out text is never written into a training file)"
                    if isinstance(data, TextDataModule)
                    else f"; this config's data is {type(data).__name__}"
                )
            ]
        )
    documents = data.shuffled(data.training_documents())
    return [(where, document_prefix(text, spec.prefix_chars)) for where, text in documents]


NO_DOCUMENT = (
    "no training document is longer than generate.prefix_chars={chars} and free of held-out "
    "text (a document part of which the validation split holds is never a prompt, and a .txt "
    "file is one document, part of it held out); write the documents one a row to a .jsonl "
    "named in data.files, or lower generate.prefix_chars"
)
"""Why ``data=text`` gave no prompt: the documents' lengths, or the held-out share of them."""


def chat_prompts(cfg: DictConfig, spec: GenerateSpec) -> bool:
    """Whether ``generate.prompts`` names chat prompts (a file of them, or ``data=chat``'s
    split), rendered with a chat template, or text (``data=text``'s training documents)."""
    if spec.prompts not in SPLITS:
        return True
    return is_chat_data(cfg.data)


NO_PROMPTS = (
    "generate.prompts=null: set generate.prompts=FILE.jsonl (rows with 'prompt' or 'messages'), "
    "or generate.prompts=train_split for the prompts of data=chat's training split (or the "
    "training documents of data=text), val_split for data=chat's held-out ones"
)
"""The refusal of a generate without prompts (``generate.prompts`` has no default)."""
NO_TEMPLATE = (
    "; the teacher's tokenizer has no chat template, so chat prompts (a file, data=chat's "
    "splits) also need generate.chat_template=plain (User: ... / Assistant:) or a Jinja "
    "template; data=text's training documents need none"
)
"""Said with :data:`NO_PROMPTS` where it applies: following the first advice then works."""


def no_prompts_error(tokenizer: PreTrainedTokenizerBase, spec: GenerateSpec) -> str:
    """Why a generate without ``generate.prompts`` is refused, with the chat template the
    prompts would also need where ``tokenizer`` (the teacher's) has none and none is set."""
    needs_template = spec.chat_template is None and tokenizer.chat_template is None
    return NO_PROMPTS + (NO_TEMPLATE if needs_template else "")


def config_prompts(
    cfg: DictConfig, spec: GenerateSpec, tokenizer: PreTrainedTokenizerBase
) -> list[tuple[int | str, Prompt]]:
    """The prompts ``generate.prompts`` names (a file's rows, a split of ``data=chat``, the
    training documents of ``data=text``; ``tokenizer`` the run's, that splits them), the first
    ``generate.max_prompts`` of them."""
    if spec.prompts is None:
        refuse([NO_PROMPTS])
    if spec.prompts in SPLITS:
        prompts = split_prompts(cfg, spec, tokenizer, SPLITS[spec.prompts])
        fix = (
            f"the data's {SPLITS[spec.prompts]} split holds no conversation; add data"
            if is_chat_data(cfg.data)
            else NO_DOCUMENT.format(chars=spec.prefix_chars)
        )
    else:
        prompts = read_prompts(Path(spec.prompts).expanduser(), ChatFields.of(cfg.data))
        fix = "the file holds no row; give rows with 'prompt' or 'messages', a JSON object a line"
    if not prompts:  # found by the tokenizer, it was an IndexError after the teacher loaded
        refuse([f"generate.prompts={spec.prompts} gives no prompt: {fix}"])
    return prompts[: spec.max_prompts]


def prepared(
    cfg: DictConfig,
    tokenizer: PreTrainedTokenizerBase,
    data_tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[GenerateSpec, list[tuple[int | str, Prompt]]]:
    """``cfg.generate`` and the prompts it names, ``tokenizer`` (the teacher's) given its chat
    template where they are chat prompts; a split is made with ``data_tokenizer`` (the run's,
    the student's own where it has one; default ``tokenizer``)."""
    spec = instantiate(cfg.generate, _convert_="all")
    if spec.prompts is None:  # before the template: the prompts decide whether one is needed
        refuse([no_prompts_error(tokenizer, spec)])
    template: Refused | None = None
    if chat_prompts(cfg, spec):
        try:
            use_chat_template(tokenizer, spec, OmegaConf.select(cfg, "data.chat_template"))
        except Refused as refused:  # a file's rows are read without it: both said at once
            if spec.prompts in SPLITS:  # a split's conversations are made with it
                raise
            template = refused
    try:
        prompts = config_prompts(cfg, spec, data_tokenizer or tokenizer)
    except Refused as refused:
        if template is not None:
            refuse([*messages(template), *messages(refused)])
        raise  # alone: as it is (a missing file stays a FileNotFoundError)
    if template is not None:
        raise template
    return spec, prompts


def generate(
    cfg: DictConfig,
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data_tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Write (or finish writing) ``output_dir/completions.jsonl`` for ``cfg.generate``: the
    teacher's with its ``tokenizer``, a split of the data made with ``data_tokenizer`` (the
    run's; default ``tokenizer``)."""
    spec, prompts = prepared(cfg, tokenizer, data_tokenizer)
    return answer(cfg, teacher, tokenizer, spec, prompts, data_tokenizer)


def answer(
    cfg: DictConfig,
    teacher,
    tokenizer,
    spec: GenerateSpec,
    prompts: list,
    data_tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """The completions of ``prompts`` into ``output_dir/completions.jsonl``, and a line on
    those ``generate.max_new_tokens`` cut off; a split's are recorded as cut by
    ``data_tokenizer`` (default ``tokenizer``)."""
    out = Path(cfg.output_dir) / OUTPUT_NAME
    overwrite = bool(cfg.get("overwrite"))
    # quantize too: a resume with it changed is named by it, not by the weights' digest alone
    source = {key: cfg.teacher.get(key) for key in ("path", "gguf_file", "quantize")}
    split = (data_tokenizer or tokenizer) if spec.prompts in SPLITS else None
    args = (teacher, tokenizer, prompts, spec, out, cfg.seed, overwrite, source, split)
    write_completions(*args)
    if report := cut_report(out, spec.max_new_tokens):
        print(report, flush=True)
    return out


TEACHERS_LIST = [
    "teachers is set, and lightning-kd generate writes one teacher's completions, the teacher "
    "group's (the others' were not written); add teachers=null to write those, and generate "
    "each other teacher's with its own teacher.path into its own hydra.run.dir"
]
"""Why a ``teachers`` list is refused: all but one of its teachers went silently unused."""


def task_errors(cfg: DictConfig) -> list[str]:
    """A teacher that writes no text: an encoder (``experiment=minilm``) has no ``generate``."""
    task = cfg.teacher.get("task", "causal_lm")
    if task == "causal_lm":
        return []
    return [
        f"teacher.task={task}: lightning-kd generate writes a causal LM's text, and an {task} "
        "teacher writes none; generate with a causal LM teacher (teacher=smollm2, or your "
        "own with teacher.task=causal_lm)"
    ]


def prompts_errors(cfg: DictConfig) -> list[str]:
    """A prompt file that is not there, refused with the config: it was a traceback once the
    precision was resolved and the teacher's tokenizer loaded."""
    prompts = cfg.generate.get("prompts")
    if not isinstance(prompts, str) or prompts in SPLITS:
        return []
    path = Path(prompts).expanduser()
    return [] if path.is_file() else [prompts_file_error(path)]


def run_generate(cfg: DictConfig) -> Path:
    """Load the teacher as a run would (``teacher.quantize`` applied) and write its completions
    (a split of the data made as a run with these student settings makes it: with the student's
    own tokenizer where it has one); every value, and each prompt with
    ``generate.max_new_tokens`` after it against the teacher's positions, checked before the
    teacher loads."""
    extra = training_run_errors(Path(cfg.output_dir), "generate") + task_errors(cfg)
    extra += prompts_errors(cfg)
    check_entry(
        cfg,
        lengths=[teacher_length(cfg, "generate.max_new_tokens")],
        extra=extra + (TEACHERS_LIST if cfg.get("teachers") else []),
    )
    if note := one_process_note(cfg):
        print(note, flush=True)
    cfg, _ = with_precision(cfg)
    teacher_spec = instantiate(cfg.teacher, _convert_="all")
    tokenizer = load_tokenizer(teacher_spec)
    # A split is the run's: made with the student's own tokenizer where it has one.
    student = instantiate(cfg.student, _convert_="all")
    data_tokenizer = student_tokenizer(student) if cfg.generate.prompts in SPLITS else None
    spec, prompts = prepared(cfg, tokenizer, data_tokenizer)
    lengths = [len(ids) for ids in prompt_tokens(tokenizer, [prompt for _, prompt in prompts])]
    limit = teacher_positions(teacher_spec)
    if error := room_error(
        "generate.max_new_tokens", spec.max_new_tokens, lengths, limit, "the teacher"
    ):
        refuse([error])
    teacher = load_teacher(teacher_spec, cfg.trainer.precision)
    if teacher_spec.quantize is not None:
        quantize_teacher(teacher, teacher_spec.quantize)
    teacher.to("cuda" if torch.cuda.is_available() else "cpu")
    written = answer(cfg, teacher, tokenizer, spec, prompts, data_tokenizer)
    # Recorded once written: a generate refused for an output another one holds leaves it be.
    record_job(cfg, Path(cfg.output_dir))
    return written


def use_chat_template(
    tokenizer: PreTrainedTokenizerBase, spec: GenerateSpec, data_template: str | None = None
) -> None:
    """Give ``tokenizer`` ``generate.chat_template`` if set; refuse one without a template,
    naming the run's ``data.chat_template`` (``data_template``) where one is set: it was there,
    unsaid (probe 44)."""
    if spec.chat_template is not None:
        tokenizer.chat_template = template_text(spec.chat_template, "generate.chat_template")
    if tokenizer.chat_template is None:
        # Refused, not raised: the tokenizer loads in a second, and this is the user's to set.
        refuse(
            [
                "generate.chat_template=null: the teacher's tokenizer has no chat template to "
                "render the chat prompts with (a base model's); set generate.chat_template=plain "
                "(User: ... / Assistant:), or a file holding a Jinja template or the template "
                "itself, e.g. generate.chat_template=template.jinja; on data=text, "
                "generate.prompts=train_split continues the training documents instead"
                + (
                    ""
                    if data_template is None
                    else f"; the run renders its conversations with data.chat_template="
                    f"{data_template}, which generate.chat_template={data_template} gives the "
                    "teacher too"
                )
            ]
        )
