"""Durations as operators write them (``90``, ``"90s"``, ``"10m"``, ``"1h30m"``) and as
on-call reads them (``10m``, ``1m30s``)."""

from __future__ import annotations

import math
import re

from resetctl.errors import ConfigError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object, where: str) -> float:
    """Seconds from ``90``, ``1.5``, ``"90s"``, ``"10m"``, ``"1h30m"`` or ``"250ms"``.

    Raises ConfigError naming ``where`` for anything else, or for a value that is not
    positive: a zero lease or ttl is always a mistake.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a duration such as 90, '90s' or '10m'")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ConfigError(f"{where}: too large") from None
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if text and re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        else:
            parts = _DURATION_PART.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise ConfigError(
                    f"{where}: {value!r} is not a duration (use seconds or 90s, 10m, 1h)"
                )
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    else:
        raise ConfigError(f"{where}: expected a duration such as 90, '90s' or '10m'")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{where}: must be a positive duration")
    return seconds


def parse_time_or_ago(value: str, field: str, now: float) -> float:
    """Seconds since the epoch from an ISO 8601 time with offset, or a duration ago
    ("24h", "7d") before ``now``; ConfigError naming ``field`` otherwise."""
    from dateutil import parser as dateparser

    try:
        moment = dateparser.isoparse(value)
    except ValueError:
        try:
            return now - parse_duration(value, field)
        except ConfigError:
            raise ConfigError(
                f"{field}: expected an ISO 8601 time with offset or a duration ago (24h)"
            ) from None
    if moment.tzinfo is None:
        raise ConfigError(f"{field}: needs a timezone offset (e.g. 2026-11-29T00:00:00Z)")
    return moment.timestamp()


def format_duration(seconds: float) -> str:
    """Short human form: ``10m``, ``1m30s``, ``45s``, ``-2m`` (for on-call output)."""
    sign = "-" if seconds < 0 else ""
    total = abs(seconds)
    if total < 60:
        return f"{sign}{total:.0f}s" if total >= 1 or total == 0 else f"{sign}{total:.1f}s"
    whole = round(total)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return sign + text + (f"{secs}s" if secs else "")
