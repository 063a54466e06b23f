"""Settings and versioned delivery policies, read from TOML and validated.

Every error names the offending key (``policy.eu.fallback_reserve: …``) so an operator
can fix a file without reading code. Nothing here touches the database.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import itertools
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resetctl.errors import ConfigError, label


class Channel(enum.StrEnum):
    """A delivery channel; the policy names their order."""

    #: an email to the notice's address
    EMAIL = "email"
    #: a text message to the notice's E.164 phone number
    SMS = "sms"


#: Channels by name: a dict lookup, where ``Channel(name)`` goes through the enum's call
#: machinery (the machine asks a policy about a channel several times per step).
CHANNELS: dict[str, Channel] = {str(c): c for c in Channel}


class OnBudgetSpent(enum.StrEnum):
    """What to do when a channel's poll budget is spent and its status is still open."""

    #: claim the fallback channel (when the fallback reserve still allows it)
    ESCALATE = "escalate"
    #: stop: the notice expires without trying another channel
    EXPIRE = "expire"


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TEMPLATE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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


@dataclass(frozen=True, slots=True)
class Policy:
    """One versioned delivery policy, resolved once per notice at enqueue."""

    #: the `[policy.<name>]` table this came from (a region, or "default")
    name: str
    #: bumped by the operator on every change; stored on each notice
    version: int
    #: delivery order: the primary first, then the fallback (if any)
    channels: tuple[Channel, ...]
    #: link lifetime used when an enqueue gives neither ttl nor expires_at
    ttl: float
    #: least remaining lifetime that still makes a fallback worth sending
    fallback_reserve: float
    #: least remaining lifetime that still makes a first submission worth sending
    send_reserve: float
    #: status polls per channel, in seconds after that channel's submission
    poll_delays: Mapping[Channel, tuple[float, ...]]
    #: retries of a submission that failed transiently, in seconds after the first try
    retry_delays: tuple[float, ...]
    #: the choice when a channel's polls are spent and its status is still open
    on_poll_budget_spent: OnBudgetSpent
    #: how long a sweep owns a claimed notice before another may take it over
    lease: float
    #: notices claimed per batch
    batch_size: int
    #: the `<templates dir>/<version>/` directory rendered for this policy's messages
    template_version: str
    #: a rendered SMS longer than this many segments is refused, never truncated
    sms_max_segments: int = 2
    #: "page": `alerts` exits non-zero for this policy's notices at risk; "observe": it
    #: only records would-have-paged events (to trial a threshold quietly)
    alert_mode: str = "page"
    #: warn this long before a notice's remaining lifetime stops covering its next action
    alert_warning: float = 60.0
    #: per channel, the normalized statuses that end the notice as accepted
    success: Mapping[Channel, frozenset[str]] = field(default_factory=lambda: dict(DEFAULT_SUCCESS))
    #: `alerts` reports the sweeper stalled when live notices exist and the last sweep
    #: ended longer ago than this (read from `[policy.default]`)
    alert_stalled_after: float = 180.0
    #: the longest link lifetime an enqueue may ask for (ttl or expires_at)
    max_ttl: float = 86400.0
    #: a new notice for an account cancels the account's live notices in its region
    #: (their links are dead once the framework issues a new token)
    supersede_older: bool = True

    def polls_for(self, channel: str) -> tuple[float, ...]:
        """The poll schedule of ``channel``."""
        return self.poll_delays[CHANNELS[channel]]

    def succeeds(self, channel: str, status: str) -> bool:
        """True when ``status`` on ``channel`` ends the notice as accepted."""
        return status in self.success[CHANNELS[channel]]

    def to_record(self) -> dict[str, Any]:
        """A JSON-able record; stored by (name, version) so notices in flight keep it."""
        return {
            "name": self.name,
            "version": self.version,
            "channels": [str(c) for c in self.channels],
            "ttl": self.ttl,
            "fallback_reserve": self.fallback_reserve,
            "send_reserve": self.send_reserve,
            "poll_delays": {str(c): list(d) for c, d in sorted(self.poll_delays.items())},
            "retry_delays": list(self.retry_delays),
            "on_poll_budget_spent": str(self.on_poll_budget_spent),
            "lease": self.lease,
            "batch_size": self.batch_size,
            "template_version": self.template_version,
            "sms_max_segments": self.sms_max_segments,
            "alert_mode": self.alert_mode,
            "alert_warning": self.alert_warning,
            "success": {str(c): sorted(s) for c, s in sorted(self.success.items())},
            "alert_stalled_after": self.alert_stalled_after,
            "max_ttl": self.max_ttl,
            "supersede_older": self.supersede_older,
        }

    def record_json(self) -> str:
        """The record as canonical JSON (stable key order), for storage and comparison."""
        return json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Policy:
        """Rebuild a policy stored with :meth:`to_record`."""
        return cls(
            name=record["name"],
            version=int(record["version"]),
            channels=tuple(Channel(c) for c in record["channels"]),
            ttl=float(record["ttl"]),
            fallback_reserve=float(record["fallback_reserve"]),
            send_reserve=float(record["send_reserve"]),
            poll_delays={
                Channel(c): tuple(float(x) for x in d) for c, d in record["poll_delays"].items()
            },
            retry_delays=tuple(float(x) for x in record["retry_delays"]),
            on_poll_budget_spent=OnBudgetSpent(record["on_poll_budget_spent"]),
            lease=float(record["lease"]),
            batch_size=int(record["batch_size"]),
            template_version=str(record["template_version"]),
            sms_max_segments=int(record.get("sms_max_segments", 2)),
            alert_mode=str(record.get("alert_mode", "page")),
            alert_warning=float(record.get("alert_warning", 60.0)),
            # Records stored before success was policy data take today's defaults.
            success={
                **DEFAULT_SUCCESS,
                **{Channel(c): frozenset(s) for c, s in record.get("success", {}).items()},
            },
            alert_stalled_after=float(record.get("alert_stalled_after", 180.0)),
            max_ttl=float(record.get("max_ttl", 86400.0)),
            supersede_older=bool(record.get("supersede_older", True)),
        )


