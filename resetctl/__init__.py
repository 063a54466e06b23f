"""resetctl: deliver password-reset notices before the link dies."""

from __future__ import annotations

__version__ = "0.1.0"
