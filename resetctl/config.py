"""Settings read from TOML and validated: transports, lanes, privacy, templates, and the
policies (:mod:`resetctl.policy`) by region.

Every error names the offending key (``policy.eu.fallback_reserve: …``) so an operator
can fix a file without reading code. Nothing here touches the database.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resetctl.durations import parse_duration
from resetctl.errors import ConfigError, label
from resetctl.instances import (
    Failover,
    Instance,
    chain_of,
    check_policy_chains,
    failover_settings,
    provider_tables,
)
from resetctl.policy import Channel, Policy, build_policy

_TOP_KEYS = frozenset(
    {
        "db",
        "support_label",
        "unknown_region",
        "reset_url_hosts",
        "policy",
        "telemetry",
        "transport",
        "privacy",
        "hash_key_file",
        "templates",
        "sweep",
        "rollout",
        "serve",
        "providers",
        "failover",
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
BUILT_IN_TRANSPORTS = frozenset({"outbox", "smtp", "postmark", "twilio", "mailgun", "plivo"})
_OUTBOX_STATUSES = frozenset({"pending", "accepted", "delivered", "failed", "unknown"})


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


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """One transport's share of a sweep (``[<transport>] max_in_flight``, ``max_rate``)."""

    #: calls in flight at once on this transport (None: the sweep's concurrency)
    max_in_flight: int | None = None
    #: calls per second, at most, in any second (None: no limit)
    max_rate: float | None = None


class RolloutMode(enum.StrEnum):
    """``[rollout] mode``: whether new notices are sent, fixed on each at enqueue."""

    #: new notices are delivered (the default)
    LIVE = "live"
    #: new notices run everything but the provider call (claims, decisions, limits,
    #: rendering) and end ``cancelled`` (``shadow``): the application's own path sends them
    SHADOW = "shadow"


@dataclass(frozen=True, slots=True)
class Rollout:
    """``[rollout]``: how much of the application's traffic resetctl takes, and whether it
    sends it (README, "Roll out: shadow, a slice, then all")."""

    #: new notices live or in shadow
    mode: RolloutMode = RolloutMode.LIVE
    #: the share of new idempotency keys taken, from 0 to 100; the rest are answered
    #: ``"in_slice": false`` and stored as no notice
    percent: float = 100.0


