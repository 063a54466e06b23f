"""``python -m resetctl``: the idle tick, else the full command line."""

from __future__ import annotations

from resetctl.tick import main

main()
