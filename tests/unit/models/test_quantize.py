"""teacher.quantize=int8: an int8 teacher that computes what the full-precision one does, trains a
student through the chunked loss, resumes, and refuses what it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_kd.launch.cache import write
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.teacher_list import held_precisions
from lightning_kd.models import quantize
from lightning_kd.models.layer_config import decoder_layers
from lightning_kd.models.loading import TeacherSpec, load_teacher
from lightning_kd.models.quantize import is_quantized, tensor_bytes
from lightning_kd.training.module import DistillationModule
from lightning_kd.training.provenance import KEY as PROVENANCE_KEY
from lightning_kd.training.provenance import Provenance, ProvenanceMismatch
from lightning_kd.training.saving import LastCheckpoint
from lightning_kd.training.summary import RunSummary
from lightning_kd.utils.compat import DDP_IGNORE
from lightning_kd.utils.refusal import Refused
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer
from tests.integration.test_cli import command_here, run_cli

INT8 = TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32", quantize="int8")
FP32 = TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32")


def built(teacher: TeacherSpec):
    module = make_module(teacher)
    module.configure_model()
    return module


def test_int8_teacher_holds_int8_block_weights_and_computes_like_fp32() -> None:
    module, reference = built(INT8), load_teacher(FP32)
    teacher = module.teacher
    linears = {n: m for n, m in teacher.named_modules() if isinstance(m, torch.nn.Linear)}
    head = teacher.get_output_embeddings()
    blocks = [m for m in linears.values() if m is not head]
    assert blocks and all(m.weight.qdata.dtype == torch.int8 for m in blocks)
    for module_ in blocks:  # int8 data and a scale per row: under 30% of the fp32 bytes
        assert tensor_bytes(module_.weight) < 0.3 * module_.weight.numel() * 4
    # The head stays a plain fp32 tensor, still the (tied) embedding: the chunked loss reads it.
    assert not is_quantized(head.weight) and head.weight.dtype == torch.float32
    assert head.weight is teacher.get_input_embeddings().weight
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())

    ids = torch.randint(0, 257, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = reference(input_ids=ids).logits, teacher(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16-mixed runs it too
            mixed = teacher(input_ids=ids).logits.float()
    assert torch.allclose(got, expected, atol=2e-2)
    assert torch.allclose(mixed, expected, atol=5e-2)

    # The student copied the teacher's full-precision layers, before the teacher was quantized.
    student_layer = decoder_layers(module.student)[1][0].self_attn.q_proj.weight
    assert torch.equal(student_layer, decoder_layers(reference)[1][0].self_attn.q_proj.weight)
    # DDP would broadcast the int8 weights from rank 0, which they do not support: left out.
    ignored = getattr(module, DDP_IGNORE)
    assert "distiller.teacher.model.layers.0.self_attn.q_proj.weight" in ignored
    assert not any(name.startswith("distiller.student.") for name in ignored)


def test_a_teacher_with_no_plain_linear_weight_is_refused_not_run_in_fp32() -> None:
    """GPT-2's Conv1D blocks quantized nothing while the summary said int8 weights; Falcon's
    Linear subclass multiplies ``input @ self.weight.T`` itself, which torchao's int8 tensor
    does not run: a traceback once validating (probe 31). A plain Linear beside such a layer is
    still quantized; the layer itself stays in full precision."""
    from transformers import AutoModelForCausalLM, FalconConfig, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(
        GPT2Config(vocab_size=257, n_embd=32, n_layer=2, n_head=4)
    )
    with pytest.raises(
        Refused, match=r"GPT2LMHeadModel has no nn.Linear .*\(its layers are Conv1D\)"
    ):
        quantize.quantize_teacher(gpt2, "int8")
    small = {"vocab_size": 257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    falcon = AutoModelForCausalLM.from_config(FalconConfig(**small))
    with pytest.raises(Refused, match=r"\(its layers are FalconLinear\).*teacher.quantize=null"):
        quantize.quantize_teacher(falcon, "int8")

    class OwnMatmul(torch.nn.Linear):
        def forward(self, x):
            return x @ self.weight.T

    mixed = torch.nn.Sequential(torch.nn.Linear(32, 32), OwnMatmul(32, 32))
    with pytest.warns(UserWarning, match=r"int8: 50% of Sequential's block weights stay in full"):
        quantize.quantize_teacher(mixed, "int8")
    assert is_quantized(mixed[0].weight) and not is_quantized(mixed[1].weight)
    assert mixed(torch.randn(2, 32)).shape == (2, 32)


def test_a_mixture_of_experts_left_in_full_precision_is_said() -> None:
    """transformers 5 holds Mixtral's experts as 3-D tensors, not nn.Linear: 89 % of its block
    weights stayed fp32 under "int8 weights", unsaid (probe 45)."""
    from transformers import AutoModelForCausalLM, MixtralConfig

    small = {"vocab_size": 257, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    moe = MixtralConfig(**small, intermediate_size=64, num_local_experts=4, num_key_value_heads=4)
    mixtral = AutoModelForCausalLM.from_config(moe)
    with pytest.warns(UserWarning, match=r"int8: \d+% of MixtralForCausalLM's block weights st"):
        quantize.quantize_teacher(mixtral, "int8")


def test_a_teachers_entry_is_quantized_as_it_says_or_as_the_teacher_group_is() -> None:
    """An entry's own ``quantize: int8``, or the one it inherits from ``teacher.quantize``: its
    model computes with int8 weights (it ran full precision while the summary said int8), is
    left out of DDP's broadcast, and the summary names an entry quantized otherwise."""
    second = {**TINY_LLAMA, "num_hidden_layers": 3}
    own = [{"name": "main", "weight": 0.5}, {"name": "b", "weight": 0.5, "config": second}]
    cases = [
        (FP32, [own[0], {**own[1], "quantize": "int8"}], False),
        (INT8, own, True),
        (INT8, [own[0], {**own[1], "quantize": None}], True),
    ]
    for main, entries, main_int8 in cases:
        module = make_module(main, teachers=entries)
        module.configure_model()
        entry_int8 = entries[1].get("quantize", main.quantize) is not None
        extra = module.distiller.extra_teachers.model(0)
        assert is_quantized(extra.model.layers[0].self_attn.q_proj.weight) == entry_int8
        assert is_quantized(module.teacher.model.layers[0].self_attn.q_proj.weight) == main_int8
        ignored = getattr(module, DDP_IGNORE, [])
        name = "distiller.extra_teachers.models.0.model.layers.2.mlp.up_proj.weight"
        assert (name in ignored) == entry_int8
        assert ("distiller.teacher.lm_head.weight" in ignored) == main_int8
        cfg = compose_config(["debug=smoke", f"teacher.quantize={main.quantize or 'null'}"])
        precision = {"trainer.precision": "32-true", "teacher.dtype": "float32"}
        summary = RunSummary({}, precision=precision | held_precisions(cfg, module.teachers))
        row = summary.markdown().split("| precision |  | ")[1].split(" |")[0]
        expected = {
            (False, True): "32-true, teacher float32, teachers[b] int8 weights",
            (True, True): "32-true, teacher float32, int8 weights",
            (True, False): "32-true, teacher float32, int8 weights, teachers[b] "
            "full-precision weights",
        }
        assert row == expected[main_int8, entry_int8]


