"""How the argparse commands print their help: the module docstring as written, and each
option's default after its help (``--batch-size`` said neither what it was nor its 8)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description kept as written; ``(default: X)`` after each option's help."""
