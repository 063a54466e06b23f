"""Lanes: each transport's own share of a sweep's provider calls.

A lane has an in-flight cap (``[<transport>] max_in_flight``), a rate limit
(``[<transport>] max_rate`` calls in any second, shared by submissions, status reads and
lookups) and a pause (a 429's ``Retry-After``). Work waits in its lane ordered by the
deadline of the notice's next useful action, so under backlog the nearest deadline
goes first, and a slow or throttled provider holds only its own lane.

Nothing here calls a provider, reads a clock or touches the database: the sweep asks a
lane what may start at ``now`` and tells it when a call ends.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class RateLimit:
    """At most ``rate`` calls in any one-second window (a sliding window over the
    latest starts, so no window ever holds more, bursts included). A fractional rate
    is rounded down, and below one a call per ``1 / rate`` seconds."""

    #: calls per second; None for no limit
    rate: float | None
    _starts: deque[float] = field(default_factory=deque, init=False)

    @property
    def _limit(self) -> int:
        assert self.rate is not None
        return max(1, int(self.rate))

    @property
    def _window(self) -> float:
        assert self.rate is not None
        return max(1.0, 1.0 / self.rate)

    def ready_at(self, now: float) -> float:
        """When a call could start (``now`` if it can now)."""
        if self.rate is None or len(self._starts) < self._limit:
            return now
        return max(now, self._starts[len(self._starts) - self._limit] + self._window)

    def take(self, now: float) -> bool:
        """Count a call starting at ``now``; False when the window is full."""
        if self.rate is None:
            return True
        while self._starts and self._starts[0] + self._window <= now:
            self._starts.popleft()
        if len(self._starts) >= self._limit:
            return False
        self._starts.append(now)
        return True


@dataclass(slots=True)
class LaneStats:
    """What a lane did in one sweep (health and metrics add them up per transport)."""

    #: calls started
    calls: int = 0
    #: calls the provider throttled (429 and the like)
    throttled: int = 0
    #: seconds work waited in the lane for a slot, a token or the end of a pause
    waited: float = 0.0
    #: the most calls in flight at once
    peak_in_flight: int = 0


@dataclass(slots=True)
class _Waiting(Generic[T]):
    item: T
    since: float


class Lane(Generic[T]):
    """One transport's queue, in-flight cap, rate limit and pause."""

    def __init__(self, name: str, max_in_flight: int, rate: float | None = None) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.name = name
        self.max_in_flight = max_in_flight
        self.bucket = RateLimit(rate)
        #: the same limit over the calls' real starts, shared by the calling threads
        self._starts = RateLimit(rate)
        self._gate = threading.Lock()
        self.in_flight = 0
        self.paused_until = 0.0
        #: nothing starts before this either: its instance is out of use, or probing
        self.held_until = 0.0
        self.stats = LaneStats()
        self._queue: list[tuple[float, int, _Waiting[T]]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, item: T, deadline: float, now: float) -> None:
        """Queue work whose notice must act by ``deadline``."""
        heapq.heappush(self._queue, (deadline, next(self._order), _Waiting(item, now)))

    def pause(self, until: float) -> None:
        """Start nothing before ``until`` (a provider asked us to back off)."""
        self.paused_until = max(self.paused_until, until)
        self.stats.throttled += 1

    def hold(self, until: float) -> None:
        """Start nothing before ``until`` (its instance's health says so; 0 releases)."""
        self.held_until = until

    def _stopped_until(self) -> float:
        return max(self.paused_until, self.held_until)

    def head(self) -> float | None:
        """The deadline of the work that would start next (None when nothing waits)."""
        return self._queue[0][0] if self._queue else None

    def peek(self) -> T | None:
        """The work that would start next, left in the queue."""
        return self._queue[0][2].item if self._queue else None

    def stopped(self, now: float) -> bool:
        """True while a pause or a hold lets nothing start."""
        return now < self._stopped_until()

    def next_ready(self, now: float, beyond: int = 0) -> tuple[T, float] | None:
        """The work with the nearest deadline, if it may start at ``now`` (a slot free,
        a token left, no pause), with the seconds it waited in the lane; it counts as in
        flight until :meth:`finished`. ``beyond``: as many more than the cap may be
        taken (to wait on the lane's deck for a slot)."""
        if (
            not self._queue
            or self.in_flight >= self.max_in_flight + beyond
            or now < self._stopped_until()
        ):
            return None
        if not self.bucket.take(now):
            return None
        _, _, waiting = heapq.heappop(self._queue)
        self.in_flight += 1
        self.stats.calls += 1
        waited = max(0.0, now - waiting.since)
        self.stats.waited += waited
        # (Beyond the cap are calls waiting on a deck, not calls being made.)
        running = min(self.in_flight, self.max_in_flight)
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, running)
        return waiting.item, waited

    def startable(self, now: float) -> Iterator[tuple[T, float]]:
        """Every work that may start at ``now``, nearest deadline first (see
        :meth:`next_ready`)."""
        while (started := self.next_ready(now)) is not None:
            yield started

    def finished(self) -> None:
        """A call this lane started has ended."""
        self.in_flight -= 1

    def admit(self, clock: Callable[[], float], sleep: Callable[[float], None]) -> float:
        """Wait until the rate limit lets a call start, counted at its real start; the
        seconds waited. The token taken when the work left the queue spaces when calls
        are scheduled; between then and the request (an intent's commit, a thread to run
        on, a busy machine) the delays differ, and this is what keeps the provider from
        seeing more than max_rate in a second. Called from the calling threads."""
        if self.bucket.rate is None:
            return 0.0
        waited = 0.0
        while True:
            with self._gate:
                now = clock()
                if self._starts.take(now):
                    return waited
                pause = max(self._starts.ready_at(now) - now, 0.001)
            sleep(pause)
            waited += pause

    def withdrawn(self) -> None:
        """Work this lane started is not called after all (an SMS its country's cap
        skipped, a shadow notice's would-send): its slot is free and it is no call."""
        self.in_flight -= 1
        self.stats.calls -= 1

    def wake_at(self, now: float) -> float | None:
        """When queued work could next start, if it cannot now (None: nothing queued, or
        it waits only for a call in flight to end)."""
        if not self._queue:
            return None
        if now < self._stopped_until():
            return self._stopped_until()
        if self.in_flight >= self.max_in_flight:
            return None
        return self.bucket.ready_at(now)

    def drain(self) -> list[T]:
        """Everything still queued, taken out (a stopping sweep hands it back)."""
        items = [waiting.item for _, _, waiting in sorted(self._queue)]
        self._queue.clear()
        return items


