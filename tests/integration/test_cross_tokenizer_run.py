"""A run whose teacher has another tokenizer than its student, through the command line."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from tokenizers import normalizers
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.cache import TeacherCache
from lightning_kd.models.loading import byte_tokenizer, model_from_config
from tests.conftest import TEXT, TINY_LLAMA, sentencepiece_tokenizer
from tests.integration.test_cli import run_in_process


def save_model(directory: Path, tokenizer, seed: int, **config) -> Path:
    """A tiny Llama sized for ``tokenizer`` (``config`` over it), saved with it (a teacher.path /
    student.source)."""
    torch.manual_seed(seed)
    config = {**TINY_LLAMA, "vocab_size": len(tokenizer), **config}
    model = model_from_config(config, "causal_lm")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path, Path]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT + "Naïve café owners sell 日本 tea.\n" * 20)
    teacher = save_model(tmp_path / "teacher", sentencepiece_tokenizer(), 0)
    student = save_model(tmp_path / "student", byte_tokenizer(), 1)
    return teacher, student, corpus


def overrides(teacher: Path, student: Path, corpus: Path, run_dir: Path) -> list[str]:
    return [
        "train",
        "debug=smoke",
        f"teacher.path={teacher}",
        "teacher.config=null",
        "teacher.dtype=float32",
        f"student.source={student}",
        "student.num_layers=2",
        f"data.files=[{corpus}]",
        "distill.features=null",
        "export.gguf=null",
        f"hydra.run.dir={run_dir}",
    ]


def test_a_teacher_with_another_tokenizer_trains_the_student_and_reports_bits_per_byte(
    models, tmp_path: Path, capsys
) -> None:
    teacher, student, corpus = models
    run_dir = tmp_path / "run"
    code, output = run_in_process(overrides(teacher, student, corpus, run_dir), capsys)
    assert code in (None, 0), output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    after = summary["after"]
    assert 0.3 < after["val/aligned"] <= 1.0  # most byte positions start a teacher token
    assert after["val/bpb"] > 0 and after["val/teacher_bpb"] > 0
    assert after["val/kl"] >= 0
    # The student is saved with its own tokenizer, not the teacher's.
    saved = AutoTokenizer.from_pretrained(run_dir / "student")
    assert saved.get_vocab() == byte_tokenizer().get_vocab()
    assert "teacher: online (auto: " in output


def test_the_samples_teacher_reads_its_own_tokens_of_the_prompt(models, tmp_path, capsys):
    """+callbacks=samples gave a teacher with another tokenizer the student's ids as its own,
    and spelled its answer with the student's tokenizer: the column was noise."""
    _, student, _ = models
    # Untied: a tiny tied model repeats the prompt's last token, whatever tokenizer reads it.
    untied = {"tie_word_embeddings": False}
    teacher = save_model(tmp_path / "untied", sentencepiece_tokenizer(), 2, **untied)
    corpus = tmp_path / "ascii.txt"  # whole characters in every 32-byte prompt
    corpus.write_text(TEXT)
    run_dir = tmp_path / "samples"
    samples = ["+callbacks=samples", "callbacks.samples.prompts=2"]
    samples += ["callbacks.samples.max_new_tokens=6", "trainer.max_steps=1"]
    argv = [*overrides(teacher, student, corpus, run_dir), *samples]
    code, output = run_in_process(argv, capsys)
    assert code in (None, 0), output[-3000:]
    with open(run_dir / "samples.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    model = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    for row in rows:
        ids = tokenizer(row["prompt"], return_tensors="pt")["input_ids"]  # its BOS, its pieces
        assert ids[0, 0] == tokenizer.bos_token_id
        with torch.no_grad():
            new = model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :]
        assert row["teacher"] == tokenizer.decode(new, skip_special_tokens=True)


