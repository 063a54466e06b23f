"""Typed readers of a provider table's options, shared by the HTTP adapters.

Each reader checks one kind of value the same way for every provider, so an operator
meets one wording whichever table is wrong; every ConfigError names the key as
``<table>.<key>`` (``twilio.read_timeout``, ``providers.twilio_eu.lookup_settle``).
"""

from __future__ import annotations

import httpx

from resetctl.config import loopback_host
from resetctl.durations import parse_duration
from resetctl.errors import ConfigError
from resetctl.transports.base import TransportContext

#: The longest time-out of one wait accepted: a sweep's lease has to cover the call.
MAX_TIMEOUT = 300.0
#: The longest lookup_settle accepted: a longer one outlives any reset link.
MAX_LOOKUP_SETTLE = 3600.0


def optional_str(context: TransportContext, key: str) -> str | None:
    """The string under ``key``, or None when the table leaves it out; a blank one is an
    error, not an absent one (the operator meant to set it)."""
    if key not in context.options:
        return None
    value: str = context.option(key, "", str)
    if not value.strip():
        raise ConfigError(f"{context.table}.{key}: must not be empty")
    return value


def required_str(context: TransportContext, key: str, what: str) -> str:
    """The non-blank string under ``key``; its absence says ``what`` it should hold."""
    if key not in context.options:
        raise ConfigError(f"{context.table}.{key}: required ({what})")
    value: str = context.option(key, "", str)
    if not value.strip():
        raise ConfigError(f"{context.table}.{key}: must not be empty")
    return value


def timeout_seconds(context: TransportContext, key: str, default: float) -> float:
    """A time-out in seconds, within (0, MAX_TIMEOUT]: httpx bounds each wait by it, and
    ``call_timeout`` adds the waits up."""
    value = float(context.option(key, default, (int, float)))
    if not 0 < value <= MAX_TIMEOUT:
        raise ConfigError(f"{context.table}.{key}: expected seconds in (0, {MAX_TIMEOUT:g}]")
    return value


def lookup_settle(
    context: TransportContext, default: float, maximum: float = MAX_LOOKUP_SETTLE
) -> float:
    """``lookup_settle`` as a duration (seconds or ``"30s"``), at most ``maximum``."""
    where = f"{context.table}.lookup_settle"
    value = parse_duration(context.options.get("lookup_settle", default), where)
    if value > maximum:
        raise ConfigError(f"{where}: expected at most {maximum:g} seconds")
    return value


def absolute_http_url(value: str) -> httpx.URL | None:
    """``value`` as httpx parses it (the URL it sends to), when it is an absolute http or
    https URL with a host; None otherwise. Parsed by httpx, not urllib, so what is checked
    is what a request would go to."""
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        return None
    if url.scheme not in ("http", "https") or not url.host:
        return None
    return url


def http_url(context: TransportContext, key: str, value: str) -> httpx.URL:
    """``value`` (the option ``key``) parsed, when absolute http(s)."""
    url = absolute_http_url(value)
    if url is None:
        raise ConfigError(f"{context.table}.{key}: expected an http(s) URL")
    return url


def require_https_or_loopback(context: TransportContext, key: str, url: httpx.URL) -> None:
    """ConfigError unless ``url`` is https or goes to a loopback host: what travels to it
    (a credential, or a provider's report holding the number or address) must not cross
    a network in clear."""
    if url.scheme != "https" and not loopback_host(url.host):
        raise ConfigError(
            f"{context.table}.{key}: must be https://; http:// only for a loopback host"
        )


def https_or_loopback_url(context: TransportContext, key: str, value: str) -> httpx.URL:
    """``value`` (the option ``key``) parsed, when absolute and https (http only for a
    loopback host)."""
    url = http_url(context, key, value)
    require_https_or_loopback(context, key, url)
    return url
