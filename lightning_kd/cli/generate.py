"""``lightning-kd generate generate.prompts=FILE|train_split hydra.run.dir=DIR [overrides]``: the
teacher's completions for sequence-level KD, as chat rows ``data=chat`` reads back.

    lightning-kd generate generate.prompts=prompts.jsonl hydra.run.dir=gen
    lightning-kd train data=chat 'data.files=[gen/completions.jsonl]'
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_kd.cli.hydra_help import hydra_help, wants_help


def main(argv: Sequence[str]) -> None:
    """Write the completions of the config the Hydra command line ``argv`` composes."""
    if wants_help(argv):  # before Hydra, torch and Lightning load (cli/hydra_help.py)
        print(hydra_help("generate", __doc__, argv))
        return
    from lightning_kd.cli.hydra_command import run_hydra
    from lightning_kd.launch.generate import run_generate

    def generate(cfg) -> None:
        print(f"teacher completions: {run_generate(cfg)}")

    run_hydra(generate, argv)
