"""The numbers that tune the thresholds: distributions by region as Prometheus histograms
and as ``health`` percentiles, the counters with bounded labels, and the telemetry budget
(``health --telemetry``).

The ``region`` label is the policy's name, bounded by the config; a notice's own region
is free text the application sends, unbounded, and never a label.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from resetctl.distributions import (
    LIFETIME_LEFT_BUCKETS,
    PERCENTILES,
    PRIMARY_TO_TERMINAL_BUCKETS,
    SEGMENT_BUCKETS,
    cumulative,
    quantile,
)
from resetctl.policy import Channel
from resetctl.render import SmsEncoding
from resetctl.store import Store
from resetctl.telemetry import event_values, json_line_bytes, keeps_line

#: Event kinds a sweep writes a log line for (enqueue's skips, callbacks, cancels and
#: alerts' records are written by commands that log no transition).
LOGGED_KINDS = frozenset(
    {"tick", "intent", "outcome", "declined", "poll", "lookup", "skipped", "lost_race"}
    | {"lease_recovered"}
)


class RetentionRule(Protocol):
    """What the budget reads of a region's retention (``ops.Retention``)."""

    @property
    def seconds(self) -> float: ...

    @property
    def source(self) -> enum.Enum: ...


def span_days(first: float | None, last: float | None) -> float:
    """Days between the first and the last row measured, at least one (a younger
    database is measured as one day's worth)."""
    return 1.0 if first is None or last is None else max((last - first) / 86400, 1.0)


def projected_bytes(bytes_per_day: float, retention: float) -> int:
    """What ``bytes_per_day`` grows to when rows are kept ``retention`` seconds."""
    return round(bytes_per_day * retention / 86400)


def _percentiles(counts: Mapping[str, int], bounds: tuple[float, ...]) -> dict[str, Any]:
    shown: dict[str, Any] = {"count": sum(counts.values())}
    for q in PERCENTILES:
        shown[f"p{round(q * 100)}"] = quantile(q, counts, bounds)
    return shown


def health_figures(store: Store, since: float) -> dict[str, Any]:
    """What ``health`` adds over its window: the two distributions as percentiles
    (estimated from their buckets, as Prometheus's ``histogram_quantile`` does, so a
    purge changes none), by region; the policy-aware counts by region; SMS by segment
    bucket and encoding."""
    primary, _ = store.primary_to_terminal(since)
    by_region: dict[str, dict[str, Any]] = {}
    for (policy, channel), counts in sorted(primary.items()):
        shown = _percentiles(counts, PRIMARY_TO_TERMINAL_BUCKETS)
        by_region.setdefault(policy, {})[channel] = shown
    left, _ = store.lifetime_left_at_fallback(since)
    fallback = {
        policy: _percentiles(counts, LIFETIME_LEFT_BUCKETS)
        for (policy, _), counts in sorted(left.items())
    }
    segments: dict[str, dict[str, dict[str, int]]] = {}
    for (policy, bucket, encoding), count in sorted(store.sms_segment_counts(since).items()):
        segments.setdefault(policy, {}).setdefault(encoding, {})[bucket] = count
    late: dict[str, dict[str, int]] = {}
    for (policy, channel), count in sorted(store.late_primary_counts(since).items()):
        late.setdefault(policy, {})[channel] = count
    return {
        "primary_to_terminal_seconds": by_region,
        "lifetime_left_at_fallback_seconds": fallback,
        "late_primary_after_fallback_by_region": late,
        "expired_without_outcome_by_region": dict(
            sorted(store.expired_without_outcome_counts(since).items())
        ),
        "sms_segments": segments,
    }


