"""Provider instances: ``[providers.<name>]`` tables, the order ``[transport]`` names them
in per channel, and ``[failover]`` (when an instance is taken out of use).

An instance is one configured provider account: a kind (``twilio``, ``postmark``, ``smtp``
…) with that kind's settings. The one-name form, ``[transport] sms = "twilio"`` with a
top-level ``[twilio]`` table, is an instance called ``twilio`` of kind ``twilio``, so
configurations and attempts recorded before instances existed mean what they meant.
Nothing here builds a transport or touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resetctl.durations import parse_duration
from resetctl.errors import ConfigError, label
from resetctl.policy import Channel

#: An instance's name: it is stored on every attempt it carries and labels metrics.
INSTANCE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
#: Instances one channel may name in order (a longer list is a mistake, not a plan).
MAX_CHAIN = 8
#: Keys of a ``[providers.<name>]`` table that are not its kind's own.
INSTANCE_KEYS = frozenset({"kind"})


@dataclass(frozen=True, slots=True)
class Failover:
    """``[failover]``: when an instance is open (taken out of use) and for how long."""

    #: consecutive transient failures or time-outs that open an instance ...
    after: int = 3
    #: ... when they all fall within this many seconds of the first of them
    window: float = 60.0
    #: seconds an open instance gets no call; then one probe call decides
    cooldown: float = 30.0


@dataclass(frozen=True, slots=True)
class Instance:
    """One configured provider instance."""

    #: its name, as attempts record it (``twilio_eu``; ``twilio`` for a top-level table)
    name: str
    #: the transport kind that builds it (a built-in or an entry point's name)
    kind: str
    #: where its table is, as errors name it (``providers.twilio_eu``, or ``twilio``)
    where: str


MAX_FAILOVER_AFTER = 1000
_DEFAULT = Failover()
MAX_COOLDOWN = 3600.0


def failover_settings(table: object) -> Failover:
    """``[failover]``, checked."""
    if not isinstance(table, Mapping):
        raise ConfigError("failover: expected a table such as [failover]")
    for key in table:
        if key not in ("after", "window", "cooldown"):
            raise ConfigError(f"failover.{label(key)}: unknown key")
    after = table.get("after", _DEFAULT.after)
    if (
        isinstance(after, bool)
        or not isinstance(after, int)
        or not 1 <= after <= MAX_FAILOVER_AFTER
    ):
        raise ConfigError(f"failover.after: expected a whole number from 1 to {MAX_FAILOVER_AFTER}")
    window = parse_duration(table.get("window", _DEFAULT.window), "failover.window")
    cooldown = parse_duration(table.get("cooldown", _DEFAULT.cooldown), "failover.cooldown")
    if cooldown > MAX_COOLDOWN:
        raise ConfigError("failover.cooldown: expected at most 1h (a reset link outlives no more)")
    return Failover(after, window, cooldown)


def provider_tables(raw: object, known_kind: Any) -> dict[str, tuple[Instance, Mapping[str, Any]]]:
    """``[providers.<name>]`` tables, checked: each names a known ``kind``; its other keys
    are the kind's own (its transport checks them when it is built)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("providers: expected tables such as [providers.twilio_main]")
    found: dict[str, tuple[Instance, Mapping[str, Any]]] = {}
    for name, table in raw.items():
        where = f"providers.{label(name)}"
        if not isinstance(name, str) or not INSTANCE_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: an instance name is lower-case letters, digits and _, starting"
                " with a letter (at most 40)"
            )
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: expected a table")
        kind = table.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ConfigError(f'{where}.kind: expected a transport kind, e.g. kind = "twilio"')
        if not known_kind(kind):
            raise ConfigError(f"{where}.kind: unknown transport {label(kind)}")
        options = {k: v for k, v in table.items() if k not in INSTANCE_KEYS}
        found[name] = (Instance(name, kind, where), options)
    return found


def chain_of(value: object, where: str, instances: Mapping[str, Instance]) -> tuple[str, ...]:
    """One channel's instances in order: a name, or a list of names, each configured."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f'{where}: expected an instance name or a list of them, e.g. ["twilio_main",'
            ' "twilio_backup"]'
        )
    if len(names) > MAX_CHAIN:
        raise ConfigError(f"{where}: at most {MAX_CHAIN} instances")
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: an instance may appear once")
    for name in names:
        if name not in instances:
            raise ConfigError(
                f"{where}: no provider instance {label(name)} (add [providers.{label(name)}]"
                " with its kind, or name a built-in transport)"
            )
    return tuple(names)


def check_policy_chains(
    chains: Mapping[str, Mapping[Channel, Sequence[str]]], instances: Mapping[str, Instance]
) -> None:
    """Each policy's own instance lists name configured instances."""
    for policy, own in chains.items():
        for channel, names in own.items():
            chain_of(list(names), f"policy.{label(policy)}.{channel}.providers", instances)
