"""Interval-censored traces: export, ranges, borrowed channels, late primary evidence,
cancels under every reading."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request
from hypothesis import given, settings
from hypothesis import strategies as st

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.ops import health
from resetctl.replay import (
    Candidate,
    DelayFit,
    Header,
    SimulationOptions,
    read_header,
    read_traces,
    replay,
    with_header,
)
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.timings import export_timings
from resetctl.transports import Message, ProviderStatus
from resetctl.work import SweepOptions

DEFAULT = make_settings()


class TrueTransport:
    """Answers each message's status from its true timeline (seconds after submission)."""

    name = "outbox"
    recovers_by_key = True
    call_timeout = 5.0

    def __init__(self, clock: FakeClock, timelines: dict[str, list[tuple[float, str]]]) -> None:
        self.clock = clock
        self.timelines = timelines
        self.sent: dict[str, tuple[str, float]] = {}

    def _reply(self, message_id: str) -> ProviderStatus:
        key, at = self.sent[message_id]
        raw = "pending"
        for offset, status in self.timelines.get(key, []):
            if offset <= self.clock() - at:
                raw = status
        return ProviderStatus(message_id, raw, Status(raw))

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        message_id = f"m-{attempt_key}"
        self.sent.setdefault(message_id, (message.notice_id, self.clock()))
        return self._reply(message_id)

    def status(self, message_id: str) -> ProviderStatus:
        return self._reply(message_id)

    def close(self) -> None:
        pass


def run(
    store: Store,
    clock: FakeClock,
    settings: Settings,
    email: list[tuple[float, str]],
    sms: list[tuple[float, str]],
    **request: Any,
) -> str:
    """One notice with true email and SMS timelines, swept every 5 s until it ends."""
    (result,) = enqueue(store, settings, [reset_request(**request)], clock())
    transports = {
        "email": TrueTransport(clock, {result.notice_id: email}),
        "sms": TrueTransport(clock, {result.notice_id: sms}),
    }
    sweeper = Sweeper(store, settings, transports, clock=clock, sleep=clock.sleep)
    while store.next_due_at() is not None:
        sweeper.run(SweepOptions("test", 50, 60.0, 0.0))
        clock.advance(5)
    return result.notice_id


def test_exported_intervals_bound_each_true_change_and_read_back(
    store: Store, clock: FakeClock
) -> None:
    """Each change is exported as (last read without it, first read with it] in ms, with
    the end of observation, and replay reads the same intervals back."""
    run(store, clock, DEFAULT, [(20.0, "accepted")], [])
    header, trace = export_timings(store, 0, math.inf)
    assert header["timings"] == 2
    assert header["read_lag"]["reads"] == 2
    email = trace["email"]
    assert trace["version"] == 2
    assert "sms" not in trace  # never used: unknown, not silent
    assert email["seen"][0] == [0, 0, "pending"]
    (after, by, raw) = email["seen"][1]
    assert raw == "accepted"
    assert after < 20_000 <= by
    assert email["end_ms"] == by
    lines = [json.dumps(header), json.dumps(trace)]
    (parsed,) = read_traces(lines, Counter())
    observed = parsed.observations["email"]
    assert observed.changes[1] == (after / 1000, by / 1000, Status.ACCEPTED)
    assert observed.end == by / 1000
    assert read_header(lines).first_sweep_at is not None


def test_version_1_traces_replay_as_zero_width_intervals() -> None:
    """A version-1 trace replays as before: every reading agrees, so each range is a point."""
    lines = [
        json.dumps({"trace_id": "a", "arrived_at": 0, "ttl": 600, "email": [[20, "delivered"]]}),
        json.dumps(
            {
                "trace_id": "b",
                "arrived_at": 3,
                "ttl": 600,
                "email": [[30, "failed"]],
                "sms": [[4, "delivered"]],
            }
        ),
        json.dumps({"trace_id": "c", "arrived_at": 9, "ttl": 600}),
    ]
    (report,) = replay(lines, [Candidate("current", DEFAULT.policies)], SimulationOptions()).reports
    summary = report.to_json()
    assert all(low == high for low, high in summary["range"].values())
    assert (summary["accepted"], summary["escalated"], summary["expired"]) == (2, 2, 1)
    assert summary["borrowed"] == {"email": 0, "sms": 0}