#: Which normalized statuses end a notice, per channel. The provider taking an email is
#: all SMTP can ever say; for SMS only a delivery receipt proves the person got it
#: (``accepted``, Twilio's ``sent``, is a hand-off to a carrier).
DEFAULT_SUCCESS: Mapping[Channel, frozenset[str]] = {
    Channel.EMAIL: frozenset({"accepted", "delivered"}),
    Channel.SMS: frozenset({"delivered"}),
}
#: Statuses a policy may count as success (pending, failed and unknown never can).
SUCCESS_STATUSES = frozenset({"accepted", "delivered"})

#: The built-in policy: 10-minute links, email first, email polled 15/45/105 s after
#: submission, SMS fallback, escalate when the polls are spent.
DEFAULT_POLICY: dict[str, Any] = {
    "version": 1,
    "channels": ["email", "sms"],
    "ttl": "10m",
    "fallback_reserve": "3m",
    "send_reserve": "30s",
    "on_poll_budget_spent": "escalate",
    "lease": "60s",
    "batch_size": 50,
    "template_version": "v1",
    "retry_delays": [10, 30],
    "alert_mode": "page",
    "alert_warning": "1m",
    "alert_stalled_after": "3m",
    "max_ttl": "24h",
    "supersede_older": True,
    "email": {"poll_delays": [15, 45, 105], "success": ["accepted", "delivered"]},
    "sms": {"poll_delays": [15, 45, 105], "max_segments": 2, "success": ["delivered"]},
}

_POLICY_KEYS = frozenset(DEFAULT_POLICY)
_CHANNEL_KEYS = {
    "email": frozenset({"poll_delays", "success"}),
    "sms": frozenset({"poll_delays", "max_segments", "success"}),
}
_TOP_KEYS = frozenset(
    {
        "db",
        "support_label",
        "unknown_region",
        "reset_url_hosts",
        "policy",
        "transport",
        "privacy",
        "hash_key_file",
        "templates",
        "sweep",
    }
)
#: ``unknown_region``: what an enqueue naming a region with no ``[policy.<region>]`` gets.
UNKNOWN_REGION_CHOICES = ("refuse", "default")
#: Keys every transport's table may hold: its lane in a sweep (issue 22).
LANE_KEYS = frozenset({"max_in_flight", "max_rate"})
#: The most provider calls one sweep makes at once, and the fastest rate accepted.
MAX_CONCURRENCY = 256
MAX_RATE = 10_000.0
#: Provider calls one sweep makes at once unless `[sweep] concurrency` says otherwise.
DEFAULT_CONCURRENCY = 16
_PRIVACY_KEYS = frozenset({"hash_key_file"})
#: Transports shipped with resetctl; others come from the resetctl.transports entry points.
BUILT_IN_TRANSPORTS = frozenset({"outbox", "smtp", "postmark", "twilio"})
_OUTBOX_STATUSES = frozenset({"pending", "accepted", "delivered", "failed", "unknown"})


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: must be a positive whole number")
    return value


