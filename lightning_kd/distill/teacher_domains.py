"""Teachers by data domain: a ``teachers`` entry with ``domains`` teaches only the rows of those
domains (``data.domains``: each block is one domain's, ``data/domains.py``).

A row of domain d learns from the teachers that teach d, their weights renormalised over them,

    loss = kd_weight · Σ_t w_t(d) · KD_t + ce_weight · CE,    w_t(d) = w_t / Σ_{s teaches d} w_s,

so a domain taught by one teacher gets that teacher's whole divergence, as a run of one teacher
would. A step runs the main teacher on the whole batch and each other teacher on the rows it
teaches alone (none: not run at all), then computes each (domain, teacher) term with the other
rows' labels masked; every row's CE counts once, with the main teacher's term, and every scored
token once in the accumulation's denominator.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_kd.distill.tasks import bits_per_byte
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.utils.refusal import Refused

NO_DATA_DOMAINS = (
    "teachers: an entry names domains, and the data has none: set data.domains "
    "({name: [files]}, each of data.files in one) or drop the entries' domains"
)
"""Why entries naming domains cannot run on data without ``data.domains``."""

ON_POLICY_DOMAINS = (
    "teachers by domain and distill.on_policy: the student's completions carry no domain, so "
    "no teacher would be known to teach them; set distill.on_policy=0 or drop the entries' domains"
)
"""Why entries naming domains cannot run with on-policy KD."""


DOMAINS_UNKNOWN = (
    "teachers with domains: this Distiller does not know the data's domains, so it cannot tell "
    "which rows each teacher teaches; build it with Distiller.from_specs(..., data=<the set-up "
    "data module>), or call distiller.domains.know(datamodule.domains) before training"
)
"""Why a step of teachers by domain cannot run before the data's domains are known."""


