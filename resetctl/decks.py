"""One run's calls in the pool: each pool lane's deck, the calls sent to the pool and
what came back (see resetctl.pool for what a deck is and what it costs).

The sweep's thread owns all of this: it takes submissions from full lanes onto their
decks, starts calls, takes back what a paused lane or an instance out of use may not
call, and reads what came back. The pool's threads only make calls and hand a freed
slot to the call on deck.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from resetctl import calls
from resetctl.calls import CallResult
from resetctl.lanes import Lane
from resetctl.pool import Call, CallPool, Deck
from resetctl.routes import Routes
from resetctl.store import StepKind
from resetctl.work import Flight, Job, NotCalled

#: Why a call on deck was taken back uncalled.
HELD_BACK = "its lane paused, or its instance is out of use"
#: With calls in the pool, a claim takes this many notices per call the sweep makes at
#: once (the pass's first claim FIRST_CLAIM_PER_SLOT), at least CLAIM_LEAST and at most
#: the batch size.
CLAIM_PER_SLOT = 4
FIRST_CLAIM_PER_SLOT = 2
CLAIM_LEAST = 16
#: No bound but the batch size.
MAX_CLAIM = 1 << 30


class Decks:
    """A run's pool and its lanes' decks."""

    def __init__(
        self,
        routes: Routes,
        concurrency: int,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        skip: Callable[[Job], str | None],
    ) -> None:
        self.routes = routes
        self.clock = clock
        self.sleep = sleep
        #: why a submission should not be made now (None: it should), asked again as a
        #: call on deck starts
        self.skip = skip
        self.concurrency = concurrency
        self.pool: CallPool[list[Job]] = CallPool(concurrency)
        self._decks: dict[str, Deck[Call[list[Job]]]] = {}
        #: set as the run ends (a failure too): a call on deck is no longer made
        self.closing = False

    def in_use(self) -> bool:
        """True when some lane's calls run in the pool (not all in place)."""
        return any(key not in self.routes.in_place for key in self.routes.lanes)

    def warm(self) -> None:
        """Start the pool's threads now, when any lane will call through them."""
        if self.in_use():
            self.pool.warm()

    def claim_size(self, *, first: bool) -> int:
        """How many notices to claim at most (the batch size bounds it too). With calls
        in the pool, a few rounds of them at a time: the sweep's thread claims while
        calls run, and a claim of a whole batch would keep it from writing what came
        back (and committing the next intents) for that long. The pass's first claim
        is the smallest, so that its calls start at once."""
        if not self.in_use():
            return MAX_CLAIM  # calls made in place: nothing waits while it claims
        per_slot = FIRST_CLAIM_PER_SLOT if first else CLAIM_PER_SLOT
        return max(per_slot * self.concurrency, CLAIM_LEAST)

    def wants_more(self, flight: Flight) -> bool:
        """True when calls are running in the pool and the work in hand would no longer
        fill it twice over: claim the next batch now, while the calls still queued
        cover the time the claim takes, rather than when this one is done."""
        if not flight.pooled:
            return False
        queued = sum(len(lane) for lane in self.routes.lanes.values())
        return flight.pooled + queued + len(flight.ready) < 2 * self.concurrency

    def deck(self, lane: str) -> Deck[Call[list[Job]]]:
        """``lane``'s deck (made on first use)."""
        deck = self._decks.get(lane)
        if deck is None:
            deck = self._decks[lane] = Deck(self.routes.lanes[lane].max_in_flight)
        return deck

    def waiting(self) -> int:
        """Jobs on every deck."""
        return sum(len(deck) for deck in self._decks.values())

    def take(self) -> list[tuple[Lane[Job], Job]]:
        """Submissions to wait on their lanes' decks: the next of each full lane (every
        slot taken by a call running or starting now), while its instance is in use."""
        now = self.clock()
        taken: list[tuple[Lane[Job], Job]] = []
        for key, lane in self.routes.lanes.items():
            if key in self.routes.in_place or not len(lane):
                continue
            deck = self.deck(key)
            room = deck.room()
            while room > 0 and lane.in_flight >= lane.max_in_flight:
                job = lane.peek()
                if job is None or job.kind is not StepKind.INTENT:
                    break
                if not self.routes.in_use(job, now):
                    break
                started = lane.next_ready(now, beyond=deck.depth)
                if started is None:
                    break
                job.waited = started[1]
                taken.append((lane, job))
                room -= 1
        return taken

    def start(self, jobs: list[Job], call: Callable[[], CallResult], *, on_deck: bool) -> None:
        """Make ``call`` in the pool once its lane's rate limit admits it; ``on_deck``: a
        submission that waits on its lane's deck (checked again as it starts), unless
        none of the lane's calls is running to hand it over."""
        lane = self.routes.lane_of(jobs[0])
        admitted = partial(calls.admitted, lane, self.clock, self.sleep, call)
        deck = self.deck(jobs[0].lane)
        if on_deck:
            admitted = partial(self._from_deck, jobs[0], admitted)
            if deck.place((jobs, admitted)):
                return
        else:
            deck.begin()
        self.pool.start((jobs, admitted), deck)

    def _from_deck(self, job: Job, call: Callable[[], CallResult]) -> CallResult:
        """A submission that waited on deck, made in the thread whose slot it takes:
        checked again first (its link, its lease, the run's end)."""
        # (A pause the sweep's thread has just set, after another call was throttled.)
        held_back = HELD_BACK if self.routes.lane_of(job).stopped(self.clock()) else None
        skipped = ("the sweep ended" if self.closing else held_back) or self.skip(job)
        if skipped is not None:
            return CallResult(self.clock(), error=NotCalled(skipped))
        job.called = True
        return call()

    def running(self) -> int:
        """Calls being made now, over every lane (at least: a call may just have ended)."""
        return sum(deck.running for deck in self._decks.values())

    def promote(self) -> list[list[Job]]:
        """Decks whose calls ended without handing over: what is on them starts now,
        within the lane's cap and the sweep's concurrency, or, when its lane has paused
        or its instance is out of use, is taken back (returned: not called)."""
        now = self.clock()
        taken_back: list[list[Job]] = []
        room = self.concurrency - self.running()
        for key, deck in self._decks.items():
            if not len(deck):
                continue
            lane = self.routes.lanes[key]
            waiting = [job for jobs, _ in deck.peek_all() for job in jobs]
            if lane.stopped(now) or not all(self.routes.in_use(job, now) for job in waiting):
                taken_back += [jobs for jobs, _ in deck.recall()]
                continue
            for call in deck.promote(room):
                room -= 1
                self.pool.start(call, deck)
        return taken_back

    def came_back(self, flight: Flight, timeout: float | None) -> None:
        """Calls that came back from the pool join ``flight``'s returned (waiting up to
        ``timeout`` seconds for the first)."""
        for jobs, result in self.pool.results(timeout):
            flight.pooled -= len(jobs)
            flight.returned.append((jobs, result))

    def not_called(self, flight: Flight, taken_back: list[list[Job]], why: str) -> None:
        """Submissions taken back from their decks come back as not called (their
        intents get a declined outcome: no retry spent)."""
        for jobs in taken_back:
            flight.pooled -= len(jobs)
            flight.returned.append((jobs, CallResult(self.clock(), error=NotCalled(why))))

    def recall(self) -> list[list[Job]]:
        """Everything on every deck, taken back (the run is stopping)."""
        return [jobs for deck in self._decks.values() for jobs, _ in deck.recall()]

    def timed(self, jobs: list[Job], result: CallResult) -> None:
        """A call came back: its lane's deck follows how long calls take."""
        deck = self._decks.get(jobs[0].lane)
        if deck is not None and result.started_at is not None:
            deck.timed(result.ended_at - result.started_at)

    def close(self) -> None:
        """Nothing more starts from a deck (a run that failed leaves those intents in
        doubt: recovered as any); wait for the calls in flight to end."""
        self.closing = True
        self.recall()
        self.pool.shutdown()