#: Upper bounds on policy numbers: past these a value is a mistake, not a choice (and a
#: version past 2^31 - 1 does not fit PostgreSQL's INTEGER).
MAX_VERSION = 2**31 - 1
MAX_BATCH = 10_000
MAX_SCHEDULE = 20
MAX_SEGMENTS = 10
MAX_LIFETIME = 30 * 86400.0


def _at_most(value: int, limit: int, where: str) -> int:
    if value > limit:
        raise ConfigError(f"{where}: must be at most {limit}")
    return value


def _schedule(value: object, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of delays, e.g. [15, 45, 105]")
    if len(value) > MAX_SCHEDULE:
        raise ConfigError(f"{where}: at most {MAX_SCHEDULE} delays")
    delays = tuple(parse_duration(v, f"{where}[{i}]") for i, v in enumerate(value))
    if any(b <= a for a, b in itertools.pairwise(delays)):
        raise ConfigError(f"{where}: delays must increase strictly")
    return delays


def build_policy(name: str, table: Mapping[str, Any]) -> Policy:
    """Validate one ``[policy.<name>]`` table over the built-in defaults."""
    where = f"policy.{label(name)}"
    for key in table:
        if key not in _POLICY_KEYS:
            raise ConfigError(f"{where}.{label(key)}: unknown key")
    merged = {**DEFAULT_POLICY, **table}
    for ch in ("email", "sms"):
        sub = table.get(ch, {})
        if not isinstance(sub, Mapping):
            raise ConfigError(f"{where}.{ch}: expected a table")
        for key in sub:
            if key not in _CHANNEL_KEYS[ch]:
                raise ConfigError(f"{where}.{ch}.{label(key)}: unknown key")
        merged[ch] = {**DEFAULT_POLICY[ch], **sub}

    version = _at_most(
        _positive_int(merged["version"], f"{where}.version"), MAX_VERSION, f"{where}.version"
    )
    raw_channels = merged["channels"]
    if not isinstance(raw_channels, list) or not raw_channels:
        raise ConfigError(f"{where}.channels: expected a non-empty list such as ['email', 'sms']")
    try:
        channels = tuple(Channel(c) for c in raw_channels)
    except ValueError:
        raise ConfigError(f"{where}.channels: each channel must be 'email' or 'sms'") from None
    if len(set(channels)) != len(channels):
        raise ConfigError(f"{where}.channels: a channel may appear once")

    ttl = parse_duration(merged["ttl"], f"{where}.ttl")
    reserve = parse_duration(merged["fallback_reserve"], f"{where}.fallback_reserve")
    send_reserve = parse_duration(merged["send_reserve"], f"{where}.send_reserve")
    max_ttl = parse_duration(merged["max_ttl"], f"{where}.max_ttl")
    if max_ttl > MAX_LIFETIME:
        raise ConfigError(f"{where}.max_ttl: must be at most {format_duration(MAX_LIFETIME)}")
    if ttl > max_ttl:
        raise ConfigError(f"{where}.ttl: must not exceed max_ttl ({format_duration(max_ttl)})")
    if reserve >= ttl:
        raise ConfigError(f"{where}.fallback_reserve: must be shorter than ttl")
    if send_reserve >= ttl:
        raise ConfigError(f"{where}.send_reserve: must be shorter than ttl")
    polls = {
        c: _schedule(merged[str(c)]["poll_delays"], f"{where}.{c}.poll_delays") for c in Channel
    }
    # The primary's polls must end while a fallback can still start; the fallback's polls
    # must fit in the reserve it is sent with; a lone channel's polls must end before expiry.
    primary = channels[0]
    room = ttl - reserve if len(channels) > 1 else ttl
    if polls[primary][-1] >= room:
        limit = "ttl - fallback_reserve" if len(channels) > 1 else "ttl"
        raise ConfigError(
            f"{where}.{primary}.poll_delays: the last poll ({format_duration(polls[primary][-1])})"
            f" cannot fit before expiry ({limit} = {format_duration(room)})"
        )
    for fallback in channels[1:]:
        if polls[fallback][-1] >= reserve:
            raise ConfigError(
                f"{where}.{fallback}.poll_delays: the last poll "
                f"({format_duration(polls[fallback][-1])}) cannot fit in fallback_reserve "
                f"({format_duration(reserve)})"
            )
    retries_raw = merged["retry_delays"]
    retries = () if retries_raw == [] else _schedule(retries_raw, f"{where}.retry_delays")
    try:
        on_spent = OnBudgetSpent(merged["on_poll_budget_spent"])
    except ValueError:
        raise ConfigError(f"{where}.on_poll_budget_spent: must be 'escalate' or 'expire'") from None
    lease = parse_duration(merged["lease"], f"{where}.lease")
    if lease > ttl:
        raise ConfigError(f"{where}.lease: must not exceed ttl ({format_duration(ttl)})")
    batch_size = _at_most(
        _positive_int(merged["batch_size"], f"{where}.batch_size"), MAX_BATCH, f"{where}.batch_size"
    )
    template_version = merged["template_version"]
    if not isinstance(template_version, str) or not _TEMPLATE_VERSION.fullmatch(template_version):
        raise ConfigError(f"{where}.template_version: expected a name such as 'v1'")
    max_segments = _at_most(
        _positive_int(merged["sms"]["max_segments"], f"{where}.sms.max_segments"),
        MAX_SEGMENTS,
        f"{where}.sms.max_segments",
    )
    alert_mode = merged["alert_mode"]
    if alert_mode not in ("observe", "page"):
        raise ConfigError(f"{where}.alert_mode: must be 'observe' or 'page'")
    alert_warning = parse_duration(merged["alert_warning"], f"{where}.alert_warning")
    success = {c: _success(merged[str(c)]["success"], f"{where}.{c}.success") for c in Channel}
    stalled_after = parse_duration(merged["alert_stalled_after"], f"{where}.alert_stalled_after")
    supersede_older = merged["supersede_older"]
    if not isinstance(supersede_older, bool):
        raise ConfigError(f"{where}.supersede_older: must be true or false")
    return Policy(
        name=name,
        version=version,
        channels=channels,
        ttl=ttl,
        fallback_reserve=reserve,
        send_reserve=send_reserve,
        poll_delays=polls,
        retry_delays=retries,
        on_poll_budget_spent=on_spent,
        lease=lease,
        batch_size=batch_size,
        template_version=template_version,
        sms_max_segments=max_segments,
        alert_mode=alert_mode,
        alert_warning=alert_warning,
        success=success,
        alert_stalled_after=stalled_after,
        max_ttl=max_ttl,
        supersede_older=supersede_older,
    )


_HOST_PATTERN = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9-]{1,63}")


