"""Operations: health aggregates, deadline-at-risk alerts, Prometheus metrics, retention.

Everything here is population numbers and opaque ids: no recipient row, contact data,
URL or raw provider payload is ever read into an output.
"""

from __future__ import annotations

import enum
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resetctl import machine
from resetctl.config import Policy
from resetctl.machine import Phase, Reason
from resetctl.store import LoadedNotice, Store

#: Expiry reasons that mean the link's lifetime, not a policy choice, ended the notice.
USEFUL_EXPIRY_REASONS = frozenset(
    {Reason.NO_USEFUL_TIME.value, Reason.FALLBACK_RESERVE_NOT_MET.value, Reason.LINK_EXPIRED.value}
)


def health(store: Store, now: float, window: float) -> dict[str, Any]:
    """`resetctl health`: aggregates over the last ``window`` seconds, never a row."""
    since = now - window
    events = store.event_counts(since)
    by_kind: Counter[str] = Counter()
    useful_expiry = escalations = 0
    for row in events:
        by_kind[row["kind"]] += row["count"]
        moved = row["old_phase"] != row["new_phase"]
        if moved and row["new_phase"] == Phase.EXPIRED and row["reason"] in USEFUL_EXPIRY_REASONS:
            useful_expiry += row["count"]
        if moved and row["new_phase"] == Phase.FALLBACK_PENDING:
            escalations += row["count"]
    attempts: dict[str, dict[str, int]] = {}
    for channel, outcome, count in store.attempt_outcomes(since):
        attempts.setdefault(channel, {})[outcome] = count
    oldest = store.oldest_due_at(now)
    return {
        "window_seconds": window,
        "notices_by_phase": store.phase_counts(),
        "sweep_lag_seconds": 0.0 if oldest is None else round(now - oldest, 3),
        "useful_expiry_rejections": useful_expiry,
        "attempts": attempts,
        "escalations": escalations,
        # A lookup of an ambiguous submission is a status read too (provider quota).
        "status_reads": by_kind["poll"] + by_kind["lookup"],
        "callbacks": by_kind["callback"],
        "lease_recoveries": by_kind["lease_recovered"],
        "lost_races": by_kind["lost_race"],
        "expired_without_outcome": store.expired_without_outcome(since),
        "late_primary_after_fallback": store.late_primary_after_fallback(since),
    }


def storage(store: Store, now: float, retention: float) -> dict[str, Any]:
    """`health --storage`: measured bytes per event and notice, and the projected size."""
    measured = store.storage()
    rows = measured["rows"]
    sizes = measured["bytes"]
    events = rows["events"]
    # Encoded: the event records and their index entries themselves. Allocated: the
    # pages they occupy (what the file grows by), used for the projection.
    per_event = measured["encoded"].get("events", 0) / events if events else 0.0
    allocated_per_event = sizes.get("events", 0) / events if events else 0.0
    first, last = measured["events_span"]
    days = max((last - first) / 86400, 1.0) if first is not None else 1.0
    per_day = rows["events"] / days
    retention_days = retention / 86400
    other = sum(v for k, v in sizes.items() if k not in ("events", "daily_counts"))
    per_notice = other / rows["notices"] if rows["notices"] else 0.0
    notices_per_day = rows["notices"] / days
    return {
        "bytes_per_event": round(per_event, 1),
        "allocated_bytes_per_event": round(allocated_per_event, 1),
        "events_per_day": round(per_day, 1),
        "bytes_per_notice_excluding_events": round(per_notice, 1),
        "notices_per_day": round(notices_per_day, 1),
        "retention_days": round(retention_days, 2),
        "projected_bytes": round(
            retention_days * (per_day * allocated_per_event + notices_per_day * per_notice)
        ),
        "file_bytes": measured["file_bytes"],
        "rows": rows,
    }


class AlertLevel(enum.IntEnum):
    """Monitoring-plugin exit codes."""

    #: nothing at risk
    OK = 0
    #: within the warning margin of the deadline
    WARNING = 1
    #: the remaining lifetime no longer covers the next action
    CRITICAL = 2


