"""The `perfmod` console script: the command line, and a Ctrl-C that comes
while it is still loading (its imports take a fraction of a second) ends it
quietly with status 130 as well, instead of with a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from codemod.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        sys.exit(130)
    command()
