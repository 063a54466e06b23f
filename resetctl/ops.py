"""Operations: health aggregates, deadline-at-risk alerts, Prometheus metrics, retention.

Everything here is population numbers and opaque ids: no recipient row, contact data,
URL or raw provider payload is ever read into an output.
"""

from __future__ import annotations

import enum
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from resetctl import machine
from resetctl.errors import ConfigError
from resetctl.machine import LIVE_PHASES, REFUSAL_REASONS, SKIP_REASONS, Phase
from resetctl.ops_measures import health_figures, projected_bytes, span_days, telemetry_budget
from resetctl.ops_measures import metric_families as distribution_families
from resetctl.ops_providers import (
    NoHealthyProvider,
    instance_figures,
    instance_metric_families,
    no_healthy_provider,
)
from resetctl.policy import AGGREGATES_RETENTION, Channel, Policy, aggregates_retention
from resetctl.rollout import rollout_figures
from resetctl.store import LoadedNotice, Store
from resetctl.summary import iso


def health(
    store: Store, now: float, window: float, chains: Mapping[str, Sequence[str]] | None = None
) -> dict[str, Any]:
    """`resetctl health`: aggregates over the last ``window`` seconds, never a row."""
    since = now - window
    events = store.event_counts(since)
    by_kind: Counter[str] = Counter()
    useful_expiry = escalations = 0
    cancelled: Counter[str] = Counter()
    skipped: dict[str, Counter[str]] = {}
    for row in events:
        by_kind[row["kind"]] += row["count"]
        if row["kind"] == "skipped":
            skipped.setdefault(row["policy"], Counter())[row["reason"]] += row["count"]
        moved = row["old_phase"] != row["new_phase"]
        if moved and row["new_phase"] == Phase.CANCELLED:
            cancelled[row["reason"]] += row["count"]
        if moved and row["new_phase"] == Phase.EXPIRED and row["reason"] in machine.OUT_OF_TIME:
            useful_expiry += row["count"]
        if moved and row["new_phase"] == Phase.FALLBACK_PENDING:
            escalations += row["count"]
    attempts: dict[str, dict[str, int]] = {}
    for channel, outcome, count in store.attempt_outcomes(since):
        attempts.setdefault(channel, {})[outcome] = count
    oldest = store.oldest_due_at(now)
    last = store.last_sweep()
    return {
        "window_seconds": window,
        "notices_by_phase": store.phase_counts(),
        # A template version may leave the templates dir once no live notice uses it.
        "live_by_template_version": _live_by_template_version(store),
        "sweep_lag_seconds": 0.0 if oldest is None else round(now - oldest, 3),
        # The machine's budget, as inspect and alerts read it (alerts --peek lists them).
        "at_risk": dict(sum(at_risk_counts(store, now).values(), Counter())),
        "last_sweep_at": None if last is None else iso(last[0]),
        "seconds_since_last_sweep": None if last is None else round(now - last[0], 3),
        "last_sweep_duration_seconds": None if last is None else round(last[1], 3),
        "useful_expiry_rejections": useful_expiry,
        "attempts": attempts,
        "escalations": escalations,
        # Cancels by reason (completed: the reset was used; superseded; withdrawn).
        "cancelled": dict(cancelled),
        # Region policy at work, by policy: requests enqueue refused (no notice holds
        # them), and channels ruled out of notices (country_cap: the SMS-pumping signal).
        "refused": _by_policy(store.refusal_counts(since)),
        "skipped": {policy: dict(reasons) for policy, reasons in sorted(skipped.items())},
        # A lookup of an ambiguous submission is a status read too (provider quota).
        "status_reads": by_kind["poll"] + by_kind["lookup"],
        # Per transport, added up over every sweep: provider calls, 429s, time work
        # waited in the lane for a slot, a token or a pause, the most in flight at once.
        "lanes": store.lane_counts(),
        "callbacks": by_kind["callback"],
        "lease_recoveries": by_kind["lease_recovered"],
        "lost_races": by_kind["lost_race"],
        # Success and "terminal" as each notice's policy defines them per channel.
        "expired_without_outcome": store.expired_without_outcome(since),
        "late_primary_after_fallback": store.late_primary_after_fallback(since),
        **health_figures(store, since),
        "rollout": rollout_figures(store, since),
        # Each provider instance: its state, failures, openings and calls; per channel,
        # the instances in use now.
        "providers": instance_figures(store, chains or {}, now),
    }


