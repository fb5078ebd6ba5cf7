"""Hydra's submitit launchers, telling how a job ended in a line rather than a traceback.

``conf/hydra/launcher/submitit_*.yaml`` name these as their ``_target_``. The plugin's launcher
waits for each job's result and raises submitit's ``UncompletedJobError`` for a job stopped at
its time limit (its run saved a checkpoint and printed the resume command, in its own log),
which Hydra printed as a traceback. Hydra takes launchers only from the ``hydra_plugins``
namespace, and imports each module there when it starts (any Hydra app's): this one imports
only the plugin then, and defines nothing without it (the ``cluster`` extra). Jobs unpickle
the launcher on the nodes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
    from submitit.core.utils import FailedJobError, UncompletedJobError
except ImportError:  # no cluster extra: Hydra's scan of its plugins imports this all the same
    plugin = None


class _Reporting:
    """``launch``, with a job that did not finish told by :func:`job_end_message`, exit 1."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        try:
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        except (UncompletedJobError, FailedJobError) as error:
            from lightning_kd.launch.cluster_jobs import job_end_message

            print(f"lightning-kd: {job_end_message(error)}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None


if plugin is not None:

    class SlurmLauncher(_Reporting, plugin.SlurmLauncher):
        """Each job a SLURM job."""

    class LocalLauncher(_Reporting, plugin.LocalLauncher):
        """Each job a process of this machine."""
