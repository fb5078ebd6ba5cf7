"""How much of the student's text a teacher of another tokenizer spells back, watched for a run.

A tokenizer that rewrites the text (lower case, other Unicode forms) leaves part of it spelled
by no teacher token, and those positions train on CE alone. The first batch is judged before
step 0 (``distill.cross_min_aligned``: refused below it). A corpus is not its first batch: the
share over every batch read since is kept, and the first time it falls below the floor the run
is warned, once, naming it (a teacher that lower-cases passed on lower-case prose first and
then trained silently on titles and code at 3 % spelled back).
"""

from __future__ import annotations

import warnings

from lightning_kd.data.alignment import TeacherView
from lightning_kd.utils.refusal import Refused

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
        self.warned = False

    @property
    def share(self) -> float:
        """The share over every batch read (1.0 before any text)."""
        return self.matched / self.text if self.text else 1.0

    def add(self, view: TeacherView) -> None:
        """Count ``view``: refuse a first batch below the floor, warn once when the share of
        every batch read so far falls below it later."""
        self.views += 1
        self.matched += view.matched_bytes
        self.text += view.text_bytes
        if self.views == 1 and view.share < self.floor:
            raise Refused(
                f"the teacher's tokenizer spells back {view.share:.1%} of the student's text "
                f"(distill.cross_min_aligned={self.floor}): {ADVICE}"
            )
        if not self.warned and self.share < self.floor:
            self.warned = True
            warnings.warn(
                f"the teacher's tokenizer has spelled back {self.share:.1%} of the student's "
                f"text over the {self.views} batches read so far ({self.text:,} bytes), below "
                f"distill.cross_min_aligned={self.floor} (the first batch passed): the positions "
                f"it does not spell train on CE alone; {ADVICE}",
                stacklevel=2,
            )