def telemetry(
    store: Store, policies: Mapping[str, Policy], older_than: float, sample_success: float
) -> dict[str, Any]:
    """`health --telemetry`: bytes per day of events, observations and log lines, and the
    projected size under each region's retention, by purge's rules (``older_than``)."""
    rules = retention_by_policy(policies, store.newest_policies(), older_than)
    return telemetry_budget(store, rules, older_than, sample_success)


def _by_policy(rows: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    grouped: dict[str, dict[str, int]] = {}
    for policy, reason, count in rows:
        grouped.setdefault(policy, {})[reason] = count
    return grouped


def _live_by_template_version(store: Store) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for policy, count in store.live_policy_counts():
        counts[policy.template_version] += count
    return dict(sorted(counts.items()))


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
    days = span_days(*measured["events_span"])
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
        "projected_bytes": projected_bytes(
            per_day * allocated_per_event + notices_per_day * per_notice, retention
        ),
        "file_bytes": measured["file_bytes"],
        "rows": rows,
    }


class AlertLevel(enum.IntEnum):
    """Monitoring-plugin exit codes."""

    #: nothing at risk
    OK = 0
    #: tight, or past help: worth a look, not a page
    WARNING = 1
    #: on-call can still act, and must now
    CRITICAL = 2
    #: the check itself could not run (missing database, bad config, unreadable file)
    UNKNOWN = 3


#: A live notice whose remaining lifetime hardly covers its next action.
DEADLINE_AT_RISK = "reset_delivery_deadline_at_risk"
#: A notice that ended without success since the previous `alerts` run.
ENDED_WITHOUT_SUCCESS = "reset_delivery_ended_without_success"
#: Live notices wait and no sweep has finished for longer than alert_stalled_after.
SWEEP_STALLED = "resetctl_sweep_stalled"
#: SMS were skipped in the last COUNTRY_CAP_WINDOW because a country's cap was full.
COUNTRY_CAP_HIT = "resetctl_sms_country_cap_hit"
COUNTRY_CAP_WINDOW = 3600.0
#: meta key: the newest event id (and its time) the previous `alerts` run looked at.
ENDED_WATERMARK = "alerts_ended_watermark"
#: How far back the first `alerts` run on a database looks for ended notices.
FIRST_RUN_LOOKBACK = 3600.0
#: Ended notices listed per run (the count is always complete).
ENDED_LISTED = 50


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
    #: the next action can still help (a submission or fallback can still land in time);
    #: False when the notice can only wait for its link to die
    actionable: bool = True

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape."""
        return {
            "alert": DEADLINE_AT_RISK,
            "notice_id": self.notice_id,
            "region": self.region,
            "phase": self.phase,
            "level": self.level.name.lower(),
            "mode": self.mode,
            "actionable": self.actionable,
            "next_action": self.next_action,
            "channel": self.channel,
            "remaining_seconds": round(self.remaining_seconds, 3),
            "needed_seconds": None
            if self.needed_seconds is None
            else round(self.needed_seconds, 3),
            "state_age_seconds": round(self.state_age_seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class Ended:
    """A notice that ended without success since the previous run (reported once)."""

    notice_id: str
    region: str
    phase: str
    reason: str | None
    ended_at: float
    mode: str

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape."""
        return {
            "alert": ENDED_WITHOUT_SUCCESS,
            "notice_id": self.notice_id,
            "region": self.region,
            "phase": self.phase,
            "level": AlertLevel.WARNING.name.lower(),
            "mode": self.mode,
            "reason": self.reason,
            "ended_at": iso(self.ended_at),
        }


@dataclass(frozen=True, slots=True)
class Stalled:
    """Live notices wait and no sweep has finished for too long."""

    live_notices: int
    last_sweep_at: float | None
    seconds_since_last_sweep: float | None
    stalled_after: float

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape."""
        since = self.seconds_since_last_sweep
        return {
            "alert": SWEEP_STALLED,
            "level": AlertLevel.CRITICAL.name.lower(),
            "live_notices": self.live_notices,
            "last_sweep_at": iso(self.last_sweep_at),
            "seconds_since_last_sweep": None if since is None else round(since, 3),
            "stalled_after_seconds": self.stalled_after,
        }


@dataclass(frozen=True, slots=True)
class CountryCapHit:
    """SMS were skipped because their destination country's hourly cap was full: the
    SMS-pumping signal (or a real surge that the cap now holds back)."""

    policy: str
    skipped: int
    mode: str

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape."""
        return {
            "alert": COUNTRY_CAP_HIT,
            "level": AlertLevel.CRITICAL.name.lower(),
            "policy": self.policy,
            "mode": self.mode,
            "sms_skipped_last_hour": self.skipped,
        }


