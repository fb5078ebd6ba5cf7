"""MLflow's record of a run stopped to be resumed: ``KILLED``, not ``FAILED``.

Lightning ends its loggers with ``finalize("failed")`` on any exception out of ``fit``, and its
``MLFlowLogger`` marks that run ``FAILED``. A run that SIGTERM or Ctrl+C stopped at a clean point
saved its checkpoint and is resumed by the command it printed: the MLflow UI showed a failure
beside the resumed run's ``FINISHED`` (probe 47). It is marked ``KILLED``, MLflow's status for a
run ended from outside.
"""

from __future__ import annotations

import sys

from lightning.pytorch.loggers import MLFlowLogger

from lightning_kd.utils.stopping import Interrupted

KILLED = "KILLED"


class MLflowRunLogger(MLFlowLogger):
    """Lightning's MLflow logger, a run stopped by a signal marked ``KILLED``."""

    def finalize(self, status: str = "success") -> None:
        # Lightning finalizes inside its handler of the exception that ended fit.
        if status == "failed" and isinstance(sys.exc_info()[1], Interrupted):
            status = KILLED
        super().finalize(status)
