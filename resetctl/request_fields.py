"""One enqueue request's fields, checked: each check adds a problem naming the line and
the field, never the value (it may be a secret), and returns the value as stored.

Also what the policy needs to know of a phone number: its country and its kind
(libphonenumber's reading), never the number itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import email_validator
import phonenumbers
from dateutil import parser as dateparser

from resetctl.durations import format_duration, parse_duration
from resetctl.errors import UNSHOWABLE, ConfigError, label
from resetctl.machine.admission import Destination
from resetctl.policy import Channel, Policy
from resetctl.render import MAX_DISPLAY_NAME, canonical_locale

FIELDS = frozenset(
    {
        "idempotency_key",
        "account_ref",
        "email",
        "phone",
        "reset_url",
        "region",
        "display_name",
        "expires_at",
        "ttl",
        "locale",
        "consent",
    }
)
_MAX_TEXT = {
    "idempotency_key": 200,
    "account_ref": 200,
    "region": 64,
    "display_name": MAX_DISPLAY_NAME,
    "locale": 35,
}
_MAX_URL = 2048
_SPACE = re.compile(r"\s")


class LineProblems:
    def __init__(self, line: int) -> None:
        self.line = line
        self.problems: list[str] = []

    def add(self, field: str, problem: str) -> None:
        self.problems.append(f"line {self.line}: {field}: {problem}")


def text(request: Mapping[str, Any], field: str, problems: LineProblems) -> str | None:
    value = request.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        problems.add(field, "expected a non-empty string")
        return None
    limit = _MAX_TEXT.get(field)
    if limit is not None and len(value) > limit:
        problems.add(field, f"longer than {limit} characters")
        return None
    if not value.isascii() and _unencodable(value):
        problems.add(field, "not valid Unicode text")
        return None
    if UNSHOWABLE.search(value):
        problems.add(field, "contains control characters")
        return None
    return value


def _unencodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def email(value: str | None, problems: LineProblems) -> str | None:
    if value is None:
        return None
    if "=?" in value:
        # Valid to RFC 5321, but the email package decodes an encoded word even inside an
        # address: the To header would name someone else, or break into lines.
        problems.add("email", "not a valid email address (holds an encoded word, =?)")
        return None
    try:
        checked = email_validator.validate_email(value, check_deliverability=False)
    except email_validator.EmailNotValidError:
        problems.add("email", "not a valid email address")
        return None
    return str(checked.normalized)


def phone(value: str | None, problems: LineProblems) -> tuple[str | None, Destination | None]:
    """The E.164 number, and where it goes (its country and libphonenumber's type)."""
    if value is None:
        return None, None
    try:
        number = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException:
        number = None
    if (
        number is None
        or not value.startswith("+")
        or phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164) != value
        or not phonenumbers.is_valid_number(number)
    ):
        problems.add("phone", "not a valid E.164 number (e.g. +14155550123)")
        return None, None
    country = phonenumbers.region_code_for_number(number) or "ZZ"
    kind = phonenumbers.PhoneNumberType.to_string(phonenumbers.number_type(number))
    return value, Destination(country, (kind or "unknown").lower())


def consent(request: Mapping[str, Any], problems: LineProblems) -> tuple[str, ...] | None:
    """The channels the person agreed to be reached on (``["email"]``); None when the
    request does not say."""
    value = request.get("consent")
    if value is None:
        return None
    names = {str(c) for c in Channel}
    if (
        not isinstance(value, list)
        or not all(isinstance(v, str) and v in names for v in value)
        or len(set(value)) != len(value)
    ):
        problems.add("consent", 'expected a list of channels, e.g. ["email", "sms"]')
        return None
    return tuple(str(c) for c in Channel if c in value)


def reset_url(value: str | None, problems: LineProblems, hosts: tuple[str, ...] = ()) -> str | None:
    if value is None:
        problems.add("reset_url", "required")
        return None
    if len(value) > _MAX_URL:
        problems.add("reset_url", f"longer than {_MAX_URL} characters")
        return None
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        problems.add("reset_url", "must be an absolute https:// URL")
        return None
    if parts.scheme != "https" or not host or _SPACE.search(value):
        problems.add("reset_url", "must be an absolute https:// URL")
        return None
    if "@" in parts.netloc:
        # https://shop.example@evil.example/ reads as the shop in a message, goes elsewhere.
        problems.add("reset_url", "must not carry a user name or password")
        return None
    try:
        parts.port  # noqa: B018 -- raises for a port out of range or not a number
    except ValueError:
        problems.add("reset_url", "has an invalid port")
        return None
    if hosts and not _host_allowed(host.rstrip("."), hosts):
        problems.add("reset_url", "its host is not one of reset_url_hosts")
        return None
    return value


def _host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """``host`` is listed, or is a subdomain of a ``*.`` entry."""
    for pattern in allowed:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


def locale(value: str | None, problems: LineProblems) -> str | None:
    if value is None:
        return None
    try:
        return canonical_locale(value)
    except ValueError:
        problems.add("locale", "not a BCP 47 language tag CLDR knows (e.g. es or es-MX)")
        return None


def expiry(
    request: Mapping[str, Any], policy: Policy, now: float, problems: LineProblems
) -> float | None:
    has_at, has_ttl = "expires_at" in request, "ttl" in request
    if has_at and has_ttl:
        problems.add("expires_at", "give expires_at or ttl, not both")
        return None
    if has_at:
        raw = request["expires_at"]
        if not isinstance(raw, str):
            problems.add("expires_at", "expected an ISO 8601 time with an offset")
            return None
        try:
            moment: datetime = dateparser.isoparse(raw)
        except (ValueError, OverflowError):
            problems.add("expires_at", "expected an ISO 8601 time with an offset")
            return None
        if moment.tzinfo is None or moment.utcoffset() is None:
            problems.add("expires_at", "needs a timezone offset (e.g. 2026-11-29T10:00:00Z)")
            return None
        try:
            expires = moment.timestamp()
        except (OverflowError, ValueError, OSError):
            problems.add("expires_at", "out of range")
            return None
    elif has_ttl:
        raw_ttl = request["ttl"]
        try:
            if isinstance(raw_ttl, int) and not isinstance(raw_ttl, bool) and raw_ttl > 0:
                # An integer too large for a float is past any max_ttl, not malformed.
                raw_ttl = min(raw_ttl, 2 * int(policy.max_ttl) + 1)
            expires = now + parse_duration(raw_ttl, "ttl")
        except ConfigError:
            problems.add("ttl", "expected a positive duration such as '10m', '90s' or 600")
            return None
    else:
        expires = now + policy.ttl
    field = "expires_at" if has_at else "ttl"
    if not math.isfinite(expires) or expires - now > policy.max_ttl:
        # A link lifetime the policy never meant: a typo, or a number that would overflow
        # every later date computation.
        problems.add(
            field,
            f"more than policy.{label(policy.name)}.max_ttl ({format_duration(policy.max_ttl)})"
            " from now",
        )
        return None
    if expires <= now:
        problems.add(field, "the link has already expired")
        return None
    return expires
