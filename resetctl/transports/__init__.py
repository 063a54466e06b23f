"""Transports by channel: the built-ins and the ``resetctl.transports`` entry points."""

from __future__ import annotations

import importlib
import os
import tomllib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resetctl.config import Settings
from resetctl.errors import ConfigError
from resetctl.policy import Channel, Sender
from resetctl.privacy import require_private
from resetctl.store import Store
from resetctl.telemetry import LOGGER
from resetctl.transports.base import (
    AmbiguousError,
    CallbackReader,
    CallbackReport,
    CallbackRequest,
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

if TYPE_CHECKING:
    from resetctl.providers import Providers

__all__ = [
    "AmbiguousError",
    "CallbackReader",
    "CallbackReport",
    "CallbackRequest",
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
    "callback_reader",
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
    "mailgun": "resetctl.transports.mailgun:PLUGIN",
    "plivo": "resetctl.transports.plivo:PLUGIN",
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
    name: str,
    options: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    file_first: bool = False,
) -> Callable[[str], str | None]:
    """Secrets from the environment, else from the TOML ``credentials_file`` in the table;
    with ``file_first`` (a ``[providers.<name>]`` instance: two accounts of one kind
    cannot both be the environment's) the file's first, then the environment."""
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
        sources = (from_file, environ) if file_first else (environ, from_file)
        for source in sources:
            value = source.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    return secret


def build_transports(
    settings: Settings,
    store: Store,
    clock: Callable[[], float],
    environ: Mapping[str, str] | None = None,
) -> Providers:
    """Every provider instance a channel names (in ``[transport]`` or a policy's own
    list), built once per channel it serves.

    Raises ConfigError for an unknown transport, bad options or missing credentials,
    so a misconfigured sweep fails before it claims anything.
    """
    from resetctl.providers import Providers

    env = os.environ if environ is None else environ
    built: dict[tuple[str, str], Transport] = {}
    chains: dict[str, tuple[str, ...]] = {}
    for channel in Channel:
        chain = chains[channel.value] = settings.chain(channel)
        for name in settings.instances_for(channel):
            where = "transport" if name in chain else "policy"
            built[(channel.value, name)] = _build(settings, store, clock, env, channel, name, where)
    for channel_name, name in store.live_attempt_instances():
        # An instance no channel names any more still holds messages in flight: their
        # status reads and lookups go to it while it is configured.
        if (channel_name, name) in built or name not in settings.instances:
            continue
        try:
            built[(channel_name, name)] = _build(
                settings, store, clock, env, Channel(channel_name), name, "transport"
            )
        except ConfigError as exc:
            LOGGER.warning("%s: not built for its attempts in flight (%s)", name, exc)
    return Providers(built, chains, settings=settings, store=store, failover=settings.failover)


def _build(
    settings: Settings,
    store: Store,
    clock: Callable[[], float],
    env: Mapping[str, str],
    channel: Channel,
    name: str,
    where: str,
) -> Transport:
    """One instance for one channel."""
    kind = settings.kind_of(name)
    found = plugin(kind)
    if found is None:
        raise ConfigError(f"{where}.{channel}: unknown transport {name!r}")
    if channel.value not in found.channels:
        what = name if kind == name else f"{name} ({kind})"
        raise ConfigError(f"{where}.{channel}: {what} cannot send {channel}")
    return found.create(_context(settings, store, clock, env, name, channel.value))


def _context(
    settings: Settings,
    store: Store,
    clock: Callable[[], float],
    env: Mapping[str, str],
    name: str,
    channel: str,
) -> TransportContext:
    """What instance ``name``'s kind builds it (or its callback reader) from."""
    options = settings.transport_options.get(name, {})
    instance = settings.instances.get(name)
    table = instance.where if instance is not None else name
    return TransportContext(
        name=name,
        channel=channel,
        options=options,
        secret=transport_secrets(table, options, env, file_first=table != name),
        store=store,
        clock=clock,
        where=table,
    )


def callback_reader(
    settings: Settings,
    store: Store,
    clock: Callable[[], float],
    instance: str,
    environ: Mapping[str, str] | None = None,
) -> CallbackReader:
    """The reader of ``instance``'s callbacks and webhooks (ConfigError when the instance
    is not configured, its kind takes none, or a signing key it needs is missing)."""
    found_instance = settings.instances.get(instance)
    if found_instance is None:
        raise ConfigError(f"observe: no provider instance {instance!r} is configured")
    found = plugin(found_instance.kind)
    if found is None or found.callbacks is None:
        raise ConfigError(f"observe: {instance} ({found_instance.kind}) takes no callbacks")
    env = os.environ if environ is None else environ
    channel = min(found.channels)
    return found.callbacks(_context(settings, store, clock, env, instance, channel))


def close_transports(transports: Providers | Mapping[str, Transport]) -> None:
    """Close each distinct transport once (one instance may serve both channels).

    Closing comes after the work is recorded: one that fails is logged by its class
    (a plugin's message may quote what it sent) and the others still close.
    """
    from resetctl.providers import Providers

    if isinstance(transports, Providers):
        distinct = transports.distinct()
    else:
        distinct = list({id(t): t for t in transports.values()}.values())
    for transport in distinct:
        try:
            transport.close()
        except Exception as exc:
            LOGGER.warning(
                "transport %s did not close cleanly (%s)",
                type(transport).__name__,
                type(exc).__name__,
            )