@dataclass(frozen=True, slots=True)
class AlertsReport:
    """One `alerts` run: what is at risk, what ended unseen, whether sweeps run."""

    at: float
    level: AlertLevel
    notices: list[Alert]
    ended: list[Ended]
    #: ended notices in this run, including any beyond the listed ones
    ended_total: int
    stalled: Stalled | None
    #: policies whose country cap skipped SMS in the last hour
    country_caps: list[CountryCapHit] = field(default_factory=list)
    #: channels with no provider instance left in use
    providers_down: list[NoHealthyProvider] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The `--json` shape: every alert in one list, each naming its kind."""
        items = [a.to_json() for a in self.notices] + [e.to_json() for e in self.ended]
        items[:0] = [c.to_json() for c in self.country_caps]
        items[:0] = [d.to_json() for d in self.providers_down]
        if self.stalled is not None:
            items.insert(0, self.stalled.to_json())
        return {
            "at": iso(self.at),
            "status": self.level.name.lower(),
            "alerts": items,
            "ended_without_success": self.ended_total,
        }


def _assess(loaded: LoadedNotice, policy: Policy, now: float) -> Alert | None:
    """The notice's alert when the machine's budget says it is at risk (its margin is
    within alert_warning, or gone). The budget decides everything here: whether the next
    action still helps, what it needs, and the level (critical only while a useful action
    is overdue; a notice past help is a warning, which the caller reports once)."""
    state = loaded.state
    found = machine.budget(state, policy, now)
    if found is None or not found.at_risk:
        return None
    decision = found.decision
    return Alert(
        notice_id=state.notice_id,
        region=loaded.region,
        phase=state.phase.value,
        level=AlertLevel[found.level.upper()],
        mode=policy.alert_mode,
        next_action=decision.action.value,
        channel=decision.channel,
        remaining_seconds=max(0.0, found.remaining),
        needed_seconds=None if math.isinf(found.needed) else found.needed,
        state_age_seconds=now - loaded.phase_since,
        actionable=found.actionable,
    )


def at_risk_counts(store: Store, now: float) -> dict[tuple[str, int], Counter[str]]:
    """Live notices at risk by policy record and level (``critical``, ``warning``), as the
    machine's budget judges each: the numbers health and the metrics show, and the same
    notices ``alerts`` lists."""
    counts: dict[tuple[str, int], Counter[str]] = {}
    policies: dict[tuple[str, int], Policy] = {}
    for loaded in store.live_notices():
        key = (loaded.policy_name, loaded.policy_version)
        if key not in policies:
            policies[key] = store.load_policy(*key)
        found = machine.budget(loaded.state, policies[key], now)
        bucket = counts.setdefault(key, Counter({"critical": 0, "warning": 0}))
        if found is not None and found.at_risk:
            bucket[found.level] += 1
    return counts


def alerts(
    store: Store,
    now: float,
    stalled_after: float = 180.0,
    *,
    peek: bool = False,
    chains: Mapping[str, Sequence[str]] | None = None,
) -> AlertsReport:
    """`resetctl alerts`: live notices at risk, notices that ended without success since
    the previous run (a watermark in the database), and a stalled sweeper.

    The exit level counts only notices whose policy pages (alert_mode = "page"); under
    "observe" a critical notice is recorded once as a would-have-paged event instead.
    A notice past help is reported once, not on every run. With ``peek`` nothing is
    recorded: every notice at risk is listed (one-time warnings included, and not used
    up), no would-have-paged event is written, and the ended watermark stays put.
    """
    level = AlertLevel.OK
    policies: dict[tuple[str, int], Policy] = {}

    def policy_of(name: str, version: int) -> Policy:
        if (name, version) not in policies:
            policies[(name, version)] = store.load_policy(name, version)
        return policies[(name, version)]

    found: list[Alert] = []
    for loaded in store.live_notices():
        alert = _assess(loaded, policy_of(loaded.policy_name, loaded.policy_version), now)
        if alert is None:
            continue
        phase = loaded.state.phase
        if (
            not peek
            and not alert.actionable
            and not store.record_alert_once(alert.notice_id, phase, "no_useful_action", now)
        ):
            continue
        found.append(alert)
        if alert.mode == "page":
            level = max(level, alert.level)
        elif alert.level is AlertLevel.CRITICAL and not peek:
            store.record_would_page(alert.notice_id, phase, "deadline_at_risk", now)

    ended, total = _ended_since_last_run(store, now, policy_of, peek=peek)
    if any(e.mode == "page" for e in ended):
        level = max(level, AlertLevel.WARNING)

    stalled = _stalled(store, now, stalled_after)
    if stalled is not None:
        level = AlertLevel.CRITICAL
    caps = [
        CountryCapHit(name, count, policy_of(name, version).alert_mode)
        for name, version, count in store.skips_since("country_cap", now - COUNTRY_CAP_WINDOW)
    ]
    if any(c.mode == "page" for c in caps):
        level = AlertLevel.CRITICAL
    down = no_healthy_provider(store, chains or {}, now)
    if down:
        level = AlertLevel.CRITICAL
    return AlertsReport(now, level, found, ended[:ENDED_LISTED], total, stalled, caps, down)


def _ended_since_last_run(
    store: Store, now: float, policy_of: Callable[[str, int], Policy], *, peek: bool = False
) -> tuple[list[Ended], int]:
    mark = store.meta_value(ENDED_WATERMARK)
    if mark is None:
        after_event, after_time = 0, now - FIRST_RUN_LOOKBACK
        rows, newest = store.ended_since(after_event, after_time)
        rows = [r for r in rows if r["ended_at"] > after_time]
    else:
        event_text, _, time_text = mark.partition(":")
        after_event, after_time = int(event_text), float(time_text)
        rows, newest = store.ended_since(after_event, after_time)
    ended = [
        Ended(
            notice_id=row["notice_id"],
            region=row["region"],
            phase=row["phase"],
            reason=row["reason"],
            ended_at=row["ended_at"],
            mode=policy_of(row["policy"], row["policy_version"]).alert_mode,
        )
        for row in rows
    ]
    if not peek:
        latest = max([after_time, *(e.ended_at for e in ended)])
        store.set_meta(ENDED_WATERMARK, f"{newest}:{latest!r}")
    return ended, len(ended)


def _stalled(store: Store, now: float, stalled_after: float) -> Stalled | None:
    live, first_created = store.live_summary()
    if not live or first_created is None:
        return None
    last = store.last_sweep()
    if last is not None:
        since = now - last[0]
        return Stalled(live, last[0], since, stalled_after) if since > stalled_after else None
    # Never swept: stalled once a notice has waited that long.
    if now - first_created > stalled_after:
        return Stalled(live, None, None, stalled_after)
    return None


#: An abuse-limit counter idle this long counts nothing any more, whatever the policy: no
#: limit window may be longer (policy.MAX_LIFETIME bounds per_recipient_window).
LIMIT_COUNTS_IDLE = 30 * 86400.0


class RetentionSource(enum.StrEnum):
    """Where the retention ``purge`` applies to one policy's finished notices comes from."""

    #: the policy of that name in today's config sets ``retention``
    CONFIG = "config"
    #: no policy of that name is configured any more: the newest record of it stored
    STORED = "stored"
    #: the policy sets no retention: purge's ``older_than`` (``--older-than``)
    OLDER_THAN = "older_than"


