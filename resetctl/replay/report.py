"""The report: each candidate's counters, and the figures replay prints from them.

Every figure comes under the three readings of the traces (optimistic, pessimistic and the
point estimate); a count is shown as the point estimate with the range the readings span,
widened by the envelope of the point estimate's alternatives (sweeps acting a little
earlier or later, other borrowed timelines: see :mod:`resetctl.replay.readings`).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resetctl.replay.readings import COUNTS, Envelope
from resetctl.replay.traces import CANCEL_WORDS, CHANNELS, Header


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    rank = max(1, math.ceil(fraction * len(values)))
    return float(values[rank - 1])


@dataclass(slots=True)
class ReplayStats:
    """Counters and samples gathered over one candidate's simulation (one reading)."""

    notices: int = 0
    accepted: int = 0
    accepted_primary: int = 0
    escalated: int = 0
    expired: int = 0
    failed: int = 0
    both_channels: int = 0
    late_primary_after_fallback: int = 0
    #: of those, the ones every placement within the intervals agrees on, and the ones
    #: some placement (or what came after the last read) allows
    late_primary_certain: int = 0
    late_primary_possible: int = 0
    status_reads: int = 0
    would_page: int = 0
    #: notices the application cancelled before they ended otherwise, and why
    cancelled: int = 0
    cancelled_by_reason: Counter[str] = field(default_factory=Counter)
    #: completed resets whose fallback had gone out before the person completed (the
    #: notice cancelled then, or already ended)
    fallback_before_completion: int = 0
    #: of those, the ones whose primary had succeeded by then (the fallback was wasted),
    #: and as for late_primary_after_fallback, the certain and the possible ones
    fallback_wasted: int = 0
    fallback_wasted_certain: int = 0
    fallback_wasted_possible: int = 0
    #: fallbacks the policy would have sent after the person completed, that the cancel
    #: stopped (the notice carried on as if not cancelled, counting only this)
    fallback_avoided_by_completion: int = 0
    sent: Counter[str] = field(default_factory=Counter)
    #: notices that submitted on a channel whose timeline was borrowed
    borrowed: Counter[str] = field(default_factory=Counter)
    remaining_at_fallback: array[float] = field(default_factory=lambda: array("d"))
    time_to_acceptance: array[float] = field(default_factory=lambda: array("d"))
    queue_delay: array[float] = field(default_factory=lambda: array("d"))


def _figures(s: ReplayStats) -> dict[str, Any]:
    remaining = sorted(s.remaining_at_fallback)
    accepted = sorted(s.time_to_acceptance)
    delays = sorted(s.queue_delay)
    return {
        "notices": s.notices,
        "accepted": s.accepted,
        "accepted_primary": s.accepted_primary,
        "escalated": s.escalated,
        "expired": s.expired,
        "failed": s.failed,
        "both_channels": s.both_channels,
        "late_primary_after_fallback": s.late_primary_after_fallback,
        "status_reads": s.status_reads,
        "status_reads_per_notice": round(s.status_reads / s.notices, 3) if s.notices else 0,
        "messages_sent": {channel: s.sent.get(channel, 0) for channel in CHANNELS},
        "borrowed": {channel: s.borrowed.get(channel, 0) for channel in CHANNELS},
        "remaining_at_fallback": {
            "p50": percentile(remaining, 0.5),
            "p95": percentile(remaining, 0.95),
            "min": remaining[0] if remaining else None,
        },
        "time_to_acceptance": {
            "p50": percentile(accepted, 0.5),
            "p95": percentile(accepted, 0.95),
        },
        "would_page": s.would_page,
        "queue_delay_p95": percentile(delays, 0.95),
        "cancelled": s.cancelled,
        "cancelled_by_reason": {word: s.cancelled_by_reason.get(word, 0) for word in CANCEL_WORDS},
        "fallback_before_completion": s.fallback_before_completion,
        "fallback_wasted": s.fallback_wasted,
        "fallback_avoided_by_completion": s.fallback_avoided_by_completion,
    }


def _figure(figures: dict[str, Any], key: str) -> int:
    """``figures[a][b]`` for the key ``a.b`` (a count)."""
    value: Any = figures
    for part in key.split("."):
        value = value[part]
    return int(value)


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """One candidate's outcome over the whole trace file, under each reading."""

    policy: str
    stats: ReplayStats
    optimistic: ReplayStats = field(default_factory=ReplayStats)
    pessimistic: ReplayStats = field(default_factory=ReplayStats)
    #: how far the point estimate's alternatives move each count (None: not tried)
    envelope: Envelope | None = None

    def ranges(self) -> dict[str, list[float]]:
        """Per count figure (and messages per channel), [low, high] over the readings and
        the envelope of the point estimate's alternatives."""
        figures = [_figures(s) for s in (self.optimistic, self.pessimistic, self.stats)]
        ranges: dict[str, list[float]] = {}
        for key in COUNTS:
            values = [f[key] for f in figures]
            ranges[key] = [min(values), max(values)]
        readings = (self.optimistic, self.pessimistic, self.stats)
        ranges["late_primary_after_fallback"] = [
            min(s.late_primary_certain for s in readings),
            max(s.late_primary_possible for s in readings),
        ]
        ranges["fallback_wasted"] = [
            min(s.fallback_wasted_certain for s in readings),
            max(s.fallback_wasted_possible for s in readings),
        ]
        for channel in CHANNELS:
            values = [f["messages_sent"][channel] for f in figures]
            ranges[f"messages_sent.{channel}"] = [min(values), max(values)]
        for word in CANCEL_WORDS:
            values = [f["cancelled_by_reason"][word] for f in figures]
            ranges[f"cancelled_by_reason.{word}"] = [min(values), max(values)]
        envelope = self.envelope
        if envelope is not None:
            point = figures[2]
            low_of = {
                "late_primary_after_fallback": self.stats.late_primary_certain,
                "fallback_wasted": self.stats.fallback_wasted_certain,
            }
            high_of = {
                "late_primary_after_fallback": self.stats.late_primary_possible,
                "fallback_wasted": self.stats.fallback_wasted_possible,
            }
            for key, (low, high) in ranges.items():
                if key not in envelope.low and key not in envelope.high:
                    continue
                value = _figure(point, key)
                ranges[key] = [
                    min(low, low_of.get(key, value) + envelope.low.get(key, 0)),
                    max(high, high_of.get(key, value) + envelope.high.get(key, 0)),
                ]
        return ranges

    def to_json(self) -> dict[str, Any]:
        """The public ``--json`` shape (snake_case keys): the point estimate's figures,
        their ``range`` and each reading's figures under ``optimistic``/``pessimistic``."""
        return {
            "policy": self.policy,
            **_figures(self.stats),
            "range": self.ranges(),
            "optimistic": _figures(self.optimistic),
            "pessimistic": _figures(self.pessimistic),
        }


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Every candidate's report, plus the raw statuses no transport recognized."""

    reports: list[PolicyReport]
    unknown_statuses: Counter[tuple[str, str, str]]
    #: the trace file's header (defaults when it has none)
    header: Header = field(default_factory=Header)
    #: traces by format version
    versions: Counter[int] = field(default_factory=Counter)
