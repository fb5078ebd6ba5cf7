"""``--help`` of the Hydra commands (train, cache, generate), answered before anything loads.

Hydra's own ``--help`` composes the whole config first, which imports every library the config's
defaults come from (torch, Lightning, transformers): about 7 s on a 2-core CPU to print a page
opening "train is powered by Hydra". This one lists the config groups from the shipped config
directory and names the flags that show the composed config (``--cfg job``, Hydra's).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

from lightning_kd.launch.config_dir import (
    CONFIG_DIR_FLAGS,
    group_options,
    shipped_config_dir,
    shipped_docs_dir,
)

HELP_FLAGS = ("--help", "-h")


def wants_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for help (Hydra's ``--hydra-help`` stays Hydra's)."""
    return any(word in HELP_FLAGS for word in argv)


def config_dirs(argv: Sequence[str]) -> list[Path]:
    """The directories ``--config-dir DIR`` (``-cd DIR``, ``--config-dir=DIR``) adds."""
    found = []
    for word, after in pairwise([*argv, None]):
        if word in CONFIG_DIR_FLAGS and after is not None:
            found.append(Path(after))
        elif word.startswith("--config-dir="):
            found.append(Path(word.partition("=")[2]))
    return [directory for directory in found if directory.is_dir()]


HYDRA_FLAGS = [
    "  -m                 a sweep over comma-separated values (seed=0,1); with",
    "                     hydra/launcher=submitit_slurm, each job is a SLURM job",
    "  --hydra-help       Hydra's own flags",
]
"""The flags of a command Hydra's main runs (``train``, ``cache``, ``generate``)."""


def hydra_help(verb: str, doc: str, argv: Sequence[str] = (), hydra_run: bool = True) -> str:
    """The help of ``lightning-kd <verb>``, whose module doc is ``doc``: the shipped config
    groups, with those of the config directories ``argv`` adds; ``hydra_run``: whether it runs
    through Hydra's main, with ``-m`` and ``--hydra-help`` (``importance`` composes one config)."""
    groups = group_options(shipped_config_dir())
    groups.pop("hydra/job_logging", None)  # the package's own: how the run's log is written
    for directory in config_dirs(argv):
        for group, options in group_options(directory).items():
            groups[group] = sorted({*groups.get(group, []), *options})
    groups = dict(sorted(groups.items()))
    width = max(map(len, groups))
    listed = [
        f"  {group + ':':<{width + 1}} {', '.join(options)}" for group, options in groups.items()
    ]
    return "\n".join(
        [
            f"usage: lightning-kd {verb} [group=option ...] [key=value ...] "
            f"{'[-m] ' if hydra_run else ''}[--config-dir DIR] [--cfg job]",
            "",
            textwrap.dedent(doc).strip().replace("``", ""),  # reST's literals, read as plain text
            "",
            "config groups (group=option; experiment=... sets several at once):",
            *listed,
            "",
            "options:",
            "  key=value          any config key (data.block_size=256, trainer.max_steps=100)",
            "  --cfg job          print the config these overrides compose, and exit",
            *(HYDRA_FLAGS[:2] if hydra_run else []),
            "  --config-dir DIR   your own configs, searched before the shipped ones",
            *(HYDRA_FLAGS[2:] if hydra_run else []),
            "",
            "--cfg job prints every key with its value; what each means: the docs' config page",
            f"({shipped_docs_dir() / 'config.md'}) and the classes each group builds;",
            f"the shipped configs (conf/ in this help): {shipped_config_dir()}",
        ]
    )
