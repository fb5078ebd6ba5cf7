"""A resume's objective and data settings against its checkpoint's record, before anything
loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.resume_settings import (
    COMPARED,
    check_resume_settings,
    early_differences,
)
from lightning_kd.models.loading import byte_tokenizer
from lightning_kd.utils.refusal import Refused
from tests.unit.launch.test_inert_keys import EXPERIMENTS


def as_recorded(overrides: list[str], text: Path) -> dict:
    """The record's objective and data parts of a run of ``overrides``, as the module and the
    data module it builds hold them (the data's of a text or chat run)."""
    cfg = compose_config(overrides)
    distill = dataclasses.asdict(instantiate(cfg.distill, _convert_="all"))
    found = {"distill": {key: distill[key] for key in COMPARED["distill"]}}
    if cfg.data.get("dataset", {}).get("path") is None and not cfg.data.get("streaming"):
        # the byte tokenizer has no chat template, and a generated file is not there (``text``
        # stands in): neither is compared
        chat = {"chat_template": "plain"} if "chat_template" in cfg.data else {"files": [text]}
        data = instantiate(cfg.data, tokenizer=byte_tokenizer(), _convert_="all", **chat)
        found["data"] = {key: getattr(data, key) for key in COMPARED["data"]}
    return found


@pytest.mark.parametrize("experiment", [None, "debug=smoke", *EXPERIMENTS])
def test_a_run_resumed_as_launched_differs_in_nothing(experiment: str | None, corpus) -> None:
    """Every shipped config gives the values its module and data record: none is refused."""
    overrides = [] if experiment is None else [experiment]
    if experiment in EXPERIMENTS:
        overrides = [f"experiment={experiment}"]
    assert early_differences(as_recorded(overrides, corpus), compose_config(overrides)) == []


def test_a_resume_with_another_objective_or_data_is_refused_before_anything_loads(
    tmp_path, corpus
) -> None:
    """It loaded the teacher and wrote a whole teacher cache (5 minutes) for the settings it
    was then refused for (probe 58)."""
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"provenance": as_recorded(["debug=smoke"], corpus)}, checkpoint)
    check_resume_settings(checkpoint, compose_config(["debug=smoke"]))
    forgot = compose_config(["debug=smoke", "distill.temperature=2", "data.block_size=32"])
    with pytest.raises(Refused) as refused:
        check_resume_settings(checkpoint, forgot)
    assert str(refused.value) == (
        f"{checkpoint} was trained with a different objective or data:\n"
        "  distill.temperature: checkpoint 1.0, this run 2\n"
        "  data.block_size: checkpoint 64, this run 32\n"
        "Resume with the same settings (the overrides its run was launched with), start a new "
        "run, or pass resume_mismatch=warn to continue anyway"
    )
    check_resume_settings(checkpoint, compose_config(["debug=smoke", "resume_mismatch=warn"]))
    split = ["data.batch_size=2", "trainer.accumulate_grad_batches=2"]
    split = compose_config(["debug=smoke", *split])
    check_resume_settings(checkpoint, split)  # a regroup: the restore judges it


def test_a_resume_of_an_edited_data_file_is_refused_before_anything_loads(tmp_path) -> None:
    """It wrote a teacher cache for the edited data (the shared cache's), then was refused
    (probe 59)."""
    from lightning_kd.data.provenance import files_record
    from lightning_kd.launch.resume_settings import files_differences

    text = tmp_path / "ed.txt"
    text.write_text("the first words of a corpus")
    smoke = compose_config(["debug=smoke", f"data.files=[{text}]"])
    saved = {"data": {"files": files_record([text], {})}}
    assert files_differences(saved, smoke) == []
    text.write_text("the first words of a corpus, and more")
    assert files_differences(saved, smoke) == [f"data.files: edited ['{text}']"]
    saved = {"data": {"files": {"python_reference": "x", "smollm2_generated": "y"}}}
    default = compose_config(["debug=smoke"])  # the embedded corpora, by their names
    assert files_differences(saved, default) == [
        "data.files: edited ['python_reference', 'smollm2_generated']"
    ]


def test_a_resume_with_another_schedule_length_is_refused_before_anything_loads(tmp_path):
    """A forgotten trainer.max_steps was refused once the models had loaded and the restore
    began (verify 60); a lengthened constant schedule, or a reset on purpose, goes on."""
    checkpoint = tmp_path / "last.ckpt"
    torch.save({"provenance": {"schedule": {"max_steps": 6}}, "global_step": 6}, checkpoint)
    longer = ["debug=smoke", "trainer.max_steps=12"]
    with pytest.raises(Refused, match=r"schedule.max_steps: checkpoint 6, this run 12\n.*reset"):
        check_resume_settings(checkpoint, compose_config(longer))
    check_resume_settings(checkpoint, compose_config([*longer, "resume_reset_optimizer=true"]))
    check_resume_settings(checkpoint, compose_config([*longer, "scheduler=constant"]))
    check_resume_settings(checkpoint, compose_config(["debug=smoke", "trainer.max_steps=6"]))
