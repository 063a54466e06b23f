"""Transports by channel: the built-ins and the ``resetctl.transports`` entry points."""

from __future__ import annotations

import importlib
import os
import tomllib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from resetctl.config import Settings
from resetctl.errors import ConfigError
from resetctl.policy import Channel, Sender
from resetctl.privacy import require_private
from resetctl.store import Store
from resetctl.telemetry import LOGGER
from resetctl.transports.base import (
    AmbiguousError,
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    ThrottledError,
    TransientError,
    Transport,
    TransportContext,
    TransportError,
    TransportPlugin,
)

__all__ = [
    "AmbiguousError",
    "Message",
    "PermanentError",
    "ProviderStatus",
    "Sender",
    "StatusVocabulary",
    "ThrottledError",
    "TransientError",
    "Transport",
    "TransportContext",
    "TransportError",
    "TransportPlugin",
    "build_transports",
    "close_transports",
    "plugin",
    "status_vocabulary",
    "transport_secrets",
]

#: Built-in transports, imported only when used (an idle cron tick imports none).
BUILT_IN = {
    "outbox": "resetctl.transports.outbox:PLUGIN",
    "smtp": "resetctl.transports.smtp:PLUGIN",
    "postmark": "resetctl.transports.postmark:PLUGIN",
    "twilio": "resetctl.transports.twilio:PLUGIN",
}
ENTRY_POINT_GROUP = "resetctl.transports"


def _load(target: str) -> TransportPlugin:
    module, _, attribute = target.partition(":")
    loaded = getattr(importlib.import_module(module), attribute)
    if not isinstance(loaded, TransportPlugin):
        raise ConfigError(f"transport {target}: not a resetctl TransportPlugin")
    return loaded


def plugin(name: str) -> TransportPlugin | None:
    """The transport called ``name``: built in, or from an installed package."""
    if name in BUILT_IN:
        return _load(BUILT_IN[name])
    for entry in entry_points(group=ENTRY_POINT_GROUP, name=name):
        loaded = entry.load()
        if isinstance(loaded, TransportPlugin):
            return loaded
        raise ConfigError(f"transport {name}: entry point is not a resetctl TransportPlugin")
    return None


def status_vocabulary(name: str) -> StatusVocabulary | None:
    """The status vocabulary of the transport called ``name``, if there is one."""
    found = plugin(name)
    return None if found is None else found.vocabulary


def transport_secrets(
    name: str, options: Mapping[str, Any], environ: Mapping[str, str]
) -> Callable[[str], str | None]:
    """Secrets from the environment, else from the TOML ``credentials_file`` in the table."""
    path = options.get("credentials_file")
    from_file: dict[str, Any] = {}
    if path is not None:
        if not isinstance(path, str):
            raise ConfigError(f"{name}.credentials_file: expected a path")
        try:
            require_private(Path(path), f"{name}.credentials_file")
            from_file = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{name}.credentials_file: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{name}.credentials_file: not UTF-8 text") from None
        except tomllib.TOMLDecodeError:
            # The parser's message may quote the file, and the file holds secrets.
            raise ConfigError(f"{name}.credentials_file: not valid TOML") from None

    def secret(key: str) -> str | None:
        value = environ.get(key) or from_file.get(key)
        return value if isinstance(value, str) and value else None

    return secret


def build_transports(
    settings: Settings,
    store: Store,
    clock: Callable[[], float],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Transport]:
    """One transport per channel, as ``[transport]`` names them.

    Raises ConfigError for an unknown transport, bad options or missing credentials,
    so a misconfigured sweep fails before it claims anything.
    """
    env = os.environ if environ is None else environ
    built: dict[str, Transport] = {}
    for channel in Channel:
        name = settings.transports[channel]
        found = plugin(name)
        if found is None:
            raise ConfigError(f"transport.{channel}: unknown transport {name!r}")
        if channel.value not in found.channels:
            raise ConfigError(f"transport.{channel}: {name} cannot send {channel}")
        options = settings.transport_options.get(name, {})
        context = TransportContext(
            name=name,
            channel=channel.value,
            options=options,
            secret=transport_secrets(name, options, env),
            store=store,
            clock=clock,
        )
        built[channel.value] = found.create(context)
    return built


def close_transports(transports: Mapping[str, Transport]) -> None:
    """Close each distinct transport once (one instance may serve both channels).

    Closing comes after the work is recorded: one that fails is logged by its class
    (a plugin's message may quote what it sent) and the others still close.
    """
    for transport in {id(t): t for t in transports.values()}.values():
        try:
            transport.close()
        except Exception as exc:
            LOGGER.warning(
                "transport %s did not close cleanly (%s)",
                type(transport).__name__,
                type(exc).__name__,
            )
