"""Versioned delivery policies: the frozen record per region, its built-in defaults, and
the validation of a ``[policy.<name>]`` table.

A policy is resolved once per notice at enqueue and stored by (name, version), so a
config change never rewrites a notice in flight. Every error names the offending key
(``policy.eu.fallback_reserve: …``). Nothing here touches the database.
"""

from __future__ import annotations

import enum
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from resetctl.durations import format_duration, parse_duration
from resetctl.errors import UNSHOWABLE, ConfigError, label


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


_TEMPLATE_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class OnRefusal(enum.StrEnum):
    """What enqueue does with a notice when a policy rule rules a channel out."""

    #: refuse the notice (that line of the enqueue; the others go on)
    REFUSE = "refuse"
    #: go on without that channel (by the channels left)
    SKIP = "skip"


class OnNoChannel(enum.StrEnum):
    """What enqueue does with a notice whose every channel was ruled out."""

    #: refuse it: that line answers ``refused`` and nothing is stored for it
    REFUSE = "refuse"
    #: store it as ``failed`` (reason ``no_channel``), so the request and why it went
    #: nowhere stay on record under its idempotency key
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Sender:
    """Who a region's messages come from; None: the transport's own setting."""

    #: the email From address (``reset@eu.shop.example``)
    email_from: str | None = None
    #: the From display name (``Shop EU``)
    email_from_name: str | None = None
    #: the Reply-To address
    email_reply_to: str | None = None
    #: the SMS sender: an E.164 number or a Twilio Messaging Service SID (``MG…``)
    sms_from: str | None = None

    def for_channel(self, channel: str) -> dict[str, str]:
        """The settings that apply to ``channel``'s messages (not secrets: shown by
        inspect)."""
        if channel == Channel.SMS:
            return {} if self.sms_from is None else {"from": self.sms_from}
        shown = {"from": self.email_from, "from_name": self.email_from_name}
        shown["reply_to"] = self.email_reply_to
        return {k: v for k, v in shown.items() if v is not None}

    def to_record(self) -> dict[str, str]:
        """The set fields only (a record stored before senders were policy has none)."""
        fields = {
            "email_from": self.email_from,
            "email_from_name": self.email_from_name,
            "email_reply_to": self.email_reply_to,
            "sms_from": self.sms_from,
        }
        return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Limits:
    """A region's abuse limits, counted in the database (so every process and host
    agrees). None: no limit."""

    #: notices at most per recipient (by keyed recipient hash) in any window
    per_recipient: int | None = None
    #: that window, seconds
    per_recipient_window: float = 3600.0
    #: SMS submissions at most per destination country in any hour
    sms_per_country_per_hour: int | None = None

    def to_record(self) -> dict[str, Any]:
        """JSON-able; every field."""
        return {
            "per_recipient": self.per_recipient,
            "per_recipient_window": self.per_recipient_window,
            "sms_per_country_per_hour": self.sms_per_country_per_hour,
        }


