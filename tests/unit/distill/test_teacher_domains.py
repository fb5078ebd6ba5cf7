"""Teachers by data domain: each row learns from the teachers of its domain, their weights
renormalised over them — the sum of single-teacher steps on each domain's rows, exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_kd.data.domains import Domains
from lightning_kd.distill.accumulation import Window
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.teacher_domains import DomainTeaching, domain_weights
from lightning_kd.distill.teacher_entries import teacher_entries
from lightning_kd.distill.teachers import ExtraTeachers
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.loading import TeacherSpec, model_from_config
from lightning_kd.models.student import student_from_teacher
from lightning_kd.utils.refusal import Refused
from tests.conftest import TEXT, TINY_GPT2
from tests.unit.distill.test_cross_tokenizer import batch_of

MAIN = TeacherSpec(path=None, config=dict(TINY_GPT2))
DOMAINS = Domains(("code", "prose"), {})


def entries(first: list[str] | None, second: list[str] | None, weights=(0.25, 0.75)):
    return teacher_entries(
        [
            {"name": "a", "weight": weights[0], "domains": first},
            {"name": "b", "weight": weights[1], "path": "elsewhere", "domains": second},
        ],
        MAIN,
    )


def test_weights_are_renormalised_over_the_teachers_of_each_domain() -> None:
    weights = domain_weights(entries(None, ["prose"]), DOMAINS)
    torch.testing.assert_close(
        weights, torch.tensor([[1.0, 0.0], [0.25, 0.75]], dtype=torch.float64)
    )
    assert domain_weights(entries(None, None), DOMAINS) is None


def test_weights_that_no_domain_shares_are_said_to_change_nothing(recwarn) -> None:
    """Each domain one teacher's: any weights give the same run (a sweep of them, identical
    jobs, without a word: probe 40). Equal weights, the natural choice, are left unsaid."""
    with pytest.warns(UserWarning, match=r"the entries' weights \[0.2, 0.8\] change nothing"):
        domain_weights(entries(["code"], ["prose"], (0.2, 0.8)), DOMAINS)
    domain_weights(entries(["code"], ["prose"], (0.5, 0.5)), DOMAINS)
    domain_weights(entries(None, ["prose"], (0.2, 0.8)), DOMAINS)  # prose shared: they count
    assert not [w for w in recwarn if "change nothing" in str(w.message)]


@pytest.mark.parametrize(
    ("first", "second", "domains", "message"),
    [
        (["code"], ["code"], DOMAINS, r"\['prose'\] are taught by no teacher"),
        (["code"], ["poetry"], DOMAINS, r"names domains \['poetry'\]; data.domains has"),
        (["code"], None, None, r"set data.domains"),
    ],
)
def test_what_the_domains_cannot_mean_is_refused(first, second, domains, message) -> None:
    with pytest.raises(ValueError, match=message):
        domain_weights(entries(first, second), domains)
    with pytest.raises(ValueError, match=r"list the data.domains it teaches"):
        entries("code", None)


def known(found) -> DomainTeaching:
    """``found``'s teaching, with the weights of ``DOMAINS``."""
    teaching = DomainTeaching(found)
    teaching.know(DOMAINS)
    return teaching


def models():
    torch.manual_seed(0)
    first = model_from_config(dict(TINY_GPT2), "causal_lm").double().eval()
    torch.manual_seed(2)
    second = model_from_config(dict(TINY_GPT2), "causal_lm").double().eval()
    student = student_from_teacher(first, [0, 3]).double()
    return first, second, student


def only(batch: dict, row: int) -> dict:
    """``batch`` with every row but ``row`` unscored."""
    labels = batch["labels"].clone()
    labels[torch.arange(len(labels)) != row] = IGNORE_INDEX
    return batch | {"labels": labels}


def step(distiller: Distiller, batch: dict):
    objective, sums = distiller(batch)
    objective.backward()
    grads = [p.grad.clone() for p in distiller.student.parameters()]
    distiller.student.zero_grad()
    return objective.detach(), sums, grads


