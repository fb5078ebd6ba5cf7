"""One completions file, one generation, one writer: a resume with other settings or another
teacher is refused with each difference named, and so is a second writer."""

from __future__ import annotations

import json

import pytest

from lightning_kd.generation.completions_record import (
    CompletionsMismatch,
    lock_path,
    record_path,
)
from lightning_kd.launch.generate import generate
from lightning_kd.models.digests import weights_digest
from lightning_kd.models.loading import TeacherSpec, load_teacher
from lightning_kd.utils.locks import WriterLocked
from tests.conftest import TINY_LLAMA
from tests.unit.generation.test_generate import config, tokenizer, write_prompts
from tests.unit.utils.test_locks import held_by_another_process


def tiny_teacher(init_seed: int = 0):
    spec = TeacherSpec(path=None, config=dict(TINY_LLAMA), init_seed=init_seed)
    return load_teacher(spec, "32-true")


@pytest.fixture(scope="module")
def teacher():
    return tiny_teacher()


OTHER_SETTINGS = {
    ("generate.do_sample=true", "generate.temperature=1.5"): [
        "generate.do_sample: the file's False, this run's True",
        "generate.temperature: the file's 1.0, this run's 1.5",
    ],
    ("generate.max_new_tokens=8",): ["generate.max_new_tokens: the file's 6, this run's 8"],
    ("generate.batch_size=2",): ["generate.batch_size: the file's 3, this run's 2"],
    ("seed=1",): ["seed: the file's 0, this run's 1"],
    # named by the setting, not only by the quantized weights' digest
    ("teacher.quantize=int8",): ["teacher.quantize: the file's None, this run's 'int8'"],
}


def test_a_resume_with_other_settings_or_teacher_is_refused(teacher, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 5)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    whole = out.read_text()
    stopped = "".join(whole.splitlines(keepends=True)[:2])
    out.write_text(stopped)  # as a run stopped after two rows leaves it
    recorded = json.loads(record_path(out).read_text())
    assert recorded["generate.max_new_tokens"] == 6 and recorded["seed"] == 0
    assert recorded["teacher.weights"] == weights_digest(teacher)

    for overrides, named in OTHER_SETTINGS.items():
        with pytest.raises(CompletionsMismatch) as error:
            generate(config(tmp_path / "g", prompts, *overrides), teacher, tokenizer())
        message = str(error.value)
        assert all(line in message for line in named), message
        assert "delete" in message and "overwrite=true" in message and "hydra.run.dir" in message
    other = tiny_teacher(init_seed=1)  # the same config, other weights
    with pytest.raises(CompletionsMismatch, match=r"teacher.weights: the file's '\w+', this run"):
        generate(config(tmp_path / "g", prompts), other, tokenizer())
    assert out.read_text() == stopped  # nothing appended by any of them

    assert generate(config(tmp_path / "g", prompts), teacher, tokenizer()).read_text() == whole
    # overwrite=true starts the file anew, under the new settings
    generate(config(tmp_path / "g", prompts, "seed=1", "overwrite=true"), teacher, tokenizer())
    assert json.loads(record_path(out).read_text())["seed"] == 1


def test_a_file_begun_by_the_previous_row_format_is_not_continued(teacher, tmp_path) -> None:
    """Rows the previous version wrote (top-50 sampling, the model's processors, cut answers
    unmarked) were continued under the new decoding: one file, two decodings."""
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    out.write_text(out.read_text().splitlines(keepends=True)[0])
    recorded = json.loads(record_path(out).read_text())
    del recorded["rows"]  # as the previous version recorded it
    record_path(out).write_text(json.dumps(recorded))
    with pytest.raises(CompletionsMismatch, match=r"rows: the file's 1, this run's 2 \(rows made"):
        generate(config(tmp_path / "g", prompts), teacher, tokenizer())


def test_a_file_begun_without_a_record_is_continued_with_a_warning(teacher, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    whole = out.read_text()
    out.write_text(whole.splitlines(keepends=True)[0])
    record_path(out).unlink()  # as an older version left it
    with pytest.warns(UserWarning, match=r"has no completions.meta.json .* unknown"):
        generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    assert out.read_text() == whole and record_path(out).is_file()


def test_a_damaged_record_is_named_with_the_fix(teacher, tmp_path) -> None:
    """A completions.meta.json cut short was a JSONDecodeError traceback that named no file
    (probe 59); a damaged record is not a missing one: the rows' settings are unknown."""
    from lightning_kd.utils.records import DamagedRecord

    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    out.write_text(out.read_text().splitlines(keepends=True)[0])
    record_path(out).write_text(record_path(out).read_text()[:60])
    refused = rf"^{record_path(out)} cannot be read \(.*\): restore it, or delete {out} \(over"
    with pytest.raises(DamagedRecord, match=refused):
        generate(config(tmp_path / "g", prompts), teacher, tokenizer())


def test_a_second_generate_into_one_output_is_refused(teacher, tmp_path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "g" / "completions.jsonl"
    with held_by_another_process(lock_path(out)) as holder:
        refused = rf"{out} is being written by another process \(pid {holder.pid}, .*hydra.run.dir"
        with pytest.raises(WriterLocked, match=refused):
            generate(config(tmp_path / "g", prompts), teacher, tokenizer())
        assert not out.exists() and not record_path(out).exists()
    assert (
        len(
            generate(config(tmp_path / "g", prompts), teacher, tokenizer()).read_text().splitlines()
        )
        == 2
    )


def test_a_moved_teacher_continues_and_its_path_is_named_beside_a_difference(
    teacher, tmp_path
) -> None:
    """The teacher is what its digests say: the same weights from another path continue the file;
    other weights are refused, the paths named with them."""
    prompts = write_prompts(tmp_path / "p.jsonl", 4)
    out = generate(config(tmp_path / "g", prompts), teacher, tokenizer())
    whole = out.read_text()
    out.write_text(whole.splitlines(keepends=True)[0])
    moved = config(tmp_path / "g", prompts)
    moved.teacher.path = "/models/moved"
    other = tiny_teacher(init_seed=1)
    with pytest.raises(CompletionsMismatch, match=r"teacher.path: the file's None, this run's '/"):
        generate(moved, other, tokenizer())
    assert generate(moved, teacher, tokenizer()).read_text() == whole