def _url_hosts(value: object) -> tuple[str, ...]:
    """``reset_url_hosts``: lower-case host names, ``*.`` before one for its subdomains."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError('reset_url_hosts: expected a list of hosts, e.g. ["shop.example"]')
    hosts = tuple(v.strip().lower().rstrip(".") for v in value)
    for host in hosts:
        if not _HOST_PATTERN.fullmatch(host):
            raise ConfigError(f"reset_url_hosts: {label(host)} is not a host name")
    return hosts


def _success(value: object, where: str) -> frozenset[str]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v in SUCCESS_STATUSES for v in value)
    ):
        raise ConfigError(f"{where}: expected a non-empty list of 'accepted' and/or 'delivered'")
    return frozenset(value)


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """One transport's share of a sweep (``[<transport>] max_in_flight``, ``max_rate``)."""

    #: calls in flight at once on this transport (None: the sweep's concurrency)
    max_in_flight: int | None = None
    #: calls per second, at most, in any second (None: no limit)
    max_rate: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a command needs besides the database path and the clock."""

    #: policies by `[policy.<name>]`; "default" always exists
    policies: Mapping[str, Policy]
    #: transport name per channel
    transports: Mapping[Channel, str] = field(
        default_factory=lambda: {Channel.EMAIL: "outbox", Channel.SMS: "outbox"}
    )
    #: each transport's own table (``[outbox]``, ``[smtp]``, ``[twilio]`` …), validated
    #: by the transport itself when it is built (its lane keys taken out)
    transport_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: each transport's lane limits, by transport name
    lane_limits: Mapping[str, LaneLimits] = field(default_factory=dict)
    #: provider calls one sweep makes at once (``[sweep] concurrency``)
    concurrency: int = DEFAULT_CONCURRENCY
    #: who the reset copy says to contact
    support_label: str = "Support"
    #: a region with no ``[policy.<region>]`` table: "refuse" it at enqueue, or send it
    #: under ``[policy.default]`` ("default")
    unknown_region: str = "refuse"
    #: the hosts a reset URL may point at (``shop.example``, ``*.shop.example`` for its
    #: subdomains); empty: any https host
    reset_url_hosts: tuple[str, ...] = ()
    #: the database named in the file, if any (`--db` and RESETCTL_DB win)
    db: str | None = None
    #: ``[privacy] hash_key_file``: the key of recipient hashes (RESETCTL_HASH_KEY wins);
    #: relative to the config file's directory
    hash_key_file: str | None = None
    #: the operator's templates directory (`[templates] dir`); None: the built-ins
    templates_dir: str | None = None
    #: where the settings came from, for messages
    source: str = "built-in defaults"
    #: the config file read, if any (the hash key file defaults to its directory)
    config_path: str | None = None

    def policy_for(self, region: str) -> Policy | None:
        """The region's own policy; for a region without one, ``[policy.default]`` when
        ``unknown_region = "default"``, else None (enqueue refuses it)."""
        policy = self.policies.get(region)
        if policy is None and self.unknown_region == "default":
            return self.policies["default"]
        return policy

    @property
    def default_policy(self) -> Policy:
        """``[policy.default]``: sweep-wide settings (lease, batch size) come from here."""
        return self.policies["default"]


def _known_transport(name: str) -> bool:
    if name in BUILT_IN_TRANSPORTS:
        return True
    from importlib.metadata import entry_points

    return bool(entry_points(group="resetctl.transports", name=name))


def _lane_limits(name: str, table: Mapping[str, Any]) -> LaneLimits:
    """A transport table's lane keys, checked."""
    cap = table.get("max_in_flight")
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CONCURRENCY
    ):
        raise ConfigError(
            f"{name}.max_in_flight: expected a whole number from 1 to {MAX_CONCURRENCY}"
        )
    rate = table.get("max_rate")
    if rate is not None and (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not 0 < rate <= MAX_RATE
        or rate != rate
    ):
        raise ConfigError(
            f"{name}.max_rate: expected calls per second, above 0 and at most {MAX_RATE:g}"
        )
    return LaneLimits(cap, None if rate is None else float(rate))