@dataclass(frozen=True, slots=True)
class Retention:
    """How long one policy's finished notices are kept, and which rule said so."""

    seconds: float
    source: RetentionSource


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """One ``purge``: what went, per policy and per aggregate table, and the rules applied."""

    at: float
    #: the retention applied to each policy name (configured or stored)
    retention: dict[str, Retention]
    #: finished notices deleted, by policy name
    deleted_by_policy: dict[str, int]
    #: the first UTC day whose daily aggregates are kept (older days were folded away)
    aggregates_kept_from: str
    daily_counts_deleted: int
    refusals_deleted: int
    #: abuse-limit counters deleted as idle past every window
    limit_counts_deleted: int

    @property
    def deleted(self) -> int:
        """Finished notices deleted, over every policy."""
        return sum(self.deleted_by_policy.values())

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` shape (``at`` and ``deleted`` as before per-policy retention)."""
        return {
            "at": iso(self.at),
            "deleted": self.deleted,
            "deleted_by_policy": dict(self.deleted_by_policy),
            "retention_by_policy": {
                name: {"seconds": rule.seconds, "from": rule.source.value}
                for name, rule in self.retention.items()
            },
            "aggregates_kept_from": self.aggregates_kept_from,
            "aggregates_deleted": {
                "daily_counts": self.daily_counts_deleted,
                "refusals": self.refusals_deleted,
            },
            "limit_counts_deleted": self.limit_counts_deleted,
        }


def retention_by_policy(
    configured: Mapping[str, Policy], stored: Mapping[str, Policy], older_than: float
) -> dict[str, Retention]:
    """The retention of each policy name: the configured policy's own when that name is
    configured (today's rule applies to rows at rest, so a shortened retention reaches
    existing rows), else the newest stored record's; ``older_than`` when the policy
    found sets none."""
    rules: dict[str, Retention] = {}
    for name in sorted({*configured, *stored}):
        policy, source = configured.get(name), RetentionSource.CONFIG
        if policy is None:
            policy, source = stored[name], RetentionSource.STORED
        if policy.retention is None:
            rules[name] = Retention(older_than, RetentionSource.OLDER_THAN)
        else:
            rules[name] = Retention(policy.retention, source)
    return rules


def purge(
    store: Store,
    older_than: float,
    now: float,
    batch: int = 500,
    policies: Mapping[str, Policy] | None = None,
    aggregates_older_than: float = AGGREGATES_RETENTION,
) -> PurgeReport:
    """Delete finished notices past their policy's retention, idle abuse-limit counters
    and daily aggregates past theirs, each in short batches (safe beside sweeps).

    A notice finished more than its retention ago goes, never one finished more
    recently (see :func:`retention_by_policy`; ``policies`` are the configured ones): a
    policy's retention wins over ``older_than`` both ways. Each policy's notices are
    walked by the index over finished notices by policy. Their events are folded into
    the daily aggregates first, so health and the metrics still add up. A day of
    aggregates goes once the whole UTC day ended more than ``aggregates_older_than``
    ago; its counts are added to the all-time totals first, so the metrics' counters
    never go down. Every value is checked before anything is deleted.
    """
    if not (math.isfinite(older_than) and older_than > 0):
        raise ConfigError("older_than: must be a positive duration")
    aggregates_older_than = aggregates_retention(aggregates_older_than, "aggregates_older_than")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError("batch_size: must be a positive whole number")
    configured = dict(policies or {})
    stored = store.newest_policies()
    rules = retention_by_policy(configured, stored, older_than)
    deleted: dict[str, int] = {}
    for name, rule in rules.items():
        delete_batch = functools.partial(store.purge_batch, now - rule.seconds, batch, name)
        deleted[name] = _in_batches(delete_batch, batch)
    windows = [p.limits.per_recipient_window for p in (*configured.values(), *stored.values())]
    idle = now - max([LIMIT_COUNTS_IDLE, *windows])
    limits = _in_batches(lambda: store.purge_limit_counts(idle, batch), batch)
    kept_from = datetime.fromtimestamp(now - aggregates_older_than, UTC).date().isoformat()
    daily = refused = 0
    while (gone := store.purge_aggregate_day(kept_from)) is not None:
        daily, refused = daily + gone[1], refused + gone[2]
    return PurgeReport(now, rules, deleted, kept_from, daily, refused, limits)


def _in_batches(delete_batch: Callable[[], int], batch: int) -> int:
    """Run ``delete_batch`` until a batch comes back short; how many went in all."""
    total = 0
    while True:
        deleted = delete_batch()
        total += deleted
        if deleted < batch:
            return total


def metric_families(
    store: Store,
    now: float,
    policies: Iterable[tuple[str, int]] = (),
    chains: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[Any]:
    """Prometheus metric families from the events (counters) and the live queue (gauges).

    Labels come only from bounded sets: channel, normalized status, phase, reason,
    the policy record's name (bounded by the config, unlike the free-text region)
    and version, and the template version. The live-queue gauge has a sample (zero when
    empty) for every live phase of every stored policy and of ``policies`` (the
    configured ones), so an empty queue reads 0, not "no data".
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
    # Every event ever, by its bounded labels: the costliest read here, made once for
    # every family that counts events.
    counted = store.event_counts(0.0)
    for row in counted:
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

    refused = CounterMetricFamily(
        "resetctl_refused_requests",
        "Requests enqueue refused for a policy reason (rate_limited, no_consent, a"
        " destination), by policy.",
        labels=["policy", "reason"],
    )
    # Every configured or stored policy reads 0 for each reason until one happens.
    names = sorted({name for name, _ in (*store.known_policies(), *policies)})
    by_refusal = {(name, str(reason)): 0 for name in names for reason in REFUSAL_REASONS}
    for policy, reason, count in store.refusal_counts(0.0):
        by_refusal[(policy, reason)] = count
    for labels, value in sorted(by_refusal.items()):
        refused.add_metric(list(labels), value)
    yield refused
    skipped = CounterMetricFamily(
        "resetctl_skipped_channels",
        "Channels a policy ruled out of a notice (no_consent, destination_country,"
        " destination_type, country_cap), by policy.",
        labels=["channel", "reason", "policy"],
    )
    by_skip: Counter[tuple[str, str, str]] = Counter(
        {(str(c), str(r), name): 0 for name in names for c in Channel for r in SKIP_REASONS}
    )
    for row in counted:
        if row["kind"] == "skipped":
            by_skip[(row["channel"], row["reason"], row["policy"])] += row["count"]
    for labels, value in sorted(by_skip.items()):
        skipped.add_metric(list(labels), value)
    yield skipped
    yield from distribution_families(store, names, counted)

    depth = GaugeMetricFamily(
        "resetctl_live_notices",
        "Live notices (the queue) by phase.",
        labels=["phase", "policy", "policy_version"],
    )
    queue: dict[tuple[str, str, str], int] = {
        (str(phase), name, str(version)): 0
        for name, version in {*store.known_policies(), *policies}
        for phase in LIVE_PHASES
    }
    for phase, name, number, count in store.live_counts():
        queue[(phase, name, str(number))] = count
    for labels, count in sorted(queue.items()):
        depth.add_metric(list(labels), count)
    yield depth
    at_risk = GaugeMetricFamily(
        "resetctl_notices_at_risk",
        "Live notices whose deadline budget is within alert_warning of running out, by"
        " level (critical: a useful action is overdue; warning: otherwise).",
        labels=["level", "policy", "policy_version"],
    )
    risky = at_risk_counts(store, now)
    for name, number in sorted({*store.known_policies(), *policies, *risky}):
        levels = risky.get((name, number), Counter())
        for level in ("critical", "warning"):
            at_risk.add_metric([level, name, str(number)], levels[level])
    yield at_risk
    lanes = store.lane_counts()
    for name, help_text, column in (
        ("resetctl_lane_calls", "Provider calls sweeps started, per transport.", "calls"),
        (
            "resetctl_lane_throttled",
            "Calls a provider throttled (429), per transport.",
            "throttled",
        ),
        (
            "resetctl_lane_wait_seconds",
            "Seconds work waited in a transport's lane for a slot, a token or a pause.",
            "waited_seconds",
        ),
    ):
        counter = CounterMetricFamily(name, help_text, labels=["transport"])
        for transport, totals in lanes.items():
            counter.add_metric([transport], float(totals.get(column, 0)))
        yield counter
    peak = GaugeMetricFamily(
        "resetctl_lane_peak_in_flight",
        "The most calls in flight at once on a transport, over every sweep.",
        labels=["transport"],
    )
    for transport, totals in lanes.items():
        peak.add_metric([transport], float(totals.get("peak_in_flight", 0)))
    yield peak
    yield from instance_metric_families(store, chains or {}, now)
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


def write_metrics(
    store: Store,
    path: Path,
    now: float,
    policies: Iterable[tuple[str, int]] = (),
    chains: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """The Prometheus text format, written atomically for node_exporter's textfile
    collector: 0644 whatever the umask (node_exporter reads it; nobody else may change
    what the alerts see), through a file of its own that never ends in ``.prom``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    from resetctl.files import SHARED_DIR, SHARED_FILE, make_directories, write_atomically

    class _Collector(Collector):
        def collect(self) -> Iterable[Any]:
            return list(metric_families(store, now, policies, chains))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    make_directories(path.parent, SHARED_DIR)
    write_atomically(path, generate_latest(registry), SHARED_FILE)
