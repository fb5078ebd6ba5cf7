"""Launch tests judge a SLURM launch as a login node would: ``sbatch`` and ``srun`` on the
``PATH`` (stand-ins that submit nothing); a test of their absence takes them away again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def slurm_client(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """A directory of ``sbatch``/``srun`` stand-ins put first on the ``PATH``."""
    bin_dir = tmp_path_factory.mktemp("slurm_bin")
    for name in ("sbatch", "srun"):
        (bin_dir / name).write_text(
            "#!/bin/sh\necho 'not submitted (a test stands in)' >&2\nexit 1\n"
        )
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir
