"""Several teachers: the list checked, the weighted objective, each teacher's own divergence."""

from __future__ import annotations

import copy
import gc
import weakref
from dataclasses import replace

import pytest
import torch

from lightning_kd.cache import CacheSpec
from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.cache.writer import write_cache
from lightning_kd.data.token_bytes import byte_lengths
from lightning_kd.distill import assembly, teacher_sources
from lightning_kd.distill.accumulation import Window
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.teacher_entries import teacher_entries
from lightning_kd.distill.teachers import ExtraTeachers
from lightning_kd.models.loading import (
    StudentSpec,
    TeacherSpec,
    byte_tokenizer,
    load_teacher,
    model_from_config,
)
from lightning_kd.models.student import student_from_teacher
from lightning_kd.training.metrics import ValidationMetrics
from tests.conftest import TEXT, TINY_GPT2, TINY_LLAMA, make_datamodule
from tests.unit.distill.test_cross_tokenizer import batch_of

MAIN = TeacherSpec(path=None, config=dict(TINY_GPT2), dtype="float32")


def test_entries_inherit_the_teacher_group_and_name_the_main_one():
    entries = teacher_entries(
        [{"name": "a", "weight": 0.25}, {"name": "b", "weight": 0.75, "path": "smollm2"}], MAIN
    )
    assert [entry.main for entry in entries] == [True, False]
    assert entries[0].spec == MAIN
    assert entries[1].spec.path == "smollm2" and entries[1].spec.config is None
    assert entries[1].spec.dtype == "float32"  # inherited


@pytest.mark.parametrize(
    ("teachers", "message"),
    [
        ([{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.4, "path": "x"}], "sum to 1"),
        (
            [{"name": "a", "weight": 0.5, "path": "x"}, {"name": "b", "weight": 0.5, "path": "y"}],
            r"exactly once .*: every entry names a model of its own \(path or config\)",
        ),
        (
            [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5}],
            r"exactly once .*: teachers\[0\] \(a\) and teachers\[1\] \(b\) name no model",
        ),
        ([{"name": "a", "weight": 0.5}, {"name": "a", "weight": 0.5, "path": "x"}], "repeat"),
        ([{"name": "a", "weight": 1.0, "paht": "x"}], "takes no key 'paht'; did you mean path"),
        ([{"weight": 1.0}], r"teachers\[0\] has no name: each entry needs a name and a weight"),
        ({"name": "a", "weight": 1.0}, "give a list of entries"),
        (
            [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5, "path": None}],
            r"teachers\[1\].path=null: give the model's path",
        ),
        ([{"name": "a", "weight": 1.0, "domains": ["code"]}], "a single teacher teaches every row"),
        ([{"name": "a", "weight": 1.0, "cache": "dir"}], "set distill.teacher_cache instead"),
        ([{"name": "a", "weight": 0.5}, {"name": "b", "weight": "nan", "path": "x"}], "'nan'"),
        ([{"name": "a", "weight": 0.5}, {"name": "b", "weight": "half", "path": "x"}], "a number"),
        ([{"name": "a", "weight": None}], r"teachers\[0\] has no weight"),
        (  # TeacherSpec's own checks, named for the entry (a ValueError traceback before)
            [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5, "path": "x", "dtype": "f"}],
            r"teachers\[1\].dtype='f' is not a dtype here",
        ),
        (
            [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5, "quantize": "int4"}],
            r"teachers\[1\].quantize='int4' is not supported; choose one of \['int8'\]",
        ),
    ],
)
def test_a_bad_teachers_list_is_refused_with_the_fix(teachers, message):
    with pytest.raises(ValueError, match=message):
        teacher_entries(teachers, MAIN)


def test_every_problem_of_the_list_is_named_at_once():
    teachers = [
        {"name": "a", "weight": 0.5, "cache": "auto"},
        {"name": "b", "wieght": 0.5, "path": "x"},
        "c",
    ]
    with pytest.raises(ValueError) as refused:
        teacher_entries(teachers, MAIN)
    message = str(refused.value)
    assert message.startswith("4 values are refused:")
    assert "teachers[0].cache: this entry is the teacher group's model" in message
    assert "teachers[1].wieght: an entry takes no key 'wieght'; did you mean weight?" in message
    assert "teachers[1] has no weight" in message
    assert "teachers[2]='c': give a mapping" in message


def test_an_entrys_bad_weight_and_bad_domains_are_named_together():
    bad = {"name": "b", "weight": "x", "domains": "code", "path": "x"}
    with pytest.raises(ValueError) as refused:
        teacher_entries([{"name": "a", "weight": 0.5}, bad], MAIN)
    message = str(refused.value)
    assert "teachers[1].weight='x': give a number" in message
    assert "teachers[1].domains='code': list the data.domains it teaches" in message