def _rollout(table: object) -> Rollout:
    """``[rollout]``, checked."""
    if not isinstance(table, Mapping):
        raise ConfigError("rollout: expected a table such as [rollout]")
    for key in table:
        if key not in ("mode", "percent"):
            raise ConfigError(f"rollout.{label(key)}: unknown key")
    mode = table.get("mode", RolloutMode.LIVE.value)
    if not isinstance(mode, str) or mode not in tuple(RolloutMode):
        raise ConfigError('rollout.mode: must be "live" or "shadow"')
    percent = table.get("percent", 100)
    if (
        isinstance(percent, bool)
        or not isinstance(percent, int | float)
        or not math.isfinite(percent)
        or not 0 <= percent <= 100
    ):
        raise ConfigError(
            "rollout.percent: expected a number from 0 to 100 (the share of new"
            " idempotency keys resetctl takes)"
        )
    return Rollout(RolloutMode(mode), float(percent))


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a command needs besides the database path and the clock."""

    #: policies by `[policy.<name>]`; "default" always exists
    policies: Mapping[str, Policy]
    #: the first provider instance of each channel (the one-name form's transport)
    transports: Mapping[Channel, str] = field(
        default_factory=lambda: {Channel.EMAIL: "outbox", Channel.SMS: "outbox"}
    )
    #: each instance's own table (``[outbox]``, ``[twilio]``, ``[providers.twilio_eu]``
    #: …) by instance name, validated by its transport when it is built (its lane keys
    #: and ``kind`` taken out)
    transport_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: each instance's lane limits, by instance name
    lane_limits: Mapping[str, LaneLimits] = field(default_factory=dict)
    #: every configured provider instance, by name (a top-level table's is its kind)
    instances: Mapping[str, Instance] = field(default_factory=dict)
    #: each channel's instances in order (``[transport]``): a new attempt goes to the
    #: first healthy one
    chains: Mapping[Channel, tuple[str, ...]] = field(default_factory=dict)
    #: ``[failover]``: when an instance is taken out of use, and for how long
    failover: Failover = field(default_factory=Failover)
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
    #: ``[rollout]``: shadow mode and the traffic slice
    rollout: Rollout = Rollout()
    #: ``[serve] tokens_file`` (relative to the config file) and ``public``: the bearer
    #: tokens of ``resetctl serve``, and the paths it serves without one
    serve_tokens_file: str | None = None
    serve_public: tuple[str, ...] = ()
    #: where the settings came from, for messages
    source: str = "built-in defaults"
    #: the config file read, if any (the hash key file defaults to its directory)
    config_path: str | None = None
    #: ``[telemetry] sample_success``: the share of notices whose routine log lines are
    #: written (by a hash of the notice id); failures, expiries, escalations, lost races
    #: and doubts are always written, and events in the database are never sampled
    sample_success: float = 1.0

    def chain(self, channel: str, policy: Policy | None = None) -> tuple[str, ...]:
        """The instances ``channel`` goes through, in order: the policy's own list when
        it names one, else ``[transport]``'s."""
        ch = Channel(channel)
        if policy is not None and policy.providers.get(ch):
            return policy.providers[ch]
        return self.chains.get(ch) or (self.transports[ch],)

    def provider_chains(self) -> dict[str, tuple[str, ...]]:
        """Each channel's instances, and each policy's own lists (``<policy>.<channel>``):
        what health, the metrics and the no-healthy-provider alert read."""
        chains: dict[str, tuple[str, ...]] = {str(c): self.chain(c) for c in Channel}
        for name, policy in sorted(self.policies.items()):
            for channel, own in sorted(policy.providers.items()):
                chains[f"{name}.{channel}"] = own
        return chains

    def instances_for(self, channel: str) -> list[str]:
        """Every instance ``channel`` names, in ``[transport]`` or a policy's own list:
        ``[transport]``'s first, in order."""
        named = list(self.chain(channel))
        for policy in self.policies.values():
            named += [n for n in policy.providers.get(Channel(channel), ()) if n not in named]
        return named

    def used_instances(self) -> list[str]:
        """Every instance a channel names, in ``[transport]`` or a policy's own list."""
        return list(dict.fromkeys(n for c in Channel for n in self.instances_for(c)))

    def kind_of(self, instance: str) -> str:
        """The transport kind of ``instance`` (a name never configured is its own kind:
        attempts recorded before instances existed name the transport)."""
        found = self.instances.get(instance)
        return instance if found is None else found.kind

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


def _names(value: object) -> list[object]:
    """A ``[transport]`` value as a list (one name, or several)."""
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, list) else []


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