@dataclass
class DomainTeaching:
    """Which teachers teach which data domain's rows: the ``teachers`` entries, and each one's
    weight on each domain once the data's domains are known (:meth:`know`)."""

    entries: Sequence = ()
    weights: Tensor | None = None
    """``[domains, teachers]`` (:func:`domain_weights`); None until known, or with no domains."""
    checked: Tensor | None = field(default=None, repr=False, compare=False)
    """The last batch's ``domain``, as :meth:`domain` checked it."""

    @property
    def named(self) -> bool:
        """Whether an entry names the domains it teaches (else every teacher teaches every row)."""
        return any(entry.domains is not None for entry in self.entries)

    def know(self, domains) -> None:
        """Learn the data's ``domains`` (the data module's ``Domains``, or None)."""
        self.weights = domain_weights(self.entries, domains)

    def know_data(self, data) -> None:
        """Learn the domains of the set-up data module ``data``, and refuse a teacher that no
        training block would teach from (its domains' rows all cut by ``data.max_train_examples``,
        or too short for a block): it loaded and logged ``train/kd/<name>`` 0.0, a perfect
        match, at every step. A stream's blocks are not known ahead."""
        domains = getattr(data, "domains", None)
        self.know(domains)
        kept = getattr(data, "train_domains", None)
        if self.weights is None or domains is None or kept is None:
            return
        counts = torch.bincount(torch.tensor(kept, dtype=torch.long), minlength=len(domains.names))
        idle = [
            f"teachers[{index}] ({entry.name}) teaches {list(entry.domains)}"
            for index, entry in enumerate(self.entries)
            if entry.weight > 0
            and entry.domains is not None
            and counts[list(domains.indices(entry.domains, entry.name))].sum() == 0
        ]
        if idle:
            raise Refused(
                f"{'; '.join(idle)}, of which none of the run's {len(kept)} training blocks is: "
                "it would teach nothing. Give those domains more text (a block is "
                "data.block_size tokens), raise data.max_train_examples if it cut them, or drop "
                "the entry"
            )

    def main_rows(self, batch: dict, mask: Tensor) -> Tensor:
        """``mask`` (``[batch, seq]``, the positions feature matching scores) kept only on the rows
        of the domains the main teacher teaches: the feature pairs are its layers, so another
        teacher's rows do not learn from them (they did, from a teacher said not to teach them)."""
        if not self.named:
            return mask
        return mask & self.main_taught(batch).to(mask.device).unsqueeze(1)

    def main_taught(self, batch: dict) -> Tensor | None:
        """``[batch]``: whether the main teacher teaches each row (None without named domains):
        its own figures are over those rows, as each other teacher's are."""
        return taught_mask(self.required(), self.domain(batch), 0) if self.named else None

    def taught_batch(self, batch: dict, column: int) -> dict:
        """``batch`` scored only on the rows teacher ``column`` teaches (its labels ignored on
        the others): validation measures each teacher where it teaches, as training does."""
        if not self.named:
            return batch
        taught = taught_mask(self.required(), self.domain(batch), column)
        rows = taught.to(batch["labels"].device).unsqueeze(1)
        return batch | {"labels": batch["labels"].masked_fill(~rows, IGNORE_INDEX)}

    def own_figures(
        self, task, student_out: Tensor, teacher_out, batch: dict, heads, lengths: Tensor | None
    ) -> dict:
        """The main teacher's :data:`PER_TEACHER` figures and its own perplexity and bits per
        byte (``lengths``: bytes per student id) over the rows it teaches, as each other
        teacher's are (its ``teacher_ppl`` was over every row, other text than its ``kl``;
        probe 54). None to replace without named domains; the student's own stay over every
        row."""
        if not self.named:
            return {}
        taught = self.taught_batch(batch, 0)
        sums = task.metric_sums(student_out, teacher_out, taught, heads)
        found = {key: sums[key] for key in (*PER_TEACHER, "teacher_ppl") if key in sums}
        bits = bits_per_byte(taught.get("labels"), lengths, sums)
        return found | ({"teacher_bpb": bits["teacher_bpb"]} if "teacher_bpb" in bits else {})

    def domain(self, batch: dict) -> Tensor:
        """``batch``'s ``domain`` (:func:`batch_domains`), checked once per batch: a step reads
        it up to four times, and each check waited on the GPU."""
        given = batch.get("domain")
        if given is None or given is not self.checked:
            self.checked = batch_domains(batch, self.required())
        return self.checked

    def required(self) -> Tensor:
        """The weights a training step of teachers by domain needs, or the refusal naming how to
        give them: without them every teacher taught every row."""
        if self.weights is None:
            raise Refused(DOMAINS_UNKNOWN)
        return self.weights


PER_TEACHER = ("kl", "agreement", "aligned")
"""The validation metrics logged per teacher (``aligned`` for one of another tokenizer)."""


def untaught_domains(entries: Sequence, names: Sequence[str]) -> list[str]:
    """The domains of ``names`` that no entry of weight > 0 teaches (an entry without
    ``domains`` teaches every one): their rows would train on CE alone."""
    taught: set[str] = set()
    for entry in entries:
        if entry.weight > 0:
            taught |= set(names if entry.domains is None else entry.domains)
    return [name for name in names if name not in taught]


def untaught_error(untaught: list[str]) -> str:
    """The refusal of ``untaught`` domains, with the fix."""
    return (
        f"data.domains {untaught} are taught by no teacher (their rows would train on CE "
        "alone): add them to a teacher's domains, or drop them from data.domains and their files "
        "from data.files"
    )


INERT_WEIGHTS = (
    "teachers by domain: each data domain has one teacher, whose divergence it gets whole, so "
    "the entries' weights {} change nothing (a weight shares a domain between its teachers); "
    "make a teacher teach another's domain too for them to count"
)
"""Said where no domain has two teachers and the weights differ: they were set (or swept) for
nothing, without a word (probe 40)."""


