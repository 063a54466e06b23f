"""The readings a simulated notice carries, and the envelope that brings the point
estimate's alternatives into the range.

Three readings are reported (optimistic, pessimistic, point estimate). Beside the point
estimate a notice carries alternatives the traces cannot rule out: its sweeps acting a
little earlier or later than simulated (where in a second a real sweep's look fell, how
late cron started it), and other borrowed timelines for a channel it never used. Each
is a bit of a notice's mask like the three, forks off only where it decides otherwise,
and is never counted on its own: per notice, the lowest and the highest value of each
count over the point estimate and its alternatives go into the range (the envelope),
so a range covers every way each notice could have gone, not one draw of them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from resetctl.machine import NoticeState, Status
from resetctl.replay.traces import (
    ALL_SCENARIOS,
    CANCEL_WORDS,
    CHANNELS,
    NEVER_ANSWERS_3,
    POINT,
    Trace,
)


class _Live(Protocol):
    """What these figures read of a simulated notice (the simulation's copy of one)."""

    trace: Trace
    state: NoticeState
    fallback_at: float | None
    submitted_at: dict[str, float]
    sent: dict[str, int]


#: The point estimate's sweeps acting the timing slack earlier, and later.
EARLY, LATE = 3, 4
#: Borrowed timelines per channel a notice never used: the point estimate's, and this
#: many less one more (bits FIRST_DRAW onwards).
BORROW_DRAWS = 6
FIRST_DRAW = 5
#: Every reading a simulated notice can carry.
READINGS = FIRST_DRAW + BORROW_DRAWS - 1
ALL_READINGS = (1 << READINGS) - 1
#: The three readings the report shows (each has its own counters).
SHOWN = ALL_SCENARIOS
TIMING = 1 << EARLY | 1 << LATE
BORROWS = ALL_READINGS & ~((1 << FIRST_DRAW) - 1)
#: The point estimate and its alternatives: the readings the envelope runs over.
POINT_FAMILY = 1 << POINT | TIMING | BORROWS

#: Per mask, its readings in order.
BITS = tuple(tuple(r for r in range(READINGS) if mask >> r & 1) for mask in range(1 << READINGS))

#: Figures reported as a range (optimistic to pessimistic, point estimate included).
COUNTS = (
    "accepted",
    "accepted_primary",
    "escalated",
    "expired",
    "failed",
    "both_channels",
    "late_primary_after_fallback",
    "status_reads",
    "would_page",
    "cancelled",
    "fallback_before_completion",
    "fallback_wasted",
    "fallback_avoided_by_completion",
)

#: The figures the envelope widens: every count the range reports. A notice contributes
#: (low, high) to each; the same but for the late primary and the wasted fallback, whose
#: ranges run from the certain to the possible.
ENVELOPE_FIGURES = (
    # The report's range counts but one: fallback_avoided_by_completion is ranged over
    # the readings only, not notice by notice.
    *(c for c in COUNTS if c != "fallback_avoided_by_completion"),
    *(f"messages_sent.{channel}" for channel in CHANNELS),
    *(f"cancelled_by_reason.{word}" for word in CANCEL_WORDS),
)

Figures = Mapping[str, tuple[int, int]]


class Envelope:
    """Per figure, how far the point estimate's alternatives can move its count: summed
    over notices, each at its lowest (``low``, ≤ 0) and at its highest (``high``, ≥ 0)
    against the point estimate's own value for that notice."""

    def __init__(self, family: int) -> None:
        #: the readings every notice carries of POINT_FAMILY
        self.family = family
        self.low: dict[str, int] = {}
        self.high: dict[str, int] = {}
        #: per notice whose alternatives forked: readings still to end, the point
        #: estimate's figures, and the lowest and highest so far
        self._open: dict[int, tuple[int, Figures | None, dict[str, int], dict[str, int]]] = {}

    def add(self, notice: int, mask: int, figures: Figures) -> None:
        """One copy of ``notice`` ended with ``figures`` under the readings in ``mask``."""
        family = mask & self.family
        if not family or family == self.family:
            return  # every alternative agrees with the point estimate, or none is here
        left, base, low, high = self._open.get(notice, (self.family, None, {}, {}))
        if family >> POINT & 1:
            base = figures
        for key, (lo, hi) in figures.items():
            low[key] = min(low.get(key, lo), lo)
            high[key] = max(high.get(key, hi), hi)
        left &= ~family
        if left:
            self._open[notice] = (left, base, low, high)
            return
        self._open.pop(notice, None)
        assert base is not None
        for key, (lo, hi) in base.items():
            self.low[key] = self.low.get(key, 0) + low[key] - lo
            self.high[key] = self.high.get(key, 0) + high[key] - hi


def copy_figures(
    live: _Live,
    phase_counts: Mapping[str, int],
    late: tuple[bool, bool],
    wasted: tuple[bool, bool],
) -> dict[str, tuple[int, int]]:
    """What one ended copy of a notice adds to each envelope figure, as (low, high)."""
    figures = {key: (int(value), int(value)) for key, value in phase_counts.items()}
    figures["late_primary_after_fallback"] = (int(late[0]), int(late[1]))
    figures["fallback_wasted"] = (int(wasted[0]), int(wasted[1]))
    for channel in CHANNELS:
        sent = live.sent.get(channel, 0)
        figures[f"messages_sent.{channel}"] = (sent, sent)
    return figures


def late_primary(
    live: _Live, primary: str, success: frozenset[str], until: float | None = None
) -> tuple[bool, bool]:
    """Whether the primary's success came after the fallback and before ``until`` (expiry,
    or the cancel if sooner): certainly (its whole interval lies there), and possibly
    (some of it does, or the primary was still open at its last read, before then). Not
    monotone in when changes happened, so neither reading alone bounds it."""
    assert live.fallback_at is not None
    if until is None:
        until = live.state.expires_at
    observed = live.trace.observations.get(primary)
    if observed is None or primary in live.trace.borrowed:
        timeline = live.trace.timelines.get(primary, NEVER_ANSWERS_3)[POINT]
        at = timeline.first_success(success)
        late = at is not None and (live.fallback_at < live.submitted_at[primary] + at < until)
        return late, late
    after = live.fallback_at - live.submitted_at[primary]
    before = until - live.submitted_at[primary]
    for lo, hi, status in observed.changes:
        if status in success:
            return after <= lo and hi < before, lo < before and hi > after
        if status is Status.FAILED and hi <= after:
            return False, False
    return False, observed.open and observed.end < before


def primary_succeeded_by(
    live: _Live, primary: str, success: frozenset[str], until: float
) -> tuple[bool, bool]:
    """Whether the primary had succeeded by ``until`` (a completed reset's cancel):
    certainly (its whole interval lies before), and possibly (some of it does, or the
    primary was still open at its last read, before then). With a fallback already sent,
    that fallback was wasted: the person could have used the primary."""
    observed = live.trace.observations.get(primary)
    if observed is None or primary in live.trace.borrowed:
        timeline = live.trace.timelines.get(primary, NEVER_ANSWERS_3)[POINT]
        at = timeline.first_success(success)
        done = at is not None and live.submitted_at[primary] + at <= until
        return done, done
    by = until - live.submitted_at[primary]
    for lo, hi, status in observed.changes:
        if status in success:
            certain = hi <= by
            return certain, certain or lo < by
        if status is Status.FAILED:
            return False, False
    return False, observed.open and observed.end < by
