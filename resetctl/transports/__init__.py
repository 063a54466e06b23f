"""Transports by channel, built from the settings."""

from __future__ import annotations

from collections.abc import Callable

from resetctl.config import Channel, Settings
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.transports.base import (
    AmbiguousError,
    Message,
    PermanentError,
    ProviderStatus,
    TransientError,
    Transport,
    TransportError,
)
from resetctl.transports.outbox import OutboxTransport

__all__ = [
    "AmbiguousError",
    "Message",
    "PermanentError",
    "ProviderStatus",
    "TransientError",
    "Transport",
    "TransportError",
    "build_transports",
]


def build_transports(
    settings: Settings, store: Store, clock: Callable[[], float]
) -> dict[str, Transport]:
    """One transport per channel, as ``[transport]`` names them."""
    built: dict[str, Transport] = {}
    for channel in Channel:
        name = settings.transports[channel]
        if name != "outbox":
            raise ConfigError(f"transport.{channel}: unknown transport {name!r}")
        built[channel.value] = OutboxTransport(store, settings.outbox_status[channel], clock)
    return built
