"""``lightning-kd importance [overrides]``: score the teacher's layers on calibration blocks of the
training split and print the ``student.layers`` that ``student.layers=importance`` would keep,
without training.

    lightning-kd importance                       # the table for the default run
    lightning-kd importance student.num_layers=8 student.importance=greedy_kl
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning_kd.launch.build import with_precision, with_values
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.data_checks import dataset_errors
from lightning_kd.launch.entry import check_entry, teacher_length
from lightning_kd.launch.importance import score_config
from lightning_kd.launch.model_checks import model_setting_errors


def main(argv: Sequence[str]) -> int:
    """Print the layer table ``lightning-kd train <argv>`` would choose from."""
    if any(word in ("-h", "--help") for word in argv):
        print(__doc__)
        return 0
    if flags := [word for word in argv if word.startswith("-")]:
        print(f"lightning-kd importance takes config overrides only, not {flags}", file=sys.stderr)
        return 2
    cfg = compose_config(list(argv))
    # The command ranks as student.layers=importance does: its settings are checked as such.
    ranked = with_values(cfg, {"student.layers": "importance"})
    extra = dataset_errors(cfg) + model_setting_errors(ranked)
    check_entry(cfg, lengths=[teacher_length(cfg, "data.block_size")], extra=extra)
    cfg, _ = with_precision(cfg)
    ranking = score_config(cfg)
    print(ranking.table())
    print(
        f"\nkept by {ranking.by} ({len(ranking.kept)} layers, {ranking.tokens} calibration "
        f"tokens from the training split, {ranking.seconds:.0f} s): "
        f"student.layers=[{','.join(map(str, ranking.kept))}]"
    )
    return 0
