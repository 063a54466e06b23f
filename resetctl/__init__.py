"""resetctl: deliver password-reset notices before the link dies.

From an application::

    import resetctl

    with resetctl.open(db="resetctl.db") as rc:
        [result] = rc.enqueue([{"idempotency_key": "r-1", "email": "ada@example.com",
                                "reset_url": "https://shop.example/r/abc"}], send=True)

``resetctl.open`` and the :class:`Handle` it returns are the stable API (README, "Use it
from your application"); the modules behind them may change. Importing the package is
cheap: the heavy modules load when a method needs them.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: importing typing alone costs more than the rest of this file.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from resetctl.api import Handle, open
    from resetctl.errors import (
        ConfigError,
        InputError,
        MalformedCallback,
        NoticeNotFound,
        ResetctlError,
        SignatureMismatch,
        StoreError,
    )

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Handle",
    "InputError",
    "MalformedCallback",
    "NoticeNotFound",
    "ResetctlError",
    "SignatureMismatch",
    "StoreError",
    "open",
]

_FROM_API = frozenset({"Handle", "open"})


def __getattr__(name: str) -> object:
    # PEP 562: `import resetctl` loads nothing else (the idle cron tick starts fast); the
    # API loads on first use of resetctl.open.
    if name in _FROM_API:
        from resetctl import api

        return getattr(api, name)
    if name in __all__:
        from resetctl import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'resetctl' has no attribute {name!r}")