def domain_weights(entries: Sequence, domains) -> Tensor | None:
    """``[domains, teachers]``: each teacher's weight on each domain's rows, the main entry's
    column first, then the others in the order of ``entries``; None when no entry names
    ``domains`` (every teacher teaches every row, with its own weight). ``domains`` is the data
    module's ``Domains`` (or None)."""
    if not entries or all(entry.domains is None for entry in entries):
        return None
    if domains is None:
        raise ValueError(NO_DATA_DOMAINS)
    ordered = sorted(entries, key=lambda entry: not entry.main)  # stable: main first
    columns = []
    for place, entry in enumerate(ordered):
        if entry.domains is None:
            taught = frozenset(range(len(domains.names)))
        else:  # named by its place in the list as given, not in this order (probe 51)
            index = place if entry.index is None else entry.index
            taught = domains.indices(entry.domains, f"teachers[{index}] ({entry.name})")
        columns.append([entry.weight if d in taught else 0.0 for d in range(len(domains.names))])
    if untaught := untaught_domains(entries, list(domains.names)):
        raise ValueError(untaught_error(untaught))
    weights = torch.tensor(columns, dtype=torch.float64).T
    given = [entry.weight for entry in ordered]
    if len(set(given)) > 1 and bool(((weights > 0).sum(-1) == 1).all()):
        warnings.warn(INERT_WEIGHTS.format(given), stacklevel=2)  # a sweep of them: one job
    return weights / weights.sum(-1, keepdim=True)


def batch_domains(batch: dict, weights: Tensor) -> Tensor:
    """``batch``'s ``domain`` (a data domain's index per row, -1 for none; ``weights`` has a row
    per domain), or a clear error (an index past the domains was an ``IndexError``, names an
    ``AttributeError``: probe 40)."""
    if "domain" not in batch:
        raise ValueError(
            "teachers with domains: the batch has no 'domain'; read the data with data.domains "
            "(TextDataModule over data.files, or data.dataset with data.domain_field)"
        )
    domain, count = batch["domain"], len(weights)
    rows = len(batch["labels"])
    whole = (
        isinstance(domain, Tensor) and not domain.is_floating_point() and not domain.is_complex()
    )
    if not (whole and domain.shape == (rows,) and bool(((domain >= -1) & (domain < count)).all())):
        raise ValueError(
            f"teachers with domains: the batch's 'domain' must be a tensor of {rows} integers, "
            f"one per row, each the index of its row's data domain in data.domains' order "
            f"(0 to {count - 1}; -1 for none), as the data module's batches carry it; got "
            f"{domain!r}"
        )
    return domain


def taught_mask(weights: Tensor, domain: Tensor, column: int) -> Tensor:
    """``[batch]``: whether teacher ``column`` of ``weights`` teaches each row's ``domain`` (a
    row of no domain, -1, is taught by none)."""
    return (weights[:, column] > 0).to(domain.device)[domain.clamp(min=0)] & (domain >= 0)


def taught_rows(weights: Tensor, domain: Tensor, column: int) -> Tensor | None:
    """The rows of a batch whose domain teacher ``column`` of ``weights`` teaches (their
    indices, maybe none), or None when it teaches every row: the rows it runs on."""
    taught = taught_mask(weights, domain, column)
    return None if bool(taught.all()) else taught.nonzero().squeeze(1)


def extra_rows(teaching: DomainTeaching, batch: dict, count: int) -> list[Tensor | None]:
    """``taught_rows`` of each of the ``count`` teachers after the main one in ``batch``."""
    weights, domain = teaching.required(), teaching.domain(batch)
    return [taught_rows(weights, domain, column) for column in range(1, count + 1)]


def rows_of(batch: dict, rows: Tensor) -> dict:
    """``batch`` cut to ``rows``: every tensor with a row per example (the others as they are)."""
    count = len(batch["labels"])
    return {
        key: value[rows.to(value.device)]
        if isinstance(value, Tensor) and value.dim() and len(value) == count
        else value
        for key, value in batch.items()
    }