def code_and_prose(first, second, student) -> tuple[DistillConfig, dict, Distiller]:
    """Teacher a (main) teaches code, b prose, half each; a batch of a code and a prose row."""
    config = DistillConfig(compile=False)
    batch = batch_of(TEXT) | {"domain": torch.tensor([0, 1])}
    extra = ExtraTeachers(["b"], [0.5], [copy.deepcopy(second)], [None])
    both = Distiller(first, copy.deepcopy(student), config, extra=extra, teacher_weight=("a", 0.5))
    both.domains = known(entries(["code"], ["prose"], (0.5, 0.5)))
    return config, batch, both


def test_each_domain_learns_from_its_own_teacher_as_alone() -> None:
    """Row 0 (code) taught by a alone, row 1 (prose) by b alone: the objective, its parts and the
    gradients are those of a on row 0 plus b on row 1, each a one-teacher step."""
    first, second, student = models()
    config, batch, both = code_and_prose(first, second, student)
    got = step(both, batch)
    alone_a = step(Distiller(first, copy.deepcopy(student), config), only(batch, 0))
    alone_b = step(Distiller(second, copy.deepcopy(student), config), only(batch, 1))
    torch.testing.assert_close(got[0], alone_a[0] + alone_b[0], rtol=1e-10, atol=1e-12)
    sums = got[1]
    torch.testing.assert_close(sums.teachers["a"], alone_a[1].kd, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(sums.teachers["b"], alone_b[1].kd, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(sums.ce, alone_a[1].ce + alone_b[1].ce, rtol=1e-10, atol=1e-12)
    assert sums.tokens == alone_a[1].tokens + alone_b[1].tokens
    for g, a, b in zip(got[2], alone_a[2], alone_b[2], strict=True):
        torch.testing.assert_close(g, a + b, rtol=1e-9, atol=1e-12)


def test_each_teachers_logged_divergence_is_its_mean_over_the_rows_it_teaches() -> None:
    """``train/kd/<name>`` divided a teacher's sum by every row's tokens: a teacher of 5 % of
    them logged 1/20 of its divergence, not comparable with its ``val/kl/<name>`` (probe 54)."""
    first, second, student = models()
    config, batch, both = code_and_prose(first, second, student)
    window = Window()
    with torch.no_grad():
        window.add(both(batch)[1])
    means = Window.means(window.reduced(), both.objective)
    assert not [name for name in means if name.startswith("tokens")]
    for name, model, row in (("a", first, 0), ("b", second, 1)):
        with torch.no_grad():
            alone = Distiller(model, copy.deepcopy(student), config)(only(batch, row))[1]
        own = (alone.kd / alone.tokens).float()
        torch.testing.assert_close(means[f"kd/{name}"], own, rtol=1e-6, atol=0)


def test_teachers_of_every_domain_are_the_plain_several_teacher_step() -> None:
    first, second, student = models()
    config = DistillConfig(compile=False)
    batch = batch_of(TEXT) | {"domain": torch.tensor([0, 1])}
    results = []
    for domains in (None, ["code", "prose"]):
        extra = ExtraTeachers(["b"], [0.75], [copy.deepcopy(second)], [None])
        distiller = Distiller(
            first, copy.deepcopy(student), config, extra=extra, teacher_weight=("a", 0.25)
        )
        if domains:
            distiller.domains = known(entries(domains, domains))
        results.append(step(distiller, batch))
    plain, by_domain = results
    torch.testing.assert_close(by_domain[0], plain[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(by_domain[1].kd, plain[1].kd, rtol=1e-10, atol=1e-12)
    for g, p in zip(by_domain[2], plain[2], strict=True):
        torch.testing.assert_close(g, p, rtol=1e-9, atol=1e-12)


def test_a_teacher_runs_on_the_rows_it_teaches_alone() -> None:
    """b teaches prose only: it runs on the prose rows (not at all on a batch of code), and the
    step is still a on code plus b on prose."""
    first, second, student = models()
    config = DistillConfig(compile=False)
    seen: list[int] = []  # the rows of each forward of b
    second.get_input_embeddings().register_forward_hook(lambda _, a, out: seen.append(len(a[0])))
    extra = ExtraTeachers(["b"], [0.5], [copy.deepcopy(second)], [None])
    both = Distiller(first, copy.deepcopy(student), config, extra=extra, teacher_weight=("a", 0.5))
    both.domains = known(entries(["code"], ["prose"], (0.5, 0.5)))
    batch = batch_of(TEXT)
    got = step(both, batch | {"domain": torch.tensor([1, 0])})
    code_only = step(both, batch | {"domain": torch.tensor([0, 0])})
    assert seen == [1]
    alone_b = step(Distiller(second, copy.deepcopy(student), config), only(batch, 0))
    torch.testing.assert_close(got[1].teachers["b"], alone_b[1].kd, rtol=1e-10, atol=1e-12)
    assert float(code_only[1].teachers["b"]) == 0.0


def test_a_step_of_teachers_by_domain_without_the_datas_domains_is_refused() -> None:
    """A Distiller built without the data (the Python API, or loaded from a checkpoint) ran
    every teacher on every row, silently; the Lightning module learns them when fit starts."""
    first, second, student = models()
    extra = ExtraTeachers(["b"], [0.5], [copy.deepcopy(second)], [None])
    config = DistillConfig(compile=False)
    both = Distiller(first, copy.deepcopy(student), config, extra=extra, teacher_weight=("a", 0.5))
    both.domains = DomainTeaching(entries(["code"], ["prose"], (0.5, 0.5)))
    batch = batch_of(TEXT) | {"domain": torch.tensor([0, 1])}
    with pytest.raises(Refused, match=r"does not know the data's domains.*data=<the set-up"):
        both(batch)
    both.domains.know(DOMAINS)
    assert torch.isfinite(both(batch)[0])


@pytest.mark.parametrize(
    "domain",
    [torch.tensor([5, 0]), ["prose", "code"], torch.tensor([0.0, 1.0]), torch.tensor([0, 1, 1])],
    ids=["past_the_domains", "names", "floats", "a_row_too_many"],
)
def test_a_batchs_domain_that_is_no_row_index_of_the_domains_is_refused(domain) -> None:
    """A hand-made batch's domain past the domains was an IndexError, names an AttributeError
    ('list' object has no attribute 'device'): probe 40."""
    both, _ = by_domain_with_features()
    with pytest.raises(ValueError, match=r"'domain' must be a tensor of 2 integers, one per row"):
        both(batch_of(TEXT) | {"domain": domain})


def test_a_batchs_domain_is_checked_once_per_step(monkeypatch) -> None:
    """The step reads the domain in four places (feature rows, each teacher's rows, the terms);
    each read checked it again, and each check waited on the GPU. A new batch is checked anew."""
    from lightning_kd.distill import teacher_domains

    checks: list[int] = []
    check = teacher_domains.batch_domains
    monkeypatch.setattr(
        teacher_domains, "batch_domains", lambda *given: checks.append(1) or check(*given)
    )
    both, _ = by_domain_with_features()
    batch = batch_of(TEXT)
    step(both, batch | {"domain": torch.tensor([0, 1])})
    assert len(checks) == 1
    both.evaluate(batch | {"domain": torch.tensor([0, 1])})
    assert len(checks) == 2
    with pytest.raises(ValueError, match=r"'domain' must be a tensor of 2 integers"):
        both(batch | {"domain": torch.tensor([0, 7])})


def test_rows_of_no_domain_are_scored_by_no_term() -> None:
    """A batch whose rows are all of no domain (-1) raised an IndexError in the step (probe 51):
    it scores nothing, as labels all -100 do, and one row of no domain leaves the others' step."""
    both, _ = by_domain_with_features()
    batch = batch_of(TEXT)
    objective, sums, grads = step(both, batch | {"domain": torch.tensor([-1, -1])})
    assert float(objective) == 0.0 and int(sums.tokens) == 0
    assert float(sums.kd) == float(sums.ce) == float(sums.features) == 0.0
    assert set(sums.teachers) == {"a", "b"} and not any(map(float, sums.teachers.values()))
    assert all(not grad.any() for grad in grads)
    mixed = step(both, batch | {"domain": torch.tensor([0, -1])})
    alone = step(both, only(batch, 0) | {"domain": torch.tensor([0, 0])})
    torch.testing.assert_close(mixed[0], alone[0], rtol=1e-10, atol=1e-12)
    for got, want in zip(mixed[2], alone[2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def by_domain_with_features() -> tuple[Distiller, DistillConfig]:
    """Teacher a (the main one, whose layers the features pair) teaches code, b prose."""
    first, second, student = models()
    config = DistillConfig(features="uniform", compile=False)
    extra = ExtraTeachers(["b"], [0.5], [copy.deepcopy(second)], [None])
    both = Distiller(first, copy.deepcopy(student), config, extra=extra, teacher_weight=("a", 0.5))
    both.domains = known(entries(["code"], ["prose"], (0.5, 0.5)))
    return both, config


def test_feature_matching_runs_on_the_main_teachers_rows_alone() -> None:
    """The feature pairs are the main teacher's layers: a row of a domain another teacher
    teaches does not learn from them (it did: every row matched the main teacher's states)."""
    first, _, student = models()
    both, config = by_domain_with_features()
    batch = batch_of(TEXT)
    mixed = step(both, batch | {"domain": torch.tensor([0, 1])})[1]
    prose = step(both, batch | {"domain": torch.tensor([1, 1])})[1]
    alone = step(Distiller(first, copy.deepcopy(student), config), only(batch, 0))[1]
    assert float(alone.features) > 0 and float(prose.features) == 0.0
    torch.testing.assert_close(mixed.features, alone.features, rtol=1e-10, atol=1e-12)


def test_the_validation_loss_is_the_objective_over_every_teacher() -> None:
    """val/loss with teachers a (0.3) and b (0.7) was a's terms at weight 1: 2.2217 where the
    objective on the same batch is 2.2268 (probe 24). By domain, whose weights differ by row,
    no one figure is the objective: none is logged (each teacher's kl/<name> is)."""
    first, second, student = models()
    config = DistillConfig(compile=False, kd_weight=0.6, ce_weight=0.4)
    extra = ExtraTeachers(["b"], [0.7], [copy.deepcopy(second)], [None])
    both = Distiller(first, student, config, extra=extra, teacher_weight=("a", 0.3)).eval()
    batch = batch_of(TEXT)
    loss, tokens = both.evaluate(batch)["loss"]
    with torch.no_grad():
        objective, sums = both(batch)
    torch.testing.assert_close(loss / tokens, objective / sums.tokens, rtol=1e-10, atol=1e-12)
    alone = Distiller(first, student, config).eval().evaluate(batch)["loss"]
    assert abs(float(loss - alone[0])) > 1e-3  # b's terms count
    both.domains = known(entries(["code"], ["prose"], (0.5, 0.5)))
    metrics = both.evaluate(batch | {"domain": torch.tensor([0, 1])})
    assert "loss" not in metrics and {"kl/a", "kl/b"} <= set(metrics)


def test_each_teachers_validation_figures_are_over_the_rows_it_teaches() -> None:
    """kl/<name>, agreement/<name> and features were measured on every validation row, the
    domains a teacher never teaches included (probe 26): now each over its own rows, as the
    teacher alone on those rows measures them; the student's perplexity stays over every row."""
    first, second, student = models()
    both, config = by_domain_with_features()
    batch = batch_of(TEXT)
    metrics = both.eval().evaluate(batch | {"domain": torch.tensor([0, 1])})
    alone_a = Distiller(first, copy.deepcopy(student), config).eval().evaluate(only(batch, 0))
    alone_b = Distiller(second, copy.deepcopy(student), config).eval().evaluate(only(batch, 1))
    for name, alone in (("a", alone_a), ("b", alone_b)):
        for key in ("kl", "agreement"):
            torch.testing.assert_close(metrics[f"{key}/{name}"], alone[key], rtol=1e-10, atol=0)
    torch.testing.assert_close(metrics["kl"], alone_a["kl"], rtol=1e-10, atol=0)
    torch.testing.assert_close(metrics["features"], alone_a["features"], rtol=1e-10, atol=0)
    every = Distiller(first, copy.deepcopy(student), config).eval().evaluate(batch)
    torch.testing.assert_close(metrics["ppl"], every["ppl"], rtol=1e-10, atol=0)
    code_only = both.evaluate(batch | {"domain": torch.tensor([0, 0])})  # b teaches none of it
    assert float(code_only["kl/b"][1]) == 0


def test_the_main_teachers_perplexity_and_bits_are_over_the_rows_it_teaches() -> None:
    """Its ``teacher_ppl`` and ``teacher_bpb`` counted every row, its ``kl`` and the other
    teachers' ``teacher_bpb/<name>`` their own: figures over other text (probe 54)."""
    first, second, student = models()
    both, config = by_domain_with_features()
    lengths = torch.arange(first.config.vocab_size) % 3 + 1  # each id's bytes
    both.token_lengths = lengths
    batch = batch_of(TEXT)
    metrics = both.eval().evaluate(batch | {"domain": torch.tensor([0, 1])})
    for model, row, name in ((first, 0, ""), (second, 1, "/b")):
        alone = Distiller(model, copy.deepcopy(student), config, token_lengths=lengths)
        figures = alone.eval().evaluate(only(batch, row))
        for key in ("teacher_bpb", *(() if name else ("teacher_ppl",))):
            torch.testing.assert_close(metrics[key + name], figures[key], rtol=1e-10, atol=0)
    every = Distiller(first, copy.deepcopy(student), config, token_lengths=lengths)
    torch.testing.assert_close(metrics["bpb"], every.eval().evaluate(batch)["bpb"])


def test_a_teacher_whose_domains_have_no_training_block_is_refused() -> None:
    """data.max_train_examples kept only prose blocks: the code teacher loaded, taught nothing,
    and logged train/kd/<name> 0.0 at every step (probe 32)."""
    from types import SimpleNamespace

    teaching = DomainTeaching(tuple(entries(["prose"], ["code"])))
    with pytest.raises(Refused, match=r"^teachers\[1\] \(b\) teaches \['code'\], of which none of"):
        teaching.know_data(SimpleNamespace(domains=DOMAINS, train_domains=[1, 1, 1]))
    teaching.know_data(SimpleNamespace(domains=DOMAINS, train_domains=[1, 0, 1]))  # both taught
    assert teaching.weights is not None
    teaching.know_data(SimpleNamespace(domains=DOMAINS, train_domains=None))  # a stream: unknown


def test_a_cross_tokenizer_main_teachers_bits_are_over_the_rows_it_teaches() -> None:
    """Its ``teacher_bpb``, read off its own tokens, still counted every row where a main
    teacher of the student's tokenizer counted its own (stop 73's open item)."""
    from lightning_kd.distill.cross_tokenizer import CrossTokenizer
    from lightning_kd.models.loading import byte_tokenizer
    from tests.unit.distill.test_cross_tokenizer import distillers

    alone = distillers("forward_kl", 1.0)[1].eval()
    tokenizer = byte_tokenizer()
    size = len(tokenizer)
    cross = CrossTokenizer(tokenizer, tokenizer, size, size, top_k=size)
    extra = ExtraTeachers(["b"], [0.5], [copy.deepcopy(alone.teacher)], [None])
    both = Distiller(
        copy.deepcopy(alone.teacher),
        copy.deepcopy(alone.student),
        alone.distill,
        cross=cross,
        extra=extra,
        teacher_weight=("a", 0.5),
    )
    both.domains = known(entries(["code"], ["prose"], (0.5, 0.5)))
    batch = batch_of(TEXT)
    metrics = both.eval().evaluate(batch | {"domain": torch.tensor([0, 1])})
    own = alone.evaluate(only(batch, 0))["teacher_bpb"]
    torch.testing.assert_close(metrics["teacher_bpb"], own, rtol=1e-10, atol=0)
    assert own[1] < alone.evaluate(batch)["teacher_bpb"][1]  # fewer bytes than every row's
