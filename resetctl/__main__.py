"""``python -m resetctl``."""

from __future__ import annotations

from resetctl.cli import main

main()