#: libphonenumber's number types, as a policy names them (``sms.number_types``).
NUMBER_TYPES = (
    "fixed_line",
    "mobile",
    "fixed_line_or_mobile",
    "toll_free",
    "premium_rate",
    "shared_cost",
    "voip",
    "personal_number",
    "pager",
    "uan",
    "voicemail",
    "unknown",
)
#: The types an SMS may go to unless a policy says otherwise: a handset. (Premium-rate
#: and shared-cost numbers are how SMS pumping bills a marketplace.)
DEFAULT_NUMBER_TYPES = frozenset({"mobile", "fixed_line_or_mobile"})


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
    #: who messages come from (resolved with the version: a later change never
    #: rewrites a notice in flight)
    sender: Sender = Sender()
    #: channels used only when the enqueue's ``consent`` names them
    requires_consent: frozenset[Channel] = frozenset()
    #: ISO 3166 codes an SMS may go to (None: any country)
    sms_countries: frozenset[str] | None = None
    #: libphonenumber number types an SMS may go to
    sms_number_types: frozenset[str] = DEFAULT_NUMBER_TYPES
    #: a destination the rules above refuse: refuse the notice, or skip that channel
    on_refused_destination: OnRefusal = OnRefusal.REFUSE
    #: every channel ruled out (consent, destination): refuse, or store it as failed
    on_no_channel: OnNoChannel = OnNoChannel.REFUSE
    #: abuse limits
    limits: Limits = Limits()
    #: how long a finished notice's row is kept (None: what ``purge`` is told)
    retention: float | None = None
    #: per channel, the provider instances this policy's messages go through, in order
    #: (``[policy.<name>.<channel>] providers``); a channel absent uses ``[transport]``'s
    providers: Mapping[Channel, tuple[str, ...]] = field(default_factory=dict)
    #: an attempt in doubt on an instance that is out of use may be sent on the next
    #: healthy one before its doubt is resolved: more reach, and a possible second message
    failover_on_doubt: bool = False

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
            "sender": self.sender.to_record(),
            "requires_consent": sorted(str(c) for c in self.requires_consent),
            "sms_countries": None if self.sms_countries is None else sorted(self.sms_countries),
            "sms_number_types": sorted(self.sms_number_types),
            "on_refused_destination": str(self.on_refused_destination),
            "on_no_channel": str(self.on_no_channel),
            "limits": self.limits.to_record(),
            "retention": self.retention,
            "providers": {str(c): list(n) for c, n in sorted(self.providers.items())},
            "failover_on_doubt": self.failover_on_doubt,
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
            # Records stored before these were policy data take the defaults: what
            # resetctl did then.
            sender=Sender(**record.get("sender", {})),
            requires_consent=frozenset(Channel(c) for c in record.get("requires_consent", ())),
            sms_countries=None
            if record.get("sms_countries") is None
            else frozenset(record["sms_countries"]),
            sms_number_types=frozenset(record.get("sms_number_types", DEFAULT_NUMBER_TYPES)),
            on_refused_destination=OnRefusal(record.get("on_refused_destination", "refuse")),
            on_no_channel=OnNoChannel(record.get("on_no_channel", "refuse")),
            limits=Limits(**record.get("limits", {})),
            retention=None if record.get("retention") is None else float(record["retention"]),
            providers={
                Channel(c): tuple(str(x) for x in n) for c, n in record.get("providers", {}).items()
            },
            failover_on_doubt=bool(record.get("failover_on_doubt", False)),
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

#: Keys with no built-in value (absent: no such rule).
_OPTIONAL_KEYS = frozenset(
    {"retention", "on_refused_destination", "on_no_channel", "limits", "failover_on_doubt"}
)
_POLICY_KEYS = frozenset(DEFAULT_POLICY) | _OPTIONAL_KEYS
_CHANNEL_KEYS = {
    "email": frozenset(
        {"poll_delays", "success", "from", "reply_to", "requires_consent", "providers"}
    ),
    "sms": frozenset(
        {
            "poll_delays",
            "max_segments",
            "success",
            "from",
            "requires_consent",
            "allowed_countries",
            "number_types",
            "providers",
        }
    ),
}
_LIMIT_KEYS = frozenset({"per_recipient", "per_recipient_window", "sms_per_country_per_hour"})
#: Upper bounds of the rules (past them a value is a mistake).
MAX_PER_RECIPIENT = 1000
MAX_COUNTRY_CAP = 1_000_000
MAX_RETENTION = 3660 * 86400.0
#: How long ``purge`` keeps a day's aggregate counts unless told: 400 days, so a health
#: window over the same weeks a year ago still reads them.
AGGREGATES_RETENTION = 400 * 86400.0
#: Aggregates are counted and kept by whole UTC days: less than one keeps nothing.
MIN_AGGREGATES_RETENTION = 86400.0
_MESSAGING_SERVICE = re.compile(r"MG[0-9a-f]{32}")


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
    sms = merged["sms"]
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
        sender=_sender(merged["email"], sms, where),
        requires_consent=frozenset(
            c for c in Channel if _flag(merged[str(c)], "requires_consent", f"{where}.{c}")
        ),
        sms_countries=_countries(sms.get("allowed_countries"), f"{where}.sms.allowed_countries"),
        sms_number_types=_number_types(sms.get("number_types"), f"{where}.sms.number_types"),
        on_refused_destination=_choice(
            OnRefusal,
            merged.get("on_refused_destination", "refuse"),
            f"{where}.on_refused_destination",
        ),
        on_no_channel=_choice(
            OnNoChannel, merged.get("on_no_channel", "refuse"), f"{where}.on_no_channel"
        ),
        limits=_limits(merged.get("limits", {}), f"{where}.limits"),
        retention=_retention(merged.get("retention"), f"{where}.retention"),
        providers=_providers(table, where),
        failover_on_doubt=_flag(merged, "failover_on_doubt", where),
    )


