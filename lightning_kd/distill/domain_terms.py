"""A training step of teachers by data domain (``teacher_domains.py``): each (domain, teacher)
term's token sums over the rows that teacher teaches, and their combination into the step's
objective and its logged parts."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_kd.distill.teacher_domains import DomainTeaching, rows_of
from lightning_kd.losses.logits import IGNORE_INDEX, LossSums, weighted_sum


def domain_terms(
    task, teaching: DomainTeaching, student_out: Tensor, sides: list[tuple], batch: dict, ce: bool
) -> tuple[Tensor, LossSums]:
    """The objective's token sum and its parts over ``batch``'s rows, domain by domain:
    ``sides`` holds ``(name, teacher output, heads, rows)`` of each teacher, the main one first
    (its term carries CE); ``rows`` are those the teacher ran on (``taught_rows``)."""
    weights, domain = teaching.required(), teaching.domain(batch)
    total, parts = None, []
    named = [d for d in domain.unique().tolist() if d >= 0]
    if not named:  # every row of no domain (-1): nothing scored, as labels all -100 (probe 51)
        name, teacher_out, heads, _ = sides[0]
        unscored = batch | {"labels": torch.full_like(batch["labels"], IGNORE_INDEX)}
        value, sums = task.logit_terms(student_out, teacher_out, unscored, heads, ce, 1.0)
        return value, combined([(name, True, 1.0, sums)], [side[0] for side in sides])
    for d in named:
        rows = (domain == d).to(batch["labels"].device).unsqueeze(1)
        part = batch | {"labels": batch["labels"].masked_fill(~rows, IGNORE_INDEX)}
        for index, (name, teacher_out, heads, ran_on) in enumerate(sides):
            weight = float(weights[d, index])
            if index and weight == 0:  # another teacher's domain: no term at all
                continue
            main = index == 0
            scored, own = (
                (student_out, part)
                if ran_on is None
                else (student_out[ran_on], rows_of(part, ran_on))
            )
            value, sums = task.logit_terms(
                scored, teacher_out, own, heads, ce if main else False, weight
            )
            total = value if total is None else total + value
            parts.append((name, main, weight, sums))
    return total, combined(parts, [side[0] for side in sides])


def combined(parts: list[tuple], names: list[str]) -> LossSums:
    """One step's parts from each (domain, teacher) term's: ``kd`` their weighted sum, ``ce`` and
    ``tokens`` the main terms' (one per domain), each teacher's own divergence over the rows it
    teaches and their tokens, by name, and the weighted span terms where there are some."""
    main = [sums for _, is_main, _, sums in parts if is_main]
    zero, none = main[0].kd * 0, main[0].tokens * 0
    teachers, counts = dict.fromkeys(names, zero), dict.fromkeys(names, none)
    kd = zero
    for name, _, weight, sums in parts:
        if weight > 0:  # a main term on another teacher's domain carries CE alone
            teachers[name] = teachers[name] + sums.kd
            counts[name] = counts[name] + sums.tokens
            kd = kd + weight * sums.kd
    ce = sum((sums.ce for sums in main), main[0].ce * 0)
    tokens = sum((sums.tokens for sums in main), none)
    span = weighted_sum([(weight, sums.span) for _, _, weight, sums in parts if weight > 0])
    return LossSums(kd, ce, tokens, teachers=teachers, teacher_tokens=counts, span=span)
