"""What a finished run writes last — the exported student — names a full disk as one."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import transformers.modeling_utils
from omegaconf import OmegaConf
from safetensors import SafetensorError

from lightning_kd.launch.gguf_export import export_gguf
from lightning_kd.launch.train import export_student
from tests.conftest import make_module


def test_a_student_the_disk_has_no_room_for_is_named(tiny_teacher, tmp_path: Path, monkeypatch):
    def full_disk(tensors, filename, metadata=None) -> None:  # safetensors' own words for ENOSPC
        Path(filename).write_bytes(b"\x00" * 8)
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
            'space left on device" })'
        )

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    module = make_module(tiny_teacher)
    module.configure_model()  # the models, as Lightning builds them at fit
    directory = tmp_path / "run" / "student"
    with pytest.raises(OSError) as error:
        export_student(module, directory)
    assert error.value.errno == errno.ENOSPC
    assert f"no space left on {directory}: free space and resume with ckpt_path=last" in str(
        error.value
    )
    assert isinstance(error.value.__cause__, SafetensorError)


def test_a_student_path_that_is_a_file_fails_the_export(tiny_teacher, tmp_path: Path) -> None:
    """transformers only logs that the path should be a directory and writes nothing: the run
    would end with exit 0 and no student."""
    module = make_module(tiny_teacher)
    module.configure_model()
    directory = tmp_path / "student"
    directory.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"is a file, not the directory the student"):
        export_student(module, directory)
    export_student(module, tmp_path / "fine")
    assert (tmp_path / "fine" / "config.json").is_file()


def test_a_resumed_run_leaves_no_gguf_of_its_earlier_student(tiny_teacher, tmp_path: Path):
    """A resume with another export.gguf (or none) left the first GGUF, of the student before
    the resumed steps, beside the new one, and the summary listed it as written."""
    module = make_module(tiny_teacher)
    module.configure_model()
    student = tmp_path / "student"
    export_student(module, student)
    stale = tmp_path / "student.q8_0.gguf"
    stale.write_bytes(b"the student before the resumed steps")
    written = export_gguf(OmegaConf.create({"export": {"gguf": "f16"}}), student, "then")
    assert written == tmp_path / "student.f16.gguf" and written.is_file()
    assert not stale.exists()
    assert export_gguf(OmegaConf.create({"export": {"gguf": None}}), student, "then") is None
    assert not written.exists()
