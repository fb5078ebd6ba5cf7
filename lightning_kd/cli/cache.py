"""``lightning-kd cache hydra.run.dir=DIR [overrides]``: write the teacher's top-k cache.

The same config groups as ``train`` (``teacher=``, ``data=``, ``debug=smoke``, ...) plus
``cache.*`` (``conf/cache/default.yaml``). ``strategy=ddp trainer.devices=N`` writes with N
processes (Lightning Fabric's launcher; gloo on CPUs), each its own shards.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_kd.cli.hydra_help import hydra_help, wants_help


def main(argv: Sequence[str]) -> None:
    """Write the cache of the config the Hydra command line ``argv`` composes."""
    if wants_help(argv):  # before Hydra, torch and Lightning load (cli/hydra_help.py)
        print(hydra_help("cache", __doc__, argv))
        return
    from lightning_kd.cli.hydra_command import run_hydra
    from lightning_kd.launch.cache import write

    run_hydra(write, argv)
