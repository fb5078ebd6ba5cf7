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

import warnings

from lightning_kd.data.alignment import TeacherView
from lightning_kd.utils.refusal import Refused

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

    def judge(self, view: TeacherView, what: str = "the student's text") -> None:
        """Refuse ``view`` below the floor (``what`` it holds, said in the refusal)."""
        self.judged = True
        if view.share < self.floor:
            raise Refused(
                f"the teacher's tokenizer spells back {view.share:.1%} of {what} "
                f"({view.text_bytes:,} bytes; distill.cross_min_aligned={self.floor}): {ADVICE}"
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