def fit(
    tmp_path: Path,
    teacher: TeacherSpec,
    corpus: Path,
    ckpt: Path | None = None,
    student: dict | None = None,
):
    module = make_module(teacher, student)
    trainer = make_trainer(
        max_steps=4 if ckpt else 2,
        enable_checkpointing=True,
        callbacks=[LastCheckpoint(str(tmp_path / "checkpoints"), every=1), Provenance()],
    )
    trainer.fit(module, make_datamodule([corpus]), ckpt_path=ckpt)
    return module, trainer, tmp_path / "checkpoints" / "last.ckpt"


def test_an_int8_teacher_trains_resumes_and_a_resume_without_it_is_refused(
    tmp_path: Path, corpus: Path
) -> None:
    module, _, checkpoint = fit(tmp_path, INT8, corpus)
    assert module.teacher_digest is not None
    assert not any(
        key.startswith("distiller.teacher.") for key in torch.load(checkpoint)["state_dict"]
    )
    resumed, trainer, _ = fit(tmp_path, INT8, corpus, checkpoint)
    assert trainer.global_step == 4 and resumed.teacher_digest == module.teacher_digest
    loaded = DistillationModule.load_from_checkpoint(checkpoint, weights_only=True)
    assert is_quantized(loaded.teacher.model.layers[0].mlp.up_proj.weight)
    for key, value in loaded.student.state_dict().items():
        torch.testing.assert_close(value, resumed.student.state_dict()[key])
    with pytest.raises(
        ProvenanceMismatch, match="teacher.quantize: checkpoint 'int8', this run None"
    ):
        fit(tmp_path, TeacherSpec(path=None, config=dict(TINY_LLAMA)), corpus, checkpoint)