def _v2(trace_id: str, arrived_at: float, **channels: Any) -> str:
    return json.dumps(
        {"version": 2, "trace_id": trace_id, "arrived_at": arrived_at, "ttl": 600, **channels}
    )


def test_a_channel_never_used_is_borrowed_not_silent() -> None:
    """An SMS a notice never needed is drawn from observed SMS timelines and counted."""
    bounced = {"seen": [[0, 0, "pending"], [15000, 45000, "failed"]], "end_ms": 45000}
    lines = [
        _v2("observed", 0, email=bounced, sms={"seen": [[0, 2000, "delivered"]], "end_ms": 2000}),
        _v2("unused", 200, email=bounced),
    ]
    options = SimulationOptions()
    (report,) = replay(lines, [Candidate("current", DEFAULT.policies)], options).reports
    summary = report.to_json()
    assert summary["borrowed"]["sms"] == 1
    assert summary["accepted"] == 2  # a never-answering SMS would have expired it
    for reading in ("optimistic", "pessimistic"):
        assert summary[reading]["borrowed"]["sms"] == 1


def test_a_read_inside_an_interval_gives_a_range_around_the_point_estimate() -> None:
    """Reading at 10 s a delivery known only to lie in (0 s, 15 s]: accepted on the
    primary at best, escalated at worst, the point estimate in between."""
    seen = {"seen": [[0, 0, "pending"], [0, 15000, "delivered"]], "end_ms": 15000}
    lines = [_v2(f"t{n}", n * 7.0, email=seen) for n in range(40)]
    earlier = make_settings(policy={"default": {"email": {"poll_delays": [10]}}})
    options = SimulationOptions(max_runtime=55)
    (report,) = replay(lines, [Candidate("earlier", earlier.policies)], options).reports
    low, high = report.ranges()["accepted_primary"]
    assert (low, high) == (0, 40)
    assert low <= report.stats.accepted_primary <= high


def test_the_point_estimate_is_reproducible_with_a_seed() -> None:
    """The same --seed gives the same point estimate; the range does not depend on it."""
    seen = {"seen": [[0, 0, "pending"], [15000, 45000, "delivered"]], "end_ms": 45000}
    lines = [_v2(f"t{n}", n * 3.0, email=seen) for n in range(60)]
    candidate = Candidate(
        "c", make_settings(policy={"default": {"email": {"poll_delays": [15, 30]}}}).policies
    )
    runs = [
        replay(lines, [candidate], SimulationOptions(), seed=seed).reports[0].to_json()
        for seed in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0]["range"] == runs[2]["range"]


def test_the_delay_fit_recovers_a_log_normal_with_a_never_share() -> None:
    """Intervals from reads at 15/45/105 s recover the median delay and the never-share."""
    rng = random.Random(3)
    intervals: list[tuple[float, float]] = []
    for _ in range(2000):
        if rng.random() < 0.2:
            intervals.append((105.0, math.inf))
            continue
        at = rng.lognormvariate(math.log(25), 1.0)
        slots = [0.0, 15.0, 45.0, 105.0]
        for lo, hi in itertools.pairwise(slots):
            if lo < at <= hi:
                intervals.append((lo, hi))
                break
        else:
            intervals.append((105.0, math.inf))
    fit = DelayFit(intervals)
    assert math.exp(fit.mu) == pytest.approx(25, rel=0.15)
    assert fit.never == pytest.approx(0.2, abs=0.05)
    assert fit.sample(45, 105, 0.0) == pytest.approx(45, abs=0.01)
    assert fit.sample_after(105, 0.999, 0.5) is None


def test_the_cron_phase_and_read_lag_come_from_the_header() -> None:
    """Without options, the first sweep comes when the header says, and reads lag."""
    header = Header(sweep_interval=60.0, first_sweep_at=40.0, read_lag_p50=0.5)
    options = with_header(SimulationOptions(), header)
    assert (options.first_sweep_at, options.read_lag) == (40.0, 0.5)
    assert with_header(SimulationOptions(), header, read_lag=0.0).read_lag == 0.0
    line = json.dumps({"trace_id": "a", "arrived_at": 0, "ttl": 600, "email": [[1, "accepted"]]})
    (report,) = replay([line], [Candidate("c", DEFAULT.policies)], options).reports
    assert report.to_json()["queue_delay_p95"] == 40.0


