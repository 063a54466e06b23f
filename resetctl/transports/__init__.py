"""Transports by channel, built from the settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from resetctl.config import Channel, Settings
from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports import outbox
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
    "StatusVocabulary",
    "TransientError",
    "Transport",
    "TransportError",
    "build_transports",
    "status_vocabulary",
]


@dataclass(frozen=True, slots=True)
class StatusVocabulary:
    """A transport's raw statuses and its own mapping to the normalized ones."""

    #: the transport's name, as in [transport] and in replay traces
    name: str
    #: every raw status the transport knows; others normalize to unknown
    known: frozenset[str]
    #: the transport's raw-to-normalized mapping (the only copy of it)
    normalize: Callable[[str], Status]


VOCABULARIES: Mapping[str, StatusVocabulary] = {
    "outbox": StatusVocabulary("outbox", frozenset(outbox.OUTBOX_STATUSES), outbox.normalize),
}


def status_vocabulary(name: str) -> StatusVocabulary | None:
    """The status vocabulary of the transport called ``name``, if there is one."""
    return VOCABULARIES.get(name)


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