def take_startable(
    lanes: Mapping[str, Lane[T]], in_place: Set[str], room: int, now: float
) -> list[tuple[Lane[T], T, float]]:
    """Work the lanes let start at ``now``, nearest deadline first across lanes, with
    the seconds each waited: at most ``room`` calls, not counting lanes whose calls run
    in place (they end as they start, so they take no room)."""
    started: list[tuple[Lane[T], T, float]] = []
    while room > 0:
        heads = sorted(
            (deadline, name)
            for name, lane in lanes.items()
            if (deadline := lane.head()) is not None
        )
        for _, name in heads:
            taken = lanes[name].next_ready(now)
            if taken is not None:
                started.append((lanes[name], *taken))
                if name not in in_place:
                    room -= 1
                break
        else:
            break
    return started


def lane_counts(
    lanes: Mapping[str, Lane[T]], names: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """Each transport's counts from its lanes (``names``: lane to transport name; one
    transport may serve two lanes): calls, throttled, seconds waited, peak in flight."""
    counts: dict[str, dict[str, float]] = {}
    for channel, lane in lanes.items():
        stats = lane.stats
        if not stats.calls and not stats.throttled:
            continue
        into = counts.setdefault(names[channel], {})
        into["calls"] = into.get("calls", 0) + stats.calls
        into["throttled"] = into.get("throttled", 0) + stats.throttled
        into["waited_seconds"] = into.get("waited_seconds", 0) + stats.waited
        into["peak_in_flight"] = max(into.get("peak_in_flight", 0), stats.peak_in_flight)
    return counts