def _concurrency(table: object) -> int:
    """``[sweep] concurrency``, checked."""
    if not isinstance(table, Mapping):
        raise ConfigError("sweep: expected a table such as [sweep]")
    for key in table:
        if key != "concurrency":
            raise ConfigError(f"sweep.{label(key)}: unknown key")
    value = table.get("concurrency", DEFAULT_CONCURRENCY)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise ConfigError(f"sweep.concurrency: expected a whole number from 1 to {MAX_CONCURRENCY}")
    return value


def settings_from_mapping(data: Mapping[str, Any], source: str = "config") -> Settings:
    """Validate a parsed TOML document."""
    raw_transport = data.get("transport", {})
    if not isinstance(raw_transport, Mapping):
        raise ConfigError("transport: expected a table")
    transports = {Channel.EMAIL: "outbox", Channel.SMS: "outbox"}
    for key, value in raw_transport.items():
        if key not in ("email", "sms"):
            raise ConfigError(f"transport.{label(key)}: unknown key")
        if not isinstance(value, str) or not _known_transport(value):
            raise ConfigError(f"transport.{key}: unknown transport {value!r}")
        transports[Channel(key)] = value
    transport_names = BUILT_IN_TRANSPORTS | set(transports.values())
    for key in data:
        if key not in _TOP_KEYS and key not in transport_names:
            raise ConfigError(f"{label(key)}: unknown key")
    transport_options: dict[str, dict[str, Any]] = {}
    lane_limits: dict[str, LaneLimits] = {}
    for name in transport_names:
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{label(name)}: expected a table")
        transport_options[name] = {k: v for k, v in table.items() if k not in LANE_KEYS}
        lane_limits[name] = _lane_limits(name, table)
    concurrency = _concurrency(data.get("sweep", {}))

    raw_policies = data.get("policy", {})
    if not isinstance(raw_policies, Mapping):
        raise ConfigError("policy: expected tables such as [policy.default]")
    policies: dict[str, Policy] = {}
    for name, table in raw_policies.items():
        if not isinstance(table, Mapping):
            raise ConfigError(f"policy.{label(name)}: expected a table")
        policies[name] = build_policy(name, table)
    if "default" not in policies:
        policies["default"] = build_policy("default", {})

    for key, value in transport_options["outbox"].items():
        if key == "keep_content":
            if not isinstance(value, bool):
                raise ConfigError("outbox.keep_content: expected true or false")
            continue
        if key == "latency":
            parse_duration(value, "outbox.latency")
            continue
        if key not in ("email_status", "sms_status"):
            raise ConfigError(f"outbox.{label(key)}: unknown key")
        if not isinstance(value, str) or value not in _OUTBOX_STATUSES:
            raise ConfigError(f"outbox.{key}: must be one of {', '.join(sorted(_OUTBOX_STATUSES))}")

    support_label = data.get("support_label", "Support")
    if not isinstance(support_label, str) or not support_label.strip():
        raise ConfigError("support_label: expected a non-empty string")
    unknown_region = data.get("unknown_region", "refuse")
    if not isinstance(unknown_region, str) or unknown_region not in UNKNOWN_REGION_CHOICES:
        raise ConfigError(
            'unknown_region: must be "refuse" or "default" (use [policy.default] for a region'
            " without its own table)"
        )
    reset_url_hosts = _url_hosts(data.get("reset_url_hosts", []))
    db = data.get("db")
    if db is not None and not isinstance(db, str):
        raise ConfigError("db: expected a path")
    hash_key_file = _hash_key_file(data)
    for name, table in transport_options.items():
        _require_tls(name, table.get("base_url"))
    templates = data.get("templates", {})
    if not isinstance(templates, Mapping):
        raise ConfigError("templates: expected a table such as [templates]")
    for key in templates:
        if key != "dir":
            raise ConfigError(f"templates.{label(key)}: unknown key")
    templates_dir = templates.get("dir")
    if templates_dir is not None and (not isinstance(templates_dir, str) or not templates_dir):
        raise ConfigError("templates.dir: expected a directory path")
    return Settings(
        policies=policies,
        transports=transports,
        transport_options=transport_options,
        lane_limits=lane_limits,
        concurrency=concurrency,
        support_label=support_label,
        unknown_region=unknown_region,
        reset_url_hosts=reset_url_hosts,
        db=db,
        hash_key_file=hash_key_file,
        templates_dir=templates_dir,
        source=source,
    )