def _providers(table: Mapping[str, Any], where: str) -> dict[Channel, tuple[str, ...]]:
    """``[policy.<name>.<channel>] providers``: lists of instance names (that each is
    configured is checked with the instances, in :mod:`resetctl.config`)."""
    found: dict[Channel, tuple[str, ...]] = {}
    for channel in Channel:
        sub = table.get(str(channel), {})
        if "providers" not in sub:
            continue
        value = sub["providers"]
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"{where}.{channel}.providers: expected a list of provider instance names"
            )
        found[channel] = tuple(names)
    return found


def _flag(table: Mapping[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: must be true or false")
    return value


_Choice = TypeVar("_Choice", OnRefusal, OnNoChannel)


def _choice(kind: type[_Choice], value: object, where: str) -> _Choice:
    names = {str(member): member for member in kind}
    if not isinstance(value, str) or value not in names:
        raise ConfigError(f"{where}: must be {' or '.join(repr(n) for n in names)}")
    return names[value]


def _address(value: object, where: str) -> tuple[str, str | None]:
    """An address and its display name, from ``"Shop <reset@shop.example>"``,
    ``"reset@shop.example"`` or ``{ address = "…", name = "…" }``: one address, no
    control character or line break anywhere (a header is built from it)."""
    import email_validator

    if isinstance(value, Mapping):
        unknown = set(value) - {"address", "name"}
        if unknown:
            raise ConfigError(f"{where}.{label(sorted(unknown)[0])}: unknown key")
        address, name = value.get("address"), value.get("name")
    elif isinstance(value, str) and not UNSHOWABLE.search(value):
        mailbox = _one_mailbox(value)
        if mailbox is None:
            raise ConfigError(f"{where}: expected an address such as 'Shop <reset@shop.example>'")
        address, name = mailbox
    else:
        raise ConfigError(f"{where}: expected an address such as 'Shop <reset@shop.example>'")
    if not isinstance(address, str) or "=?" in address or UNSHOWABLE.search(address):
        raise ConfigError(f"{where}: not a valid email address")
    try:
        email_validator.validate_email(address, check_deliverability=False)
    except email_validator.EmailNotValidError:
        raise ConfigError(f"{where}: not a valid email address") from None
    if name is not None and (
        not isinstance(name, str) or not name.strip() or len(name) > 100 or UNSHOWABLE.search(name)
    ):
        raise ConfigError(
            f"{where}: the display name must be text of at most 100 characters, on one line"
        )
    return address, name


def _one_mailbox(value: str) -> tuple[str, str | None] | None:
    """(address, display name or None) of a string that is exactly one mailbox, read as
    the email package reads a From header; None for anything else: several addresses, a
    group, or any defect (``a@b.example)<c@d.example>``, an unclosed ``<``).

    Not ``parseaddr(value, strict=True)``: CPython before 3.11.10 and 3.12.6 has no
    strict mode (a TypeError), and without it parseaddr reads the first of several
    addresses, or a half of one, without a word (CVE-2023-27043).
    """
    from email.policy import default

    try:
        header = default.header_factory("from", value)
        groups = header.groups
    except Exception:  # the parser's own bugs on odd input: not an address either
        return None
    if header.defects or len(groups) != 1 or groups[0].display_name is not None:
        return None
    (found,) = groups[0].addresses or (None,)
    if found is None or not found.addr_spec:
        return None
    return found.addr_spec, found.display_name or None


def _sender(email: Mapping[str, Any], sms: Mapping[str, Any], where: str) -> Sender:
    email_from = name = reply_to = sms_from = None
    if "from" in email:
        email_from, name = _address(email["from"], f"{where}.email.from")
    if "reply_to" in email:
        reply_to, reply_name = _address(email["reply_to"], f"{where}.email.reply_to")
        if reply_name is not None:
            raise ConfigError(f"{where}.email.reply_to: give the address only")
    if "from" in sms:
        sms_from = sms["from"]
        if not isinstance(sms_from, str) or not (
            _MESSAGING_SERVICE.fullmatch(sms_from) or _e164(sms_from)
        ):
            raise ConfigError(
                f"{where}.sms.from: expected an E.164 number (+14155550100) or a Twilio"
                " Messaging Service SID (MG followed by 32 hex digits)"
            )
    return Sender(email_from, name, reply_to, sms_from)


def _e164(value: str) -> bool:
    import phonenumbers

    try:
        number = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException:
        return False
    return value == phonenumbers.format_number(
        number, phonenumbers.PhoneNumberFormat.E164
    ) and phonenumbers.is_valid_number(number)


def _countries(value: object, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    import phonenumbers

    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}: expected a non-empty list of ISO 3166 codes, e.g. ["DE"]')
    for code in value:
        if code not in phonenumbers.SUPPORTED_REGIONS:
            raise ConfigError(f"{where}: {label(code)} is not an ISO 3166 code phonenumbers knows")
    return frozenset(value)


def _number_types(value: object, where: str) -> frozenset[str]:
    if value is None:
        return DEFAULT_NUMBER_TYPES
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}: expected a non-empty list such as ["mobile"]')
    for kind in value:
        if kind not in NUMBER_TYPES:
            raise ConfigError(f"{where}: {label(kind)} is not one of {', '.join(NUMBER_TYPES)}")
    return frozenset(value)


def _limits(table: object, where: str) -> Limits:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table")
    for key in table:
        if key not in _LIMIT_KEYS:
            raise ConfigError(f"{where}.{label(key)}: unknown key")
    per_recipient = table.get("per_recipient")
    if per_recipient is not None:
        per_recipient = _at_most(
            _positive_int(per_recipient, f"{where}.per_recipient"),
            MAX_PER_RECIPIENT,
            f"{where}.per_recipient",
        )
    window = 3600.0
    if "per_recipient_window" in table:
        window = parse_duration(table["per_recipient_window"], f"{where}.per_recipient_window")
        if window > MAX_LIFETIME:
            raise ConfigError(
                f"{where}.per_recipient_window: must be at most {format_duration(MAX_LIFETIME)}"
            )
    cap = table.get("sms_per_country_per_hour")
    if cap is not None:
        cap = _at_most(
            _positive_int(cap, f"{where}.sms_per_country_per_hour"),
            MAX_COUNTRY_CAP,
            f"{where}.sms_per_country_per_hour",
        )
    return Limits(per_recipient, window, cap)


def _retention(value: object, where: str) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value, where)
    if seconds > MAX_RETENTION:
        raise ConfigError(f"{where}: must be at most {format_duration(MAX_RETENTION)}")
    return seconds


def aggregates_retention(value: object, where: str) -> float:
    """Seconds from how long ``purge`` keeps the daily aggregates (a duration from 1d to
    MAX_RETENTION); a ConfigError naming ``where`` otherwise."""
    seconds = parse_duration(value, where)
    if seconds < MIN_AGGREGATES_RETENTION:
        raise ConfigError(f"{where}: must be at least 1d (aggregates are kept by whole days)")
    if seconds > MAX_RETENTION:
        raise ConfigError(f"{where}: must be at most {MAX_RETENTION / 86400:g}d")
    return seconds


def _success(value: object, where: str) -> frozenset[str]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v in SUCCESS_STATUSES for v in value)
    ):
        raise ConfigError(f"{where}: expected a non-empty list of 'accepted' and/or 'delivered'")
    return frozenset(value)
