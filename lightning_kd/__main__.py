"""``python -m lightning_kd <command> ...``: the same commands as ``lightning-kd``."""

import sys

from lightning_kd.cli import main

sys.exit(main())