def test_an_int8_teacher_distils_into_a_lora_student(tmp_path: Path, corpus: Path) -> None:
    """The two rebuilt-on-load parts together: the checkpoint holds the adapters alone (neither
    the int8 teacher nor the student's frozen base), records both, and loads back."""
    _, _, checkpoint = fit(tmp_path, INT8, corpus, student={"lora": {"r": 2, "alpha": 4}})
    saved = torch.load(checkpoint)
    assert saved["state_dict"] and all(".lora_" in key for key in saved["state_dict"])
    record = saved[PROVENANCE_KEY]
    assert record["teacher"]["quantize"] == "int8" and record["student"]["base"]
    loaded = DistillationModule.load_from_checkpoint(checkpoint, weights_only=True)
    assert is_quantized(loaded.teacher.model.layers[0].mlp.up_proj.weight)
    assert loaded.distiller.adapter is not None
    lora_b = {k: v for k, v in loaded.state_dict().items() if ".lora_B." in k}
    assert lora_b and all(torch.equal(v, saved["state_dict"][k]) for k, v in lora_b.items())


@pytest.mark.integration  # runs the command line in a subprocess
def test_smoke_run_with_an_int8_teacher(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli("debug=smoke", "teacher.quantize=int8", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["teacher_ppl"] > 0 and summary["precision"]["quantize"] == "int8"
    assert "| precision |  | 32-true, teacher float32, int8 weights |" in result.stdout
    assert summary["after"]["val/ppl"] < summary["before"]["val/ppl"]
    assert "Failed to load" not in result.stderr  # torchao's CUDA-kernel noise on a CPU torch
    assert "Setting accelerator to CPU" not in result.stdout  # DeepSpeed's, imported by the save


def test_bad_quantize_settings_fail_before_any_model_loads(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"teacher.quantize='int4' is not supported; .*\['int8'\]"):
        TeacherSpec(quantize="int4")
    with pytest.raises(ValueError, match="not teacher.dtype=float64; set teacher.dtype=float32"):
        TeacherSpec(quantize="int8", dtype="float64")
    cfg = compose_config(["debug=smoke", "teacher.quantize=int8", "trainer.accelerator=mps"])
    # (on a machine without MPS, trainer.accelerator=mps is refused too: launch/device_checks.py)
    assert [e for e in config_errors(cfg) if not e.startswith("trainer.accelerator")] == [
        "teacher.quantize=int8 runs on cpu or cuda, not trainer.accelerator=mps; set "
        "teacher.quantize=null there"
    ]
    cfg = compose_config(["debug=smoke", "teacher.quantize=int8", "strategy=fsdp"])
    assert any("strategy=fsdp" in e and "use strategy=ddp" in e for e in config_errors(cfg))
    assert not config_errors(compose_config(["debug=smoke", "teacher.quantize=int8"]))
    entry = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, path: x, quantize: int8}]"
    cfg = compose_config(["debug=smoke", entry, "trainer.accelerator=mps"])
    assert (
        "teachers[1].quantize=int8 runs on cpu or cuda, not trainer.accelerator=mps; set "
        "teachers[1].quantize=null there" in config_errors(cfg)
    )

    monkeypatch.setattr(quantize, "find_spec", lambda name: None)  # torchao not installed
    with pytest.raises(
        ModuleNotFoundError,
        match=r"needs the torchao package.*pip install 'lightning-kd\[quantize\]'",
    ):
        TeacherSpec(quantize="int8")


@pytest.mark.slow
def test_ddp_runs_an_int8_teacher_on_each_rank(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(
        "debug=smoke",
        "teacher.quantize=int8",
        "strategy=ddp",
        "trainer.devices=2",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6


@pytest.mark.integration  # runs the command line (in this process)
def test_a_cache_written_with_an_int8_teacher_serves_int8_runs_only(
    tmp_path: Path, corpus, capsys
) -> None:
    """The cache writer quantizes the teacher as the run does, so an int8 run's digest matches
    the int8 cache (and not a full-precision one: their weights differ)."""
    smoke = ["debug=smoke", f"data.files=[{corpus}]"]
    write(compose_config([*smoke, "teacher.quantize=int8"], output_dir=tmp_path / "int8"))
    ran = command_here(
        capsys,
        "run",
        *smoke,
        "teacher.quantize=int8",
        f"distill.teacher_cache={tmp_path / 'int8'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    refused = command_here(
        capsys,
        "run",
        *smoke,
        f"distill.teacher_cache={tmp_path / 'int8'}",
        f"hydra.run.dir={tmp_path / 'x'}",
    )
    assert refused.returncode != 0
    assert "teacher_weights: the cache's teacher computed with other weights" in refused.stderr
    assert "another teacher.quantize" in refused.stderr