def _sample_success(table: object) -> float:
    """``[telemetry] sample_success``, checked: a share from 0 to 1 (1: keep every line)."""
    if not isinstance(table, Mapping):
        raise ConfigError("telemetry: expected a table such as [telemetry]")
    for key in table:
        if key != "sample_success":
            raise ConfigError(f"telemetry.{label(key)}: unknown key")
    value = table.get("sample_success", 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError("telemetry.sample_success: expected a share from 0 to 1, such as 0.1")
    return float(value)


def _check_outbox(where: str, options: Mapping[str, Any]) -> None:
    """An outbox instance's keys, checked (its statuses must be the machine's words)."""
    for key, value in options.items():
        if key == "keep_content":
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.keep_content: expected true or false")
            continue
        if key == "latency":
            parse_duration(value, f"{where}.latency")
            continue
        if key not in ("email_status", "sms_status"):
            raise ConfigError(f"{where}.{label(key)}: unknown key")
        if not isinstance(value, str) or value not in _OUTBOX_STATUSES:
            raise ConfigError(
                f"{where}.{key}: must be one of {', '.join(sorted(_OUTBOX_STATUSES))}"
            )


def check_sweep_bounds(
    batch_size: int | None, lease: float | None, concurrency: int | None
) -> None:
    """ConfigError for a sweep option given as 0 or less: no lease, no batch and no call
    in flight would each be a sweep that can do nothing, never the default."""
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise ConfigError("batch_size: must be a positive whole number")
    if lease is not None and not (math.isfinite(lease) and lease > 0):
        raise ConfigError("lease: must be a positive duration")
    if concurrency is not None and not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ConfigError(f"concurrency: expected a whole number from 1 to {MAX_CONCURRENCY}")


def settings_from_mapping(data: Mapping[str, Any], source: str = "config") -> Settings:
    """Validate a parsed TOML document."""
    providers = provider_tables(data.get("providers", {}), _known_transport)
    raw_transport = data.get("transport", {})
    if not isinstance(raw_transport, Mapping):
        raise ConfigError("transport: expected a table")
    # The one-name form: a built-in (or installed) transport's top-level table is an
    # instance of that kind under its own name.
    named = {
        name
        for value in raw_transport.values()
        for name in (
            [value] if isinstance(value, str) else value if isinstance(value, list) else []
        )
        if isinstance(name, str) and name not in providers and _known_transport(name)
    }
    top_level = BUILT_IN_TRANSPORTS | named
    for name in providers:
        if name in top_level and name in data:
            raise ConfigError(
                f"providers.{name}: {name} is also a top-level [{name}] table; give one of them"
            )
    instances: dict[str, Instance] = {
        name: Instance(name, name, name) for name in top_level if name not in providers
    }
    instances.update({name: instance for name, (instance, _) in providers.items()})
    chains: dict[Channel, tuple[str, ...]] = {Channel.EMAIL: ("outbox",), Channel.SMS: ("outbox",)}
    for key, value in raw_transport.items():
        if key not in ("email", "sms"):
            raise ConfigError(f"transport.{label(key)}: unknown key")
        if isinstance(value, str) and value not in instances:
            raise ConfigError(f"transport.{key}: unknown transport {value!r}")
        chains[Channel(key)] = chain_of(value, f"transport.{key}", instances)
    transports = {channel: chain[0] for channel, chain in chains.items()}
    for key in data:
        if key not in _TOP_KEYS and key not in top_level:
            raise ConfigError(f"{label(key)}: unknown key")
    transport_options: dict[str, dict[str, Any]] = {}
    lane_limits: dict[str, LaneLimits] = {}
    for name, instance in instances.items():
        table = providers[name][1] if name in providers else data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{label(name)}: expected a table")
        transport_options[name] = {k: v for k, v in table.items() if k not in LANE_KEYS}
        lane_limits[name] = _lane_limits(instance.where, table)
    failover = failover_settings(data.get("failover", {}))
    concurrency = _concurrency(data.get("sweep", {}))
    sample_success = _sample_success(data.get("telemetry", {}))
    rollout = _rollout(data.get("rollout", {}))

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
    check_policy_chains({name: p.providers for name, p in policies.items()}, instances)

    for instance in instances.values():
        if instance.kind == "outbox":
            _check_outbox(instance.where, transport_options[instance.name])

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
        _require_tls(instances[name].where, table.get("base_url"))
    templates = data.get("templates", {})
    if not isinstance(templates, Mapping):
        raise ConfigError("templates: expected a table such as [templates]")
    for key in templates:
        if key != "dir":
            raise ConfigError(f"templates.{label(key)}: unknown key")
    templates_dir = templates.get("dir")
    if templates_dir is not None and (not isinstance(templates_dir, str) or not templates_dir):
        raise ConfigError("templates.dir: expected a directory path")
    serve_tokens_file, serve_public = _serve(data.get("serve", {}))
    return Settings(
        policies=policies,
        transports=transports,
        transport_options=transport_options,
        lane_limits=lane_limits,
        instances=instances,
        chains=chains,
        failover=failover,
        concurrency=concurrency,
        support_label=support_label,
        unknown_region=unknown_region,
        reset_url_hosts=reset_url_hosts,
        db=db,
        hash_key_file=hash_key_file,
        templates_dir=templates_dir,
        rollout=rollout,
        serve_tokens_file=serve_tokens_file,
        serve_public=serve_public,
        source=source,
        sample_success=sample_success,
    )


#: What ``[serve] public`` may open without a token: liveness and the scrape, no notice.
SERVE_PUBLIC_PATHS = ("/healthz", "/metrics")


def _serve(table: object) -> tuple[str | None, tuple[str, ...]]:
    """``[serve] tokens_file`` and ``public``, checked."""
    if not isinstance(table, Mapping):
        raise ConfigError("serve: expected a table such as [serve]")
    for key in table:
        if key not in ("tokens_file", "public"):
            raise ConfigError(f"serve.{label(key)}: unknown key")
    tokens_file = table.get("tokens_file")
    if tokens_file is not None and (not isinstance(tokens_file, str) or not tokens_file.strip()):
        raise ConfigError("serve.tokens_file: expected a path")
    public = table.get("public", [])
    if not isinstance(public, list) or not all(p in SERVE_PUBLIC_PATHS for p in public):
        raise ConfigError(f"serve.public: expected a list of {', '.join(SERVE_PUBLIC_PATHS)}")
    return tokens_file, tuple(public)


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