def test_a_list_of_one_is_the_teacher_group_alone():
    assert teacher_entries([{"name": "smollm2", "weight": 1.0}], MAIN) is None
    assert teacher_entries([], MAIN) is None and teacher_entries(None, MAIN) is None


def test_from_python_a_list_is_taken_as_the_config_holds_it_and_entries_are_checked():
    """From Python, the list as the config holds it raised an AttributeError ('dict' object has
    no attribute 'main'), and entries read by hand trained with weights summing to 1.8 or with
    no main entry (a third teacher of weight 1 was added): probe 40."""
    student, distill = StudentSpec(num_layers=2), DistillConfig(features=None, compile=False)
    other = {"name": "b", "weight": 0.5, "config": {**TINY_GPT2, "n_layer": 2}}
    listed = [{"name": "a", "weight": 0.5}, other]
    distiller = Distiller.from_specs(MAIN, student, distill, byte_tokenizer(), teachers=listed)
    assert distiller.teacher_name == "a" and distiller.extra_teachers.names == ["b"]
    entries = teacher_entries(listed, MAIN)
    heavy = [replace(entry, weight=0.9) for entry in entries]
    with pytest.raises(ValueError, match=r"weights \[0.9, 0.9\] must be >= 0 and sum to 1"):
        Distiller.from_specs(MAIN, student, distill, byte_tokenizer(), teachers=heavy)
    no_main = [replace(entry, main=False) for entry in entries]
    with pytest.raises(ValueError, match="the teacher group's model among them exactly once"):
        Distiller.from_specs(MAIN, student, distill, byte_tokenizer(), teachers=no_main)


def test_an_entrys_missing_model_and_its_domains_are_named_by_its_own_place_in_the_list(
    tmp_path,
):
    """A second teacher's missing path was named teacher.path (the teacher group's key), and a
    bad domain of the first entry, listed before the main one, teachers[1] (probe 51)."""
    from lightning_kd.data.domains import Domains
    from lightning_kd.distill.teacher_domains import domain_weights

    student, distill = StudentSpec(num_layers=2), DistillConfig(features=None, compile=False)
    missing = [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5, "path": str(tmp_path)}]
    with pytest.raises(FileNotFoundError, match=r"^teachers\[1\]\.path=.*has no config.json"):
        Distiller.from_specs(MAIN, student, distill, byte_tokenizer(), teachers=missing)
    other = {"name": "b", "weight": 0.5, "config": dict(TINY_GPT2), "domains": ["nope"]}
    entries = teacher_entries([other, {"name": "a", "weight": 0.5}], MAIN)
    with pytest.raises(ValueError, match=r"teachers\[0\] \(b\) names domains \['nope'\]"):
        domain_weights(entries, Domains(("code", "web"), {}))


def models():
    torch.manual_seed(0)
    teacher = model_from_config(dict(TINY_GPT2), "causal_lm").double().eval()
    student = student_from_teacher(teacher, [0, 3]).double()
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return teacher, student


def step(distiller: Distiller, batch) -> tuple[torch.Tensor, object, list[torch.Tensor]]:
    objective, sums = distiller(batch)
    objective.backward()
    return objective.detach(), sums, [p.grad for p in distiller.student.parameters()]