def metric_families(
    store: Store, names: Iterable[str], events: Iterable[Mapping[str, Any]]
) -> Iterator[Any]:
    """The histograms and counters by region: a sample (zero until something happens)
    for every region in ``names`` (configured or stored), so a quiet one reads 0.
    ``events`` are the store's event counts of all time, as the caller read them."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    regions = sorted(set(names))
    primary = HistogramMetricFamily(
        "resetctl_primary_to_terminal_seconds",
        "Seconds from the primary attempt's intent to its terminal observation (its"
        " policy's success, or failed), by region (the policy) and primary channel.",
        labels=["region", "channel"],
    )
    buckets, sums = store.primary_to_terminal(0.0)
    for key in sorted({*buckets, *((r, str(c)) for r in regions for c in Channel)}):
        shaped = cumulative(buckets.get(key, Counter()), PRIMARY_TO_TERMINAL_BUCKETS)
        primary.add_metric(list(key), shaped, sums.get(key, 0.0))
    yield primary
    lifetime = HistogramMetricFamily(
        "resetctl_lifetime_left_at_fallback_seconds",
        "Seconds of reset-link lifetime left when the fallback was claimed, by region.",
        labels=["region"],
    )
    left, left_sums = store.lifetime_left_at_fallback(0.0)
    for key in sorted({*left, *((r, "") for r in regions)}):
        shaped = cumulative(left.get(key, Counter()), LIFETIME_LEFT_BUCKETS)
        lifetime.add_metric([key[0]], shaped, left_sums.get(key, 0.0))
    yield lifetime

    lost: Counter[str] = Counter(dict.fromkeys(regions, 0))
    for row in events:
        if row["kind"] == "lost_race":
            lost[row["policy"]] += row["count"]
    expired = Counter(dict.fromkeys(regions, 0))
    expired.update(store.expired_without_outcome_counts(0.0))
    for name, text, counts in (
        (
            "resetctl_suppressed_duplicate_claims",
            "Steps whose compare-and-set another worker won (nothing was sent twice), by region.",
            lost,
        ),
        (
            "resetctl_expired_without_outcome",
            "Notices that expired with no channel ending on its policy's success, failed"
            " or a rejection, by region.",
            expired,
        ),
    ):
        counter = CounterMetricFamily(name, text, labels=["region"])
        for region, value in sorted(counts.items()):
            counter.add_metric([region], value)
        yield counter
    late = CounterMetricFamily(
        "resetctl_late_primary_after_fallback",
        "Notices whose primary reported its policy's success after the fallback was"
        " submitted, by region and primary channel.",
        labels=["region", "channel"],
    )
    late_counts = Counter({(r, str(c)): 0 for r in regions for c in Channel})
    late_counts.update(store.late_primary_counts(0.0))
    for labels, value in sorted(late_counts.items()):
        late.add_metric(list(labels), value)
    yield late
    segments = CounterMetricFamily(
        "resetctl_sms_segments",
        "SMS submissions by segment bucket (1, 2, 3, 4+) and encoding (gsm7, ucs2), by region.",
        labels=["region", "segments", "encoding"],
    )
    segment_counts = Counter(
        {(r, b, str(e)): 0 for r in regions for b in SEGMENT_BUCKETS for e in SmsEncoding}
    )
    segment_counts.update(store.sms_segment_counts(0.0))
    for segment_labels, value in sorted(segment_counts.items()):
        segments.add_metric(list(segment_labels), value)
    yield segments


def telemetry_budget(
    store: Store,
    rules: Mapping[str, RetentionRule],
    older_than: float,
    sample_success: float,
) -> dict[str, Any]:
    """``health --telemetry``: bytes per day of events and observations as the database
    stores them, and of the JSON log lines the sweeps write for those events (every one,
    and those ``sample_success`` keeps), each measured by encoding the stored rows; and
    the events' and observations' projected size under each region's retention (purge's
    rule: the policy's ``retention``, else ``older_than``)."""
    sizes: dict[str, Counter[str]] = {}
    spans: dict[str, list[float]] = {}

    def add(policy: str, at: float, **measured: int) -> None:
        sizes.setdefault(policy, Counter()).update(measured)
        span = spans.setdefault(policy, [at, at])
        span[:] = [min(span[0], at), max(span[1], at)]

    for policy, encoded, row in store.event_sizes():
        values = event_values(row)
        logs = kept = 0
        if row["kind"] in LOGGED_KINDS and row["worker"] != "enqueue":
            logs = json_line_bytes(values)
            kept = logs if keeps_line(values, sample_success) else 0
        add(policy, float(row["at"]), events=encoded, logs=logs, logs_kept=kept, event_rows=1)
    for policy, at, encoded in store.observation_sizes():
        add(policy, at, observations=encoded, observation_rows=1)
    regions: dict[str, Any] = {}
    for policy, measured in sorted(sizes.items()):
        days = span_days(*spans[policy])
        per_day = {
            kind: round(measured[kind] / days, 1)
            for kind in ("events", "observations", "logs", "logs_kept")
        }
        rule = rules.get(policy)
        retention = older_than if rule is None else rule.seconds
        stored_per_day = (measured["events"] + measured["observations"]) / days
        regions[policy] = {
            "days_measured": round(days, 2),
            "rows": {
                "events": measured["event_rows"],
                "observations": measured["observation_rows"],
            },
            "bytes_per_day": per_day,
            "retention_days": round(retention / 86400, 2),
            "retention_from": "older_than" if rule is None else rule.source.value,
            "projected_bytes": projected_bytes(stored_per_day, retention),
        }
    return {
        "sample_success": sample_success,
        "measured": "encoded rows (SQLite records, PostgreSQL pg_column_size) and JSON log lines",
        "by_region": regions,
        "bytes_per_day": {
            kind: round(sum(r["bytes_per_day"][kind] for r in regions.values()), 1)
            for kind in ("events", "observations", "logs", "logs_kept")
        },
        "projected_bytes": sum(r["projected_bytes"] for r in regions.values()),
    }
