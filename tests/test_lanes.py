"""A lane's rules: its in-flight cap, its rate limit in every one-second window, its
pause after a throttle, and nearest-deadline-first order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resetctl.lanes import Lane, RateLimit


def test_a_lane_starts_no_more_than_its_cap() -> None:
    """Work beyond max_in_flight waits until a call ends."""
    lane: Lane[str] = Lane("sms", max_in_flight=2)
    for n in range(5):
        lane.put(f"n{n}", deadline=100.0, now=0.0)
    assert [item for item, _ in lane.startable(0.0)] == ["n0", "n1"]
    assert list(lane.startable(0.0)) == []
    assert lane.wake_at(0.0) is None  # waits for a call to end, not for a time
    lane.finished()
    assert [item for item, _ in lane.startable(1.0)] == ["n2"]
    assert lane.stats.peak_in_flight == 2


def test_the_nearest_deadline_goes_first() -> None:
    """Under backlog, the notice that must act soonest starts first, whatever its age."""
    lane: Lane[str] = Lane("email", max_in_flight=1)
    lane.put("late", deadline=500.0, now=0.0)
    lane.put("soon", deadline=40.0, now=1.0)
    lane.put("middle", deadline=200.0, now=2.0)
    order = []
    for now in (3.0, 4.0, 5.0):
        order += [item for item, _ in lane.startable(now)]
        lane.finished()
    assert order == ["soon", "middle", "late"]


def test_a_pause_holds_the_lane_until_it_ends() -> None:
    """A Retry-After pause starts nothing before it ends, and counts a throttle."""
    lane: Lane[str] = Lane("sms", max_in_flight=8)
    lane.put("a", deadline=100.0, now=0.0)
    lane.pause(until=7.5)
    assert list(lane.startable(7.0)) == []
    assert lane.wake_at(7.0) == 7.5
    assert list(lane.startable(7.5)) == [("a", 7.5)]
    assert (lane.stats.throttled, lane.stats.waited) == (1, 7.5)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 20),
    arrivals=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=200),
)
def test_no_one_second_window_holds_more_than_max_rate_calls(
    rate: int, arrivals: list[float]
) -> None:
    """However work arrives, the calls a rate-limited lane starts never exceed max_rate
    in any one-second window."""
    lane: Lane[int] = Lane("sms", max_in_flight=1000, rate=float(rate))
    starts: list[float] = []
    for n, at in enumerate(sorted(arrivals)):
        lane.put(n, deadline=at, now=at)
    now = 0.0
    while len(lane):
        for _ in lane.startable(now):
            starts.append(now)
        wake = lane.wake_at(now)
        now = now + 0.01 if wake is None else max(wake, now + 1e-6)
    for first in starts:
        assert sum(1 for s in starts if first <= s < first + 1.0) <= rate


def test_a_bucket_without_a_rate_never_waits() -> None:
    """No max_rate: every call may start at once."""
    bucket = RateLimit(None)
    assert all(bucket.take(0.0) for _ in range(1000))
    assert bucket.ready_at(3.0) == 3.0


def test_the_rate_counts_calls_when_they_start_not_when_they_were_scheduled() -> None:
    """Two calls scheduled at 0 s start late, at 0.6 s (a busy machine); two scheduled at
    1 s start on time: the second pair waits for the first pair's second to pass, so no
    second of real starts holds more than max_rate (here 2)."""
    lane: Lane[str] = Lane("twilio", 8, rate=2)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    for item in "abcd":
        lane.put(item, 0.0, 0.0)
    assert [item for item, _ in lane.startable(0.0)] == ["a", "b"]
    now[0] = 0.6
    starts = []
    for _ in range(2):
        lane.admit(lambda: now[0], sleep)
        starts.append(now[0])
    assert [item for item, _ in lane.startable(1.0)] == ["c", "d"]
    now[0] = 1.0
    waited = []
    for _ in range(2):
        waited.append(lane.admit(lambda: now[0], sleep))
        starts.append(now[0])
    assert waited[0] == pytest.approx(0.6)
    assert all(sum(1 for s in starts if first <= s < first + 1.0) <= 2 for first in starts)


def test_a_lane_without_a_rate_admits_every_call_at_once() -> None:
    """No max_rate: admit never waits."""
    lane: Lane[str] = Lane("smtp", 8)
    assert lane.admit(lambda: 0.0, lambda seconds: pytest.fail("slept")) == 0.0
