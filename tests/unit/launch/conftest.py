"""Launch tests judge a SLURM launch as a login node would: ``sbatch`` and ``srun`` on the
``PATH`` (the integration tests' stand-ins, which submit nothing); a test of their absence
takes them away again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.test_cluster_launch import fake_slurm


@pytest.fixture
def slurm_client(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """The directory of the ``sbatch``/``srun`` stand-ins, put first on the ``PATH``."""
    env = fake_slurm(tmp_path_factory.mktemp("slurm"))
    monkeypatch.setenv("PATH", env["PATH"])
    return Path(env["PATH"].split(os.pathsep, 1)[0])