@pytest.mark.parametrize("cross", [False, True])
def test_two_copies_of_one_teacher_are_that_teacher(cross):
    """Weights 0.3 and 0.7 on the same teacher (the second through the cross-tokenizer path):
    the objective and gradients of the teacher alone, each divergence reported (under a name
    with a dot, which no module name may hold)."""
    teacher, student = models()
    config = DistillConfig(compile=False, cross_top_k=257)
    batch = batch_of(TEXT)
    alone = step(Distiller(teacher, copy.deepcopy(student), config), batch)
    tokenizer = byte_tokenizer()
    crosses = [CrossTokenizer(tokenizer, tokenizer, 257, 257, top_k=257) if cross else None]
    extra = ExtraTeachers(["copy.2"], [0.7], [copy.deepcopy(teacher)], crosses)
    both = Distiller(
        teacher, copy.deepcopy(student), config, extra=extra, teacher_weight=("main", 0.3)
    )
    together = step(both, batch)
    torch.testing.assert_close(together[0], alone[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(together[1].kd, alone[1].kd, rtol=1e-10, atol=1e-12)
    assert set(together[1].teachers) == {"main", "copy.2"}
    torch.testing.assert_close(together[1].teachers["copy.2"], alone[1].kd, rtol=1e-10, atol=1e-12)
    for a, b in zip(together[2], alone[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert not any(p.requires_grad for p in both.extra_teachers.parameters())
    both.train()
    assert not both.extra_teachers.model(0).training
    # Validation reports each teacher's own KL and agreement: the same teacher, the same figures.
    metrics = both.eval().evaluate(batch)
    for key in ("kl", "agreement"):
        torch.testing.assert_close(
            metrics[f"{key}/main"][0], metrics[f"{key}/copy.2"][0], rtol=1e-10, atol=0
        )
    torch.testing.assert_close(metrics["kl/main"][0], metrics["kl"][0], rtol=1e-10, atol=0)


@pytest.mark.parametrize("cross", [False, True])
def test_each_other_teacher_has_its_bits_per_byte(cross):
    """val/teacher_bpb was the teacher group's alone: a second teacher's was not logged. The
    same teacher again (through either path) has the same bits per byte, over the same bytes."""
    teacher, student = models()
    tokenizer = byte_tokenizer()
    crosses = [CrossTokenizer(tokenizer, tokenizer, 257, 257, top_k=257) if cross else None]
    extra = ExtraTeachers(["copy"], [0.5], [copy.deepcopy(teacher)], crosses)
    lengths = byte_lengths(tokenizer, student)
    config = DistillConfig(compile=False, cross_top_k=257)
    both = Distiller(teacher, student, config, extra=extra, token_lengths=lengths)
    metrics = both.eval().evaluate(batch_of(TEXT))
    assert "teacher_bpb/teacher" not in metrics, "the teacher group's is val/teacher_bpb"
    for part in (0, 1):
        torch.testing.assert_close(
            metrics["teacher_bpb/copy"][part], metrics["teacher_bpb"][part], rtol=1e-9, atol=0
        )
    names = ValidationMetrics(("teacher", "copy")).names
    assert "teacher_bpb/copy" in names


def test_a_teacher_of_weight_0_is_not_run_in_training():
    """Weight 0 adds nothing to the loss: the step is the main teacher's alone, without the
    second teacher's forward, whose validation figures are still measured."""
    teacher, student = models()
    config = DistillConfig(compile=False)
    batch = batch_of(TEXT)
    alone = step(Distiller(teacher, copy.deepcopy(student), config), batch)
    idle = copy.deepcopy(teacher)
    forwards = []
    idle.base_model.register_forward_hook(lambda *_: forwards.append(1))  # what the step runs
    extra = ExtraTeachers(["idle"], [0.0], [idle], [None])
    both = Distiller(teacher, copy.deepcopy(student), config, extra=extra)
    together = step(both, batch)
    assert forwards == [] and set(together[1].teachers) == {"teacher"}
    torch.testing.assert_close(together[0], alone[0], rtol=1e-10, atol=1e-12)
    for a, b in zip(together[2], alone[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert "kl/idle" in both.eval().evaluate(batch) and forwards


def test_a_cached_second_teacher_is_that_teacher_online(corpus, tmp_path):
    """A second teacher read from its cache (k = vocabulary) gives the objective it gives online
    (to the fp16 rounding of the stored log-probs) and holds no model."""
    teacher = load_teacher(TeacherSpec(path=None, config=dict(TINY_LLAMA)), "32-true")
    student = student_from_teacher(teacher, [0, 1])
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    tokenizer = datamodule.tokenizer
    write_cache(teacher, tokenizer, datamodule, CacheSpec(k=257, shard_blocks=4), tmp_path)
    cache = CachedTeacher.for_run(tmp_path, teacher, tokenizer, datamodule, 1.0)
    config = DistillConfig(compile=False)
    batch = next(iter(datamodule.train_dataloader()))
    results = []
    for source in (copy.deepcopy(teacher), cache):
        extra = ExtraTeachers(["second"], [0.5], [source], [None])
        distiller = Distiller(
            teacher, copy.deepcopy(student), config, extra=extra, teacher_weight=("main", 0.5)
        )
        results.append(distiller(batch))
    (online, online_sums), (cached, cached_sums) = results
    torch.testing.assert_close(cached, online, rtol=2e-3, atol=1e-3)
    torch.testing.assert_close(
        cached_sums.teachers["second"], online_sums.teachers["second"], rtol=2e-3, atol=1e-3
    )
    assert not list(extra.parameters()) and list(extra.caches) == ["second"]


def test_the_window_reports_each_teachers_divergence():
    teacher, student = models()
    extra = ExtraTeachers(["copy"], [0.5], [copy.deepcopy(teacher)], [None])
    config = DistillConfig(compile=False)
    distiller = Distiller(teacher, student, config, extra=extra, teacher_weight=("main", 0.5))
    window = Window()
    for rows in (slice(0, 1), slice(1, 2)):
        window.add(distiller({k: v[rows] for k, v in batch_of(TEXT).items()})[1])
    totals = window.reduced()
    means = Window.means(totals, distiller.objective)
    assert {"kd/main", "kd/copy"} <= set(means)
    torch.testing.assert_close(means["kd/main"], means["kd/copy"])
    torch.testing.assert_close(means["kd"], means["kd/main"])


def test_cached_teachers_are_never_resident_at_once(corpus, tmp_path, monkeypatch):
    """Two teachers, each from its cache: each model is loaded, its cache opened against it,
    and released before the next loads; the distiller holds neither."""
    second_config = {**TINY_LLAMA, "num_hidden_layers": 3}
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    tokenizer = datamodule.tokenizer
    for name, config in (("main", TINY_LLAMA), ("second", second_config)):
        model = load_teacher(TeacherSpec(path=None, config=dict(config)), "32-true")
        write_cache(model, tokenizer, datamodule, CacheSpec(k=16, shard_blocks=8), tmp_path / name)
    alive: list[weakref.ref] = []

    def load_one_at_a_time(spec, precision=None):
        gc.collect()
        assert all(ref() is None for ref in alive), "a teacher is still resident"
        model = load_teacher(spec, precision)
        alive.append(weakref.ref(model))
        return model

    monkeypatch.setattr(assembly, "load_teacher", load_one_at_a_time)
    monkeypatch.setattr(teacher_sources, "load_teacher", load_one_at_a_time)
    main = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    entries = teacher_entries(
        [
            {"name": "main", "weight": 0.5},
            {
                "name": "second",
                "weight": 0.5,
                "config": second_config,
                "cache": str(tmp_path / "second"),
            },
        ],
        main,
    )
    config = DistillConfig(features=None, teacher_cache=str(tmp_path / "main"), compile=False)
    student = StudentSpec(num_layers=2)
    distiller = Distiller.from_specs(
        main, student, config, tokenizer, "32-true", datamodule, entries
    )
    gc.collect()
    assert len(alive) == 2 and all(ref() is None for ref in alive)
    assert distiller.teacher is None and not list(distiller.extra_teachers.parameters())
    objective, sums = distiller(next(iter(datamodule.train_dataloader())))
    assert torch.isfinite(objective) and set(sums.teachers) == {"main", "second"}


def smollm2_entry_of_an_empty_cache(tmp_path):
    """A second ``teachers`` entry, SmolLM2, whose cache directory holds nothing yet."""
    empty = tmp_path / "empty"
    empty.mkdir()
    entry = teacher_entries(
        [
            {"name": "main", "weight": 0.5},
            {"name": "second", "weight": 0.5, "path": "smollm2", "cache": str(empty)},
        ],
        TeacherSpec(path=None, config=dict(TINY_LLAMA)),
    )[1]
    return entry, empty


def test_an_entrys_cache_refusal_names_the_entry_and_how_to_write_its_cache(corpus, tmp_path):
    """The reader's advice spoke of the run's ``teacher=`` (the main teacher): following it
    wrote the main teacher's cache for the entry."""
    from lightning_kd.cache.reader import CacheError
    from lightning_kd.distill.teacher_sources import teacher_source

    datamodule = make_datamodule([corpus])
    datamodule.setup()
    entry, empty = smollm2_entry_of_an_empty_cache(tmp_path)
    config = DistillConfig(features=None, compile=False)
    with pytest.raises(CacheError) as refused:
        teacher_source(entry, config, datamodule.tokenizer, None, "32-true", datamodule)
    message = str(refused.value)
    assert message.startswith(f"teachers entry 'second' (cache {empty}): {empty} holds no")
    written = "`lightning-kd cache teacher.path=smollm2 teacher.config=null teacher.gguf_file=null"
    assert written in message and "this run's teacher=" not in message
    logits_only = "distill.features=null distill.blockwise_passes=0"
    assert f"teacher.init_seed=0 {logits_only} hydra.run.dir={empty}` and the run's data" in message
    assert "overwrite=true" not in message and "<" not in message  # nothing to fill in
    assert "student.source" not in message  # the entry reads the run's tokens: a cache of them
    int8 = replace(entry, spec=replace(entry.spec, quantize="int8"))  # written as it runs
    with pytest.raises(CacheError, match=r"teacher.quantize=int8 teacher.task"):
        teacher_source(int8, config, datamodule.tokenizer, None, "32-true", datamodule)
    # A config teacher of another seed: its seed is in the command (without it, the command
    # wrote the seed-0 teacher's cache again, refused again).
    seeded = replace(entry, spec=TeacherSpec(path=None, config=dict(TINY_LLAMA), init_seed=7))
    with pytest.raises(
        CacheError,
        match=r"'teacher.config=\{model_type: llama, .*\}' .*teacher.init_seed=7 distill.features",
    ):
        teacher_source(seeded, config, datamodule.tokenizer, None, "32-true", datamodule)


@pytest.mark.parametrize(
    "spec",
    [
        TeacherSpec(path=None, config={**TINY_LLAMA, "rope_scaling": {"rope_type": "linear"}}),
        TeacherSpec(path=None, config=dict(TINY_LLAMA), init_seed=7, dtype="float32"),
        TeacherSpec(path="gemma3_270m", quantize="int8", trust_remote_code=True),
    ],
    ids=["nested config", "seeded", "packaged int8"],
)
def test_an_entrys_overrides_compose_into_that_teacher(spec) -> None:
    """What the entry's cache command says is what Hydra composes back into the entry."""
    from hydra.utils import instantiate

    from lightning_kd.distill.teacher_sources import teacher_overrides
    from lightning_kd.launch.config import compose_config

    cfg = compose_config(["debug=smoke", *teacher_overrides(spec)])
    assert instantiate(cfg.teacher, _convert_="all") == spec


def test_an_entry_of_fewer_rows_than_the_runs_tokens_is_refused_by_name(corpus) -> None:
    """It trained until the validation before training hit an embedding's IndexError."""
    from lightning_kd.distill.teacher_sources import teacher_source
    from lightning_kd.utils.refusal import Refused

    datamodule = make_datamodule([corpus])
    small = {**TINY_LLAMA, "vocab_size": 200}
    entry = teacher_entries(
        [{"name": "main", "weight": 0.5}, {"name": "b", "weight": 0.5, "config": small}],
        TeacherSpec(path=None, config=dict(TINY_LLAMA)),
    )[1]
    config = DistillConfig(features=None, compile=False)
    rows = r"teachers entry 'b': its vocabulary has 200 rows but the run's tokenizer has 257"
    with pytest.raises(Refused, match=rows):
        teacher_source(entry, config, datamodule.tokenizer, None, "32-true", None)


def test_an_entry_of_another_tokenizer_is_told_to_write_its_cache_for_the_students(tmp_path):
    """The command written for an entry of another tokenizer lacked student.source: followed,
    it wrote a cache of the entry's own tokenizer, refused again with the same command
    (probe 32)."""
    from transformers import AutoTokenizer

    from lightning_kd.cache.reader import CacheError
    from lightning_kd.distill.teacher_sources import teacher_source
    from lightning_kd.models.loading import byte_tokenizer

    byte_tokenizer().save_pretrained(tmp_path / "student")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "student")
    entry, _ = smollm2_entry_of_an_empty_cache(tmp_path)
    config = DistillConfig(features=None, compile=False)
    with pytest.raises(CacheError) as refused:
        teacher_source(entry, config, tokenizer, None, "32-true", object())
    logits_only = "distill.features=null distill.blockwise_passes=0"
    source = f"student.source={tmp_path / 'student'}"
    assert f"teacher.init_seed=0 {logits_only} {source} hydra.run.dir=" in str(refused.value)


def test_an_entrys_cache_command_never_overwrites_a_whole_cache(tmp_path):
    """teachers.1.cache named the main teacher's cache: the advice said to write the entry's
    into it with overwrite=true, replacing the cache the same run reads (probe 38)."""
    from lightning_kd.distill.teacher_sources import entry_cache_command

    entry, empty = smollm2_entry_of_an_empty_cache(tmp_path)
    assert entry_cache_command(entry, None).endswith(f"hydra.run.dir={empty}")
    (empty / "index.json").write_text("{}")  # a whole cache, of another teacher
    command = entry_cache_command(entry, None)
    assert command.endswith(f"hydra.run.dir={empty}-second") and "overwrite" not in command


def test_the_same_model_twice_is_told():
    """One teacher's objective at twice the cost went without a word (probe 32); the
    benchmark's two_teachers scenario builds just that on purpose, so it is a warning."""
    twice = [
        {"name": "a", "weight": 0.25},
        {"name": "b", "weight": 0.25, "path": "x"},
        {"name": "c", "weight": 0.5, "path": "x"},
    ]
    note = r"^teachers: b and c are the same model with the same teacher keys: .* weight 0.75 is"
    with pytest.warns(UserWarning, match=note):
        assert len(teacher_entries(twice, MAIN)) == 3
