"""The console entry point (``resetctl``, ``python -m resetctl``): the idle tick's fast
path, else the full command line. Nothing imports this module."""

from __future__ import annotations

import os
import sys

from resetctl.tick import idle_tick


def main() -> None:
    """Answer an idle ``resetctl sweep`` before typer and rich load; else the CLI."""
    code = idle_tick(sys.argv[1:], os.environ)
    if code is not None:
        sys.exit(code)
    from resetctl.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
