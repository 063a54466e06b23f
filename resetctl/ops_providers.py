"""What operators see of provider instances: each one's state, failures and calls
(``health``, the metrics), and the alert when a channel has no healthy instance left.

Read from the health rows every process shares and the lane counts every sweep adds up,
so the numbers stay true whichever host saw the failures, and a purge moves none of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resetctl.failover import InstanceHealth, InstanceState
from resetctl.store import Store
from resetctl.summary import iso

#: `alerts` kind: every instance a channel names is out of use.
NO_HEALTHY_PROVIDER = "resetctl_no_healthy_provider"


@dataclass(frozen=True, slots=True)
class NoHealthyProvider:
    """A channel whose every provider instance is out of use (open, or probing)."""

    #: the channel, or ``<policy>.<channel>`` for a policy's own list
    chain: str
    instances: tuple[str, ...]
    #: when the first of them may be probed again
    back_at: float | None

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape."""
        return {
            "alert": NO_HEALTHY_PROVIDER,
            "level": "critical",
            "channel": self.chain,
            "instances": list(self.instances),
            "probe_from": iso(self.back_at),
        }


def _named(chains: Mapping[str, Sequence[str]]) -> list[str]:
    """Each instance the chains name, once, in order."""
    return list(dict.fromkeys(n for chain in chains.values() for n in chain))


def _state(found: InstanceHealth | None, now: float) -> InstanceState:
    return InstanceState.CLOSED if found is None else found.state(now)


def instance_figures(
    store: Store, chains: Mapping[str, Sequence[str]], now: float
) -> dict[str, Any]:
    """``health``'s providers: each instance a chain names, with its state, failures in a
    row and in all, times opened, when it may be probed, and calls sweeps made to it;
    per chain, the instances in use now."""
    rows = store.instance_health()
    lanes = store.lane_counts()
    names = _named(chains)
    instances: dict[str, Any] = {}
    for name in names:
        found = rows.get(name)
        instances[name] = {
            "state": _state(found, now).value,
            "failures_in_a_row": 0 if found is None else found.failures,
            "failures": 0 if found is None else found.total_failures,
            "opened": 0 if found is None else found.opened,
            "open_until": None if found is None else iso(found.open_until),
            "calls": int(lanes.get(name, {}).get("calls", 0)),
        }
    healthy = {
        chain: [n for n in members if _state(rows.get(n), now) is InstanceState.CLOSED]
        for chain, members in chains.items()
    }
    return {"instances": instances, "in_use": healthy}


def no_healthy_provider(
    store: Store, chains: Mapping[str, Sequence[str]], now: float
) -> list[NoHealthyProvider]:
    """The chains none of whose instances may take a call now. A half-open instance
    counts as usable (its next call is the probe)."""
    rows = store.instance_health()
    down: list[NoHealthyProvider] = []
    for chain, members in sorted(chains.items()):
        states = [_state(rows.get(n), now) for n in members]
        if members and all(s in (InstanceState.OPEN, InstanceState.PROBING) for s in states):
            ends = [r.open_until for n in members if (r := rows.get(n)) and r.open_until]
            down.append(NoHealthyProvider(chain, tuple(members), min(ends) if ends else None))
    return down


def instance_metric_families(
    store: Store, chains: Mapping[str, Sequence[str]], now: float
) -> Iterator[Any]:
    """Per instance: its state (one sample per state, 1 for the current one), failures
    and openings; per chain, how many of its instances are in use."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    rows = store.instance_health()
    names = _named(chains)
    state = GaugeMetricFamily(
        "resetctl_provider_state",
        "Each provider instance's health: 1 for the state it is in.",
        labels=["provider", "state"],
    )
    failures = CounterMetricFamily(
        "resetctl_provider_failures",
        "Transient failures and time-outs of calls to a provider instance.",
        labels=["provider"],
    )
    opened = CounterMetricFamily(
        "resetctl_provider_opened",
        "Times a provider instance was taken out of use.",
        labels=["provider"],
    )
    for name in names:
        found = rows.get(name)
        current = _state(found, now)
        for each in InstanceState:
            state.add_metric([name, each.value], 1.0 if each is current else 0.0)
        failures.add_metric([name], float(0 if found is None else found.total_failures))
        opened.add_metric([name], float(0 if found is None else found.opened))
    in_use = GaugeMetricFamily(
        "resetctl_channel_providers_in_use",
        "Provider instances a channel (or a policy's own list) may send through now.",
        labels=["channel"],
    )
    for chain, members in sorted(chains.items()):
        usable = (InstanceState.CLOSED, InstanceState.HALF_OPEN)
        in_use.add_metric([chain], float(sum(_state(rows.get(n), now) in usable for n in members)))
    yield from (state, failures, opened, in_use)