def _hash_key_file(data: Mapping[str, Any]) -> str | None:
    """``[privacy] hash_key_file``, or the older top-level ``hash_key_file`` (same meaning)."""
    privacy = data.get("privacy", {})
    if not isinstance(privacy, Mapping):
        raise ConfigError("privacy: expected a table")
    for key in privacy:
        if key not in _PRIVACY_KEYS:
            raise ConfigError(f"privacy.{label(key)}: unknown key")
    value = privacy.get("hash_key_file")
    where = "privacy.hash_key_file"
    if "hash_key_file" in data:
        if "hash_key_file" in privacy:
            raise ConfigError("hash_key_file: moved to [privacy] hash_key_file; give only that")
        value, where = data["hash_key_file"], "hash_key_file"
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"{where}: expected a path")
    return value


def loopback_host(host: str) -> bool:
    """True for a host that stays on this machine (``localhost``, 127.0.0.0/8, ``::1``),
    as a URL parser gives it or an operator writes it (IPv6 brackets optional): the one
    place cleartext may go (a provider stand-in, a local relay)."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _require_tls(transport: str, base_url: object) -> None:
    """Credentials travel in every request to a base_url: refuse cleartext http://
    unless it stays on this machine, judged by the host httpx parses, which is the host
    it connects to (``http://evil.example#@127.0.0.1`` goes to evil.example)."""
    if not isinstance(base_url, str):
        return
    import httpx  # here: most commands never read a base_url

    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        raise ConfigError(f"{label(transport)}.base_url: not a valid URL") from None
    if url.scheme == "http" and not loopback_host(url.host):
        raise ConfigError(
            f"{label(transport)}.base_url: must be https:// (credentials travel with every"
            " request); http:// only for a loopback host"
        )


def load_toml(path: Path) -> dict[str, Any]:
    """A config file's TOML document, unvalidated."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: {exc}") from None


def load_settings(path: Path | None) -> Settings:
    """Settings from a TOML file, or the built-in defaults when ``path`` is None.

    A value the file gets wrong is a ConfigError naming the file, the line where it
    can be found, and the key: ``config resetctl.toml, line 7: policy.eu.lease: …``.
    """
    if path is None:
        return settings_from_mapping({}, "built-in defaults")
    document = load_toml(path)
    try:
        settings = settings_from_mapping(document, str(path))
    except ConfigError as exc:
        line = _line_of(path, str(exc).split(": ", 1)[0])
        where = f"config {path}" if line is None else f"config {path}, line {line}"
        raise ConfigError(f"{where}: {exc}") from None
    return dataclasses.replace(settings, config_path=str(path))


_TABLE_LINE = re.compile(r"\s*\[\[?([^\[\]]+)\]\]?\s*(?:#.*)?")
_KEY_LINE = re.compile(r"\s*([\w\-.\"' ]+?)\s*=")


def _dotted(key: str) -> list[str]:
    return [part.strip().strip("\"'") for part in key.split(".")]


def _line_of(path: Path, key: str) -> int | None:
    """The line of the TOML file that sets ``key`` (``policy.eu.email.poll_delays[1]``),
    else of the table that holds it; None when neither is found. A best effort, for
    messages: the parsed document no longer knows its lines."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    wanted = _dotted(re.sub(r"\[\d+\]", "", key))
    best: tuple[int, int] | None = None  # (parts of the key matched, line)
    table: list[str] = []
    for number, text in enumerate(lines, start=1):
        header = _TABLE_LINE.fullmatch(text)
        if header:
            table = found = _dotted(header[1])
        elif assignment := _KEY_LINE.match(text):
            found = table + _dotted(assignment[1])
        else:
            continue
        if wanted[: len(found)] == found and (best is None or len(found) > best[0]):
            best = (len(found), number)
    return None if best is None else best[1]


def _override_value(text: str) -> object:
    items = [item.strip() for item in text.split(",")]
    values: list[object] = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            try:
                values.append(float(item))
            except ValueError:
                values.append(item)
    return values if "," in text else values[0]


def with_overrides(data: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with ``key=value`` overrides applied to every ``[policy.*]`` table.

    ``email.poll_delays=10,30,90`` sets a channel key (a comma makes a list);
    ``on_poll_budget_spent=expire`` a policy key. Validation happens as for a file.
    """
    policies = {name: dict(table) for name, table in data.get("policy", {}).items()}
    policies.setdefault("default", {})
    for override in overrides:
        key, sep, value = override.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path) or len(path) > 2:
            raise ConfigError(f"--set {override!r}: expected key=value, e.g. ttl=10m")
        for table in policies.values():
            target = table
            if len(path) == 2:
                target = table.setdefault(path[0], {})
                if not isinstance(target, dict):
                    raise ConfigError(f"--set {override!r}: {path[0]} is not a table")
                target = table[path[0]] = dict(target)
            target[path[-1]] = _override_value(value.strip())
    return {**data, "policy": policies}
