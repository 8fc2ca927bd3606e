"""Command line entry point (filled in by the config/CLI work)."""

import sys


def console_main() -> None:
    sys.exit(1)
