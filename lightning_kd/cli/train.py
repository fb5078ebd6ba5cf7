"""``lightning-kd train [overrides]``: one distillation run (``python run.py`` in a checkout).

lightning-kd train                                  # SmolLM2-135M-Instruct → 6 layers
lightning-kd train debug=smoke hydra.run.dir=x      # tiny models, seconds
lightning-kd train --config-dir my_conf experiment=mine
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_kd.cli.hydra_help import hydra_help, wants_help


def main(argv: Sequence[str]) -> None:
    """Train as the Hydra command line ``argv`` composes it."""
    if wants_help(argv):  # before Hydra, torch and Lightning load (cli/hydra_help.py)
        print(hydra_help("train", __doc__, argv))
        return
    from lightning_kd.cli.hydra_command import run_hydra, typed_command
    from lightning_kd.launch.train import run
    from lightning_kd.launch.train_checks import train_job_errors

    command = typed_command("train")

    def train(cfg) -> float | None:
        return run(cfg, command)

    run_hydra(train, argv, train_job_errors)