def test_what_the_cross_tokenizer_path_cannot_serve_is_refused_before_step_0(
    models, tmp_path: Path, capsys
) -> None:
    teacher, student, corpus = models
    argv = overrides(teacher, student, corpus, tmp_path / "refused")
    code, output = run_in_process([*argv, "distill.features=spans"], capsys)
    assert code == 2  # with the config: no traceback, before the data is read
    assert "cross-tokenizer" in output and "distill.features=null" in output
    assert "Traceback" not in output
    assert not (tmp_path / "refused" / "checkpoints").exists()


def test_two_teachers_with_two_tokenizers_log_each_divergence(models, tmp_path: Path, capsys):
    teacher, _, corpus = models
    run_dir = tmp_path / "two"
    argv = [
        "train",
        "debug=smoke",
        f"data.files=[{corpus}]",
        "distill.features=null",
        "export.gguf=null",
        "teachers=[{name: tiny, weight: 0.6}, "
        f"{{name: sentencepiece, weight: 0.4, path: '{teacher}', dtype: float32}}]",
        f"hydra.run.dir={run_dir}",
    ]
    code, output = run_in_process(argv, capsys)
    assert code in (None, 0), output[-3000:]
    header = (run_dir / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/kd/tiny", "train/kd/sentencepiece", "train/kd"} <= set(header)
    after = json.loads((run_dir / "summary.json").read_text())["after"]
    for name in ("tiny", "sentencepiece"):  # each teacher's own validation figures
        assert after[f"val/kl/{name}"] >= 0 and 0 <= after[f"val/agreement/{name}"] <= 1
    # The share of positions aligned with the teacher of another tokenizer, as val/aligned is
    # for a run with that teacher alone; the teacher of the student's tokens has none.
    assert 0.3 < after["val/aligned/sentencepiece"] < 1 and "val/aligned/tiny" not in after
    # The second teacher's bits per byte, over its own tokens, beside the teacher group's.
    assert after["val/teacher_bpb/sentencepiece"] > 0 and after["val/teacher_bpb"] > 0
    assert "| teachers[sentencepiece] bits per byte (val) |" in output


@pytest.mark.parametrize(
    ("prose", "code"), [("prose", "code"), (2023, 2024)], ids=["words", "years"]
)
def test_each_teacher_teaches_its_own_data_domain(models, tmp_path: Path, capsys, prose, code):
    """data.domains groups the files; each teacher (one of them across tokenizers) teaches the
    rows of its domain; both divergences are logged; a domain no teacher teaches is refused.
    Domains named by numbers (years) are names too: their keys, which no dotted path reached,
    ended the config check in a traceback (probe 39)."""
    teacher, _, corpus = models
    source = tmp_path / "code.txt"
    source.write_text("def add(a, b):\n    return a + b\n" * 30)
    argv = [
        "train",
        "debug=smoke",
        f"data.files=[{corpus},{source}]",
        f"data.domains={{{prose}: ['{corpus}'], {code}: ['{source}']}}",
        "distill.features=null",
        "export.gguf=null",
        f"teachers=[{{name: tiny, weight: 0.5, domains: [{code}]}}, "
        f"{{name: sentencepiece, weight: 0.5, path: '{teacher}', dtype: float32, "
        f"domains: [{prose}]}}]",
    ]
    code_, output = run_in_process([*argv, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code_ in (None, 0), output[-3000:]
    header = (tmp_path / "run" / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/kd/tiny", "train/kd/sentencepiece"} <= set(header)
    both_code = argv[-1].replace(f"domains: [{prose}]", f"domains: [{code}]")
    untaught = [*argv[:-1], both_code]
    code_, output = run_in_process([*untaught, f"hydra.run.dir={tmp_path / 'no'}"], capsys)
    assert code_ == 2, output[-3000:]
    assert f"data.domains ['{prose}'] are taught by no teacher" in output
    assert "drop them from data.domains and their files from data.files" in output  # else: refused


def test_each_teacher_teaches_its_domain_of_a_stream(models, tmp_path, datasets_home, capsys):
    """Streamed, data.domains groups data.domain_field's values: the rows come interleaved,
    each teacher still teaches the blocks of its own domain, both divergences logged."""
    teacher, _, corpus = models
    prose = [line for line in corpus.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(prose * 2):
        rows.append({"text": line, "source": "books"})
        rows.append({"text": f"def add_{i}(a, b):\n    return a + b\n", "source": "python"})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = [
        "train",
        "debug=smoke",
        "data.files=null",
        "data.dataset.path=json",
        f"data.dataset.data_files={data}",
        "data.streaming=true",
        "data.val_size=4",
        "data.domain_field=source",
        "data.domains={prose: [books], code: [python]}",
        "distill.features=null",
        "export.gguf=null",
        "teachers=[{name: tiny, weight: 0.5, domains: [code]}, "
        f"{{name: sentencepiece, weight: 0.5, path: '{teacher}', dtype: float32, "
        "domains: [prose]}]",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    code_, output = run_in_process(argv, capsys)
    assert code_ in (None, 0), output[-3000:]
    with open(tmp_path / "run" / "logs" / "metrics.csv") as table:
        logged = list(csv.DictReader(table))
    for name in ("train/kd/tiny", "train/kd/sentencepiece"):  # each ran on some step's rows
        assert any(row.get(name) for row in logged), name


def test_each_teacher_is_cached_on_its_own_and_found_again(models, tmp_path: Path, capsys):
    """`cache: auto` on the second teacher (another tokenizer) and distill.teacher_cache=auto on
    the first: each written once into the shared cache, then trained from (no teacher model in
    training); the same command again finds both caches whole."""
    teacher, _, corpus = models
    argv = [
        "train",
        "debug=smoke",
        f"data.files=[{corpus}]",
        "distill.features=null",
        "data.max_train_examples=12",  # 6 steps of 4 blocks: 2 passes, which a cache pays for
        "distill.teacher_cache=auto",
        f"cache.dir={tmp_path / 'caches'}",
        "export.gguf=null",
        "teachers=[{name: tiny, weight: 0.6}, "
        f"{{name: sentencepiece, weight: 0.4, path: '{teacher}', dtype: float32, cache: auto}}]",
    ]
    lines = []
    for run in ("first", "again"):
        code, output = run_in_process([*argv, f"hydra.run.dir={tmp_path / run}"], capsys)
        assert code in (None, 0), output[-3000:]
        lines.append([line for line in output.splitlines() if line.startswith("teacher")])
        header = (tmp_path / run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
        assert {"train/kd/tiny", "train/kd/sentencepiece"} <= set(header)
    first, again = lines
    assert any(line.startswith("teachers[sentencepiece]: cached once in") for line in first)
    assert sum("written to the shared cache" in line for line in first) == 2, first
    assert sum("found whole in the shared cache" in line for line in again) == 2, again
    assert len(list((tmp_path / "caches").glob("*/index.json"))) == 2


def test_the_cache_command_writes_a_cross_tokenizer_cache_a_run_trains_from(
    models, tmp_path, capsys
):
    """`lightning-kd cache` with a student of another tokenizer writes the teacher's records at
    the student's positions; the run trains from them without the teacher and reports its bits
    per byte from the cache; a cache of another student tokenizer is refused before step 0."""
    teacher, student, corpus = models
    cache_dir, run_dir = tmp_path / "cache", tmp_path / "run"
    argv = overrides(teacher, student, corpus, cache_dir)
    # The repair of a student copied from student.source reads that model, not this teacher:
    # no repair states are stored (Gemma was asked for SmolLM2's layer 22; probe 38).
    repair = "distill.blockwise_passes=1"
    code, output = run_in_process(["cache", *argv[1:], "cache.k=16", repair], capsys)
    assert code in (None, 0), output[-3000:]
    assert TeacherCache.open(cache_dir).key.features == ()
    reads = [f"distill.teacher_cache={cache_dir}", "distill.cross_top_k=16"]
    spans = ["distill.cross_span_weight=0.5"]  # read from the cache beside the top k
    argv = [*overrides(teacher, student, corpus, run_dir), *reads, *spans]
    code, output = run_in_process(argv, capsys)
    assert code in (None, 0), output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    after = summary["after"]
    assert after["val/teacher_bpb"] > 0 and 0.3 < after["val/aligned"] <= 1.0
    header = (run_dir / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/span", "train/kd"} <= set(header), "the span term is logged apart"
    # A cache named on the command line is in the summary as an auto one is (it said nothing).
    assert summary["teacher_cache"]["distill.teacher_cache"] == str(cache_dir)
    assert summary["teacher_cache"]["in_training"] == "cached once"
    assert summary["teacher_cache"]["reason"] == "given (distill.teacher_cache)"
    # The same cache for a student reading the teacher's own tokenizer: refused, and why.
    argv = [*overrides(teacher, teacher, corpus, tmp_path / "other"), *reads]
    code, output = run_in_process(argv, capsys)
    assert code not in (None, 0)
    assert "was not written for this run" in output
    assert "written for a student reading another tokenizer" in output
    assert not (tmp_path / "other" / "checkpoints").exists()


def test_a_student_copied_from_its_source_is_repaired_from_that_source(
    models, tmp_path: Path, capsys
) -> None:
    """The block-wise repair reads student.source's model (whose layers the student copied and
    whose tokenizer it reads), not the teacher's; the source is released before training."""
    teacher, student, corpus = models
    run_dir = tmp_path / "repaired"
    argv = [*overrides(teacher, student, corpus, run_dir), "distill.blockwise_passes=1"]
    code, output = run_in_process(argv, capsys)
    assert code in (None, 0), output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["blockwise"]["steps"] > 0 and summary["blockwise"]["layers"]
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert not [key for key in state if not key.startswith("distiller.student.")]


def test_the_spelled_share_is_judged_before_step_0_online_from_a_cache_and_when_caching(
    tmp_path: Path, capsys
) -> None:
    """A lower-casing teacher, judged on the run's first 8 training blocks before step 0, in
    every path: online (it was judged inside the first step, then told to "start again with"
    the command that had failed: probe 39), from a cache written under a lower floor (a run
    from the cache applied none: probe 32), and by the cache command before any shard."""
    teacher = save_model(tmp_path / "teacher", sentencepiece_tokenizer(normalizers.Lowercase()), 0)
    student = save_model(tmp_path / "student", byte_tokenizer(), 1)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)  # the capitals that open its sentences are not spelled back
    floor = "distill.cross_min_aligned=0.99"
    refusal = r"spells back (\d+\.\d)% of the first 8 training blocks .*cross_min_aligned=0.99"
    argv = [*overrides(teacher, student, corpus, tmp_path / "online"), floor]
    code, output = run_in_process(argv, capsys)
    assert code == 2 and re.search(refusal, output), output[-3000:]
    assert "Start again with" not in output and "Traceback" not in output
    cache_dir = tmp_path / "cache"
    argv = ["cache", *overrides(teacher, student, corpus, cache_dir)[1:], "cache.k=16"]
    code, output = run_in_process([*argv, floor], capsys)
    assert code == 2 and re.search(refusal, output), output[-3000:]
    assert not list(cache_dir.glob("*.safetensors"))
    code, output = run_in_process(
        [*argv, "distill.cross_min_aligned=0.5", "overwrite=true"], capsys
    )
    assert code in (None, 0), output[-3000:]
    reads = [f"distill.teacher_cache={cache_dir}", "distill.cross_top_k=16", floor]
    code, output = run_in_process(
        [*overrides(teacher, student, corpus, tmp_path / "run"), *reads], capsys
    )
    assert code == 2 and re.search(refusal, output), output[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