@dataclass(frozen=True, slots=True)
class Alert:
    """A live notice whose deadline budget is at risk. Ids and timing only."""

    notice_id: str
    region: str
    phase: str
    level: AlertLevel
    mode: str
    next_action: str
    channel: str | None
    remaining_seconds: float
    needed_seconds: float | None
    state_age_seconds: float

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape."""
        return {
            "notice_id": self.notice_id,
            "region": self.region,
            "phase": self.phase,
            "level": self.level.name.lower(),
            "mode": self.mode,
            "next_action": self.next_action,
            "channel": self.channel,
            "remaining_seconds": round(self.remaining_seconds, 3),
            "needed_seconds": None
            if self.needed_seconds is None
            else round(self.needed_seconds, 3),
            "state_age_seconds": round(self.state_age_seconds, 3),
        }


def _assess(loaded: LoadedNotice, policy: Policy, now: float) -> Alert | None:
    found = machine.budget(loaded.state, policy, now)
    if found is None:
        return None
    if found.at_risk:
        level = AlertLevel.CRITICAL
    elif found.remaining <= found.needed + policy.alert_warning:
        level = AlertLevel.WARNING
    else:
        return None
    decision = found.decision
    action = decision.action.value if not decision.phase.terminal else decision.phase.value
    needed = None if found.needed == float("inf") else found.needed
    return Alert(
        notice_id=loaded.state.notice_id,
        region=loaded.region,
        phase=loaded.state.phase.value,
        level=level,
        mode=policy.alert_mode,
        next_action=action,
        channel=decision.channel,
        remaining_seconds=max(0.0, found.remaining),
        needed_seconds=needed,
        state_age_seconds=now - loaded.phase_since,
    )


def alerts(store: Store, now: float) -> tuple[list[Alert], AlertLevel]:
    """Every live notice at risk, and the exit level from the notices in page mode.

    Notices under a policy in observe mode are reported and recorded once as
    would-have-paged events, but never raise the exit level.
    """
    found: list[Alert] = []
    level = AlertLevel.OK
    policies: dict[tuple[str, int], Policy] = {}
    for loaded in store.live_notices():
        key = (loaded.policy_name, loaded.policy_version)
        if key not in policies:
            policies[key] = store.load_policy(*key)
        alert = _assess(loaded, policies[key], now)
        if alert is None:
            continue
        found.append(alert)
        if alert.mode == "page":
            level = max(level, alert.level)
        elif alert.level is AlertLevel.CRITICAL:
            store.record_would_page(alert.notice_id, loaded.state.phase, "deadline_at_risk", now)
    return found, level


def purge(store: Store, older_than: float, now: float, batch: int = 500) -> int:
    """Delete notices finished more than ``older_than`` seconds ago, in short batches."""
    cutoff = now - older_than
    total = 0
    while True:
        deleted = store.purge_batch(cutoff, batch)
        total += deleted
        if deleted < batch:
            return total


def metric_families(store: Store, now: float) -> Iterator[Any]:
    """Prometheus metric families from the events (counters) and the live queue (gauges).

    Labels come only from bounded sets: channel, normalized status, phase, reason,
    the policy record's name (bounded by the config, unlike the free-text region)
    and version, and the template version.
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    events = CounterMetricFamily(
        "resetctl_events",
        "Recorded steps by kind, channel and normalized status.",
        labels=["kind", "channel", "status", "policy", "policy_version"],
    )
    transitions = CounterMetricFamily(
        "resetctl_transitions",
        "Phase changes by destination phase and the machine's reason.",
        labels=["from_phase", "to_phase", "reason", "policy", "policy_version"],
    )
    submissions = CounterMetricFamily(
        "resetctl_submissions",
        "Submission outcomes by channel, normalized status and template version.",
        labels=["channel", "status", "template_version", "policy", "policy_version"],
    )
    by_event: Counter[tuple[str, ...]] = Counter()
    by_transition: Counter[tuple[str, ...]] = Counter()
    by_submission: Counter[tuple[str, ...]] = Counter()
    for row in store.event_counts(0.0):
        policy, version = row["policy"], str(row["policy_version"])
        by_event[(row["kind"], row["channel"], row["status"], policy, version)] += row["count"]
        if row["old_phase"] != row["new_phase"]:
            key = (row["old_phase"], row["new_phase"], row["reason"], policy, version)
            by_transition[key] += row["count"]
        if row["kind"] == "outcome":
            key = (
                row["channel"],
                row["status"] or "error",
                row["template_version"],
                policy,
                version,
            )
            by_submission[key] += row["count"]
    for family, counts in (
        (events, by_event),
        (transitions, by_transition),
        (submissions, by_submission),
    ):
        for labels, value in sorted(counts.items()):
            family.add_metric(list(labels), value)
        yield family

    depth = GaugeMetricFamily(
        "resetctl_live_notices",
        "Live notices (the queue) by phase.",
        labels=["phase", "policy", "policy_version"],
    )
    for phase, name, number, count in store.live_counts():
        depth.add_metric([phase, name, str(number)], count)
    yield depth
    oldest = store.oldest_due_at(now)
    yield GaugeMetricFamily(
        "resetctl_sweep_lag_seconds",
        "How long the longest-waiting due notice has waited.",
        value=0.0 if oldest is None else now - oldest,
    )
    last = store.last_sweep()
    if last is not None:
        yield GaugeMetricFamily(
            "resetctl_last_sweep_timestamp_seconds", "When the last sweep ended.", value=last[0]
        )
        yield GaugeMetricFamily(
            "resetctl_last_sweep_duration_seconds", "How long the last sweep ran.", value=last[1]
        )


def write_metrics(store: Store, path: Path, now: float) -> None:
    """The Prometheus text format, written atomically for node_exporter's textfile collector."""
    from prometheus_client import CollectorRegistry, write_to_textfile
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterable[Any]:
            return list(metric_families(store, now))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(os.fspath(path), registry)