def test_a_late_primary_success_after_a_fallback_is_observed_counted_and_exported(
    store: Store, clock: FakeClock
) -> None:
    """A 250 s link escalates after the 45 s read with the 105 s slot left; the email
    delivered at 90 s is read there, ends the notice accepted without reopening it or
    sending again, health counts it and the export carries it."""
    clock.now = T0
    notice_id = run(
        store,
        clock,
        DEFAULT,
        [(90.0, "delivered")],
        [(2.0, "accepted")],
        ttl=250,
    )
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"
    channels = Counter(a.channel for a in loaded.state.attempts)
    assert channels == {"email": 1, "sms": 1}
    assert health(store, clock(), 3600)["late_primary_after_fallback"] == 1
    _, trace = export_timings(store, 0, math.inf)
    email_seen = trace["email"]["seen"]
    assert email_seen[-1][2] == "delivered"
    assert email_seen[-1][:2] == [45_000, 105_000]  # read at its last slot, after the SMS
    reopened = [e for e in store.event_rows(notice_id) if e["old_phase"] == "accepted"]
    assert all(e["new_phase"] == "accepted" for e in reopened)


def test_replay_counts_a_late_primary_after_fallback_within_its_range(tmp_path: Path) -> None:
    """An exported late primary success replays as one, inside the figure's range."""
    store_path = tmp_path / "late.db"
    clock = FakeClock()
    with Store(store_path) as store:
        run(store, clock, DEFAULT, [(90.0, "delivered")], [(2.0, "accepted")], ttl=250)
        lines = [json.dumps(t) for t in export_timings(store, 0, math.inf)]
    options = with_header(SimulationOptions(), read_header(lines))
    (report,) = replay(lines, [Candidate("current", DEFAULT.policies)], options).reports
    summary = report.to_json()
    assert summary["accepted"] == 1
    low, high = summary["range"]["late_primary_after_fallback"]
    assert low <= 1 <= high


@st.composite
def cancelled_interval_traces(draw: st.DrawFn) -> list[str]:
    """A few version-2 traces whose changes lie in wide intervals, some cancelled at any
    time (before the first sweep, between reads, after the link died)."""
    lines = []
    arrived = 0.0
    for number in range(draw(st.integers(1, 6))):
        arrived += draw(st.floats(0, 90))
        trace: dict[str, Any] = {
            "version": 2,
            "trace_id": f"t{number}",
            "arrived_at": arrived,
            "ttl": draw(st.sampled_from([240, 600])),
        }
        for channel in ("email", "sms"):
            if draw(st.booleans()):
                after = draw(st.integers(0, 120_000))
                by = after + draw(st.integers(0, 120_000))
                raw = draw(st.sampled_from(["delivered", "failed", "pending"]))
                trace[channel] = {"seen": [[after, by, raw]], "end_ms": by}
        if draw(st.booleans()):
            why = draw(st.sampled_from(["completed", "superseded", "withdrawn"]))
            trace["cancelled"] = [draw(st.integers(0, 700_000)), why]
        lines.append(json.dumps(trace))
    return lines


@settings(max_examples=60, deadline=None)
@given(
    lines=cancelled_interval_traces(),
    max_runtime=st.sampled_from([0.0, 55.0]),
    slack=st.sampled_from([0.0, 1.0, 30.0]),
)
def test_every_reading_ends_every_notice_once_with_cancels(
    lines: list[str], max_runtime: float, slack: float
) -> None:
    """Whatever the cancels, intervals and slack, each reading ends each notice once, in range."""
    # Cancels count by reason, and every count's range holds its point estimate.
    options = SimulationOptions(max_runtime=max_runtime, timing_slack=slack)
    (report,) = replay(lines, [Candidate("c", DEFAULT.policies)], options).reports
    summary = report.to_json()
    for reading in (summary, summary["optimistic"], summary["pessimistic"]):
        ended = [reading[key] for key in ("accepted", "expired", "failed", "cancelled")]
        assert sum(ended) == reading["notices"] == len(lines)
        assert sum(reading["cancelled_by_reason"].values()) == reading["cancelled"]
        assert reading["fallback_wasted"] <= reading["fallback_before_completion"]
        assert reading["fallback_before_completion"] <= reading["escalated"]
    for key, (low, high) in summary["range"].items():
        point: Any = summary
        for part in key.split("."):
            point = point[part]
        assert low <= point <= high, key
