"""How much of the student's text a teacher of another tokenizer spells back, watched for a run.

A tokenizer that rewrites the text (lower case, other Unicode forms) leaves part of it spelled
by no teacher token, and those positions train on CE alone. A run judges the first
:data:`SHARE_BLOCKS` blocks of its training split before step 0 (``distill.cross_min_aligned``:
refused below it): the same text on every rank, whatever the batch size, accumulation or number
of processes (judged on each rank's first micro-batch, the same data was refused with one batch
size, trained with another and, under DDP, refused by one rank while the others reported it
lost: probe 39). A loop with no data module is judged on its first batch. A corpus is not its
first blocks: the share over every batch read since is kept, and the first time it falls below
the floor the run is warned, once, naming it (a teacher that lower-cases passed on lower-case
prose first and then trained silently on titles and code at 3 % spelled back).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

from lightning_kd.data.alignment import TeacherView
from lightning_kd.data.batches import first_training_batch
from lightning_kd.losses.logits import next_token_targets
from lightning_kd.utils.refusal import Refused

log = logging.getLogger(__name__)

SHARE_BLOCKS = 8
"""The training blocks a run's teacher is judged on before step 0 (streamed: the stream's first)."""

ADVICE = (
    "the two tokenizers normalise the text differently (case, Unicode forms, whitespace), so "
    "too few positions can be aligned. Use a teacher whose tokenizer keeps the text as it is, or "
    "lower distill.cross_min_aligned if that share is what you expect"
)


class SpelledShare:
    """The bytes of the student's text the teacher's tokens spelled back, over the batches read."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self.views = self.matched = self.text = 0
        self.warned = self.judged = False

    @property
    def share(self) -> float:
        """The share over every batch read (1.0 before any text)."""
        return self.matched / self.text if self.text else 1.0

    def judge(self, view: TeacherView, what: str, whose: str = "the teacher's tokenizer") -> None:
        """Refuse ``view`` below the floor (``what`` it holds and ``whose`` tokenizer spelled
        it, said in the refusal)."""
        self.judged = True
        if view.share < self.floor:
            raise Refused(
                f"{whose} spells back {view.share:.1%} of {what} ({view.text_bytes:,} bytes; "
                f"distill.cross_min_aligned={self.floor}): {ADVICE}"
            )

    def add(self, view: TeacherView) -> None:
        """Count ``view`` (judged, where nothing was before it), and warn once when the share of
        every batch read so far falls below the floor."""
        if not self.judged:
            self.judge(view, "the student's first batch")
        self.views += 1
        self.matched += view.matched_bytes
        self.text += view.text_bytes
        if not self.warned and self.share < self.floor:
            self.warned = True
            warnings.warn(
                f"the teacher's tokenizer has spelled back {self.share:.1%} of the student's "
                f"text over the {self.views} batches read so far ({self.text:,} bytes), below "
                f"distill.cross_min_aligned={self.floor} (the text judged before step 0 "
                f"passed): the positions it does not spell train on CE alone; {ADVICE}",
                stacklevel=2,
            )


def judge_first_blocks(cross, data, domains: Sequence[str] | None = None, name: str = "") -> None:
    """Refuse, before step 0, a teacher (``cross``: its cross-tokenizer path) spelling back too
    little of the first training blocks of ``data`` (a set-up data module) — of ``domains``
    alone, the data domains it teaches, where given; ``name``: a ``teachers`` entry's. A teacher
    whose domains none of those blocks holds is judged on its first batch (a stream's rare
    domain)."""
    indices = None
    if domains is not None and data.domains is not None:
        indices = {data.domains.names.index(domain) for domain in domains}
    if (batch := first_training_batch(data, SHARE_BLOCKS, indices)) is None:
        return
    view = cross.aligner.view(batch["input_ids"], batch["attention_mask"], batch["labels"])
    what = f"the first {len(batch['input_ids'])} training blocks"
    what += f" of its domains {list(domains)}" if indices is not None else ""
    whose = f"the tokenizer of teachers entry {name!r}" if name else "the teacher's tokenizer"
    cross.spelled.judge(view, what, whose)
    # Bytes spelled back are not positions paired: all of a CJK text can be spelled while one
    # teacher token spans three student tokens (val/aligned 0.28 with no word before the first
    # validation: probe 39). Said before step 0, where a user can still change the teacher.
    scored = next_token_targets(batch["labels"])[1]
    paired = int(((view.partner[:, :-1] >= 0) & scored).sum()) / max(1, int(scored.sum()))
    log.info(
        "%s pairs %.1f%% of the student's scored positions of %s with one of its own "
        "(val/aligned); the others train on CE alone",
        whose,
        100 * paired,
        what,
    )
