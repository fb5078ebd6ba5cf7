"""``lightning-kd train [overrides]``: one distillation run (``python run.py`` in a checkout).

lightning-kd train                                  # SmolLM2-135M → 6-layer student
lightning-kd train debug=smoke hydra.run.dir=x      # tiny models, seconds
lightning-kd train --config-dir my_conf experiment=mine
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from lightning_kd.cli.hydra_command import run_hydra, typed_command
from lightning_kd.launch.train import run


def main(argv: Sequence[str]) -> None:
    """Train as the Hydra command line ``argv`` composes it."""
    command = typed_command("train")

    def train(cfg: DictConfig) -> float | None:
        return run(cfg, command)

    run_hydra(train, argv)
