"""The sweep's calling threads: a bounded pool whose calls all report to one queue, and
each lane's deck of calls ready to start the moment one of its calls ends.

A call in the pool hands its result to the sweep's thread, which writes it and commits
the intent of the call that takes the freed slot. That round trip (a thread wakes, a
transaction commits, another thread wakes) is a slot left idle on every call. A deck
keeps it off the path: the sweep commits the intents of a lane's next few submissions
while every slot of the lane is busy, and the first of the lane's calls to end well
starts the next one in its own thread, before its own result is even written. The
provider never sees more than the lane's in-flight cap: a call on deck starts only in
place of one that ended. A call that failed hands nothing over (the sweep reads its
failure first: a throttle pauses the lane, a failing instance may be taken out of use),
and the sweep takes back what is on deck when its lane pauses or the run stops.

What a deck costs: its submissions' intents are committed a little before their calls,
so a crash then leaves them in doubt with the calls in flight, recovered the same way (by
key or by lookup, never resent blindly). A deck is kept as short as its purpose allows:
as many calls as the lane's calls end in DECK_HORIZON (the time the sweep's thread takes
to write what came back and commit the next intents), at most one per eight slots (the
most, too, until one of its calls has ended), none in a lane of fewer than eight. A lane
of slow calls keeps one on deck; under no backlog a deck stays empty (it fills only
while every slot the lane can use is busy). A call on deck is checked again as it
starts: not while its lane is paused or held, nor once its link, its lease or the run
is running out.

Nothing here reads a clock or touches the database.
"""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from resetctl.calls import CallResult

T = TypeVar("T")

#: Seconds of the lane's call endings a deck covers.
DECK_HORIZON = 0.010
#: A lane keeps at most one call on deck per this many slots (a smaller lane none: one
#: that small is a provider's own limit, and its calls are few enough to wait).
SLOTS_PER_DECKED_CALL = 8
#: How much a call's time moves the lane's running average of call times.
CALL_TIME_WEIGHT = 0.1


def deck_depth(cap: int, call_seconds: float | None) -> int:
    """How many calls a lane with ``cap`` slots keeps on deck, its calls taking
    ``call_seconds`` on average (None: none has ended yet, and the first calls of a
    run all end together: the most)."""
    most = cap // SLOTS_PER_DECKED_CALL
    if call_seconds is None or most == 0:
        return most
    ending = cap * DECK_HORIZON / max(call_seconds, 1e-6)
    return max(1, min(most, math.ceil(ending)))


class Deck(Generic[T]):
    """One lane's calls running in the pool, and the ones ready to take a freed slot.

    ``running`` counts the lane's calls being made right now, over every thread; a call
    leaves the deck only to take the slot of one that ended, so ``running`` never passes
    the number of slots the sweep gave the lane.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        #: the lane's calls' average time, from the ones that ended (None: none yet)
        self.call_seconds: float | None = None
        self._lock = threading.Lock()
        self._ready: deque[T] = deque()
        self.running = 0

    def __len__(self) -> int:
        return len(self._ready)

    def timed(self, seconds: float) -> None:
        """One of the lane's calls took ``seconds``: the deck's depth follows."""
        average = self.call_seconds
        average = seconds if average is None else average + CALL_TIME_WEIGHT * (seconds - average)
        self.call_seconds = average

    @property
    def depth(self) -> int:
        """How many calls may wait on deck now (see deck_depth)."""
        return deck_depth(self.cap, self.call_seconds)

    def room(self) -> int:
        """How many more calls may wait on deck."""
        return max(0, self.depth - len(self._ready))

    def begin(self) -> None:
        """A call of this lane is about to start in the pool."""
        with self._lock:
            self.running += 1

    def place(self, item: T) -> bool:
        """Put ``item`` on deck; False (and counted as starting) when none of the lane's
        calls is running to hand it over: the caller starts it at once."""
        with self._lock:
            if self.running == 0:
                self.running += 1
                return False
            self._ready.append(item)
            return True

    def handover(self, ok: bool) -> T | None:
        """A call of this lane ended (``ok``: without an error): the call on deck that
        takes its slot, or None (the slot is free)."""
        with self._lock:
            if ok and self._ready:
                return self._ready.popleft()
            self.running -= 1
            return None

    def promote(self, room: int | None = None) -> list[T]:
        """Calls on deck that may start now, within the lane's cap (at most ``room``),
        each counted as starting: slots freed by calls that handed nothing over."""
        started: list[T] = []
        with self._lock:
            while self._ready and self.running < self.cap and (room is None or len(started) < room):
                self.running += 1
                started.append(self._ready.popleft())
        return started

    def peek_all(self) -> list[T]:
        """What waits on deck, left there."""
        with self._lock:
            return list(self._ready)

    def recall(self) -> list[T]:
        """Everything on deck, taken back (its lane paused, or the run is stopping)."""
        with self._lock:
            items = list(self._ready)
            self._ready.clear()
        return items


#: One call of the pool: the jobs it is for, and the call itself.
Call = tuple[T, Callable[[], CallResult]]


class CallPool(Generic[T]):
    """At most ``size`` calls at once, each on one of the pool's threads, every result put
    on one queue as it ends (a call that raised puts its exception).

    The threads are started together, from a thread of their own (:meth:`warm`), while
    the sweep's thread claims and commits the first intents: a thread started on demand
    would hold up each of the first calls while it starts.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._work: queue.SimpleQueue[tuple[Call[T], Deck[Call[T]]] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[T, CallResult | BaseException]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._starter: threading.Thread | None = None
        #: why the threads could not all be started (raised in the sweep's thread)
        self._failed: BaseException | None = None

    def warm(self) -> None:
        """Start the threads (once), without waiting for them."""
        if self._starter is None:
            self._starter = threading.Thread(
                target=self._start_threads, name="resetctl-call-start", daemon=True
            )
            self._starter.start()

    def _start_threads(self) -> None:
        try:
            for number in range(self.size):
                thread = threading.Thread(
                    target=self._serve, name=f"resetctl-call-{number}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        except BaseException as exc:  # (the machine's thread limit, memory)
            self._failed = exc

    def start(self, call: Call[T], deck: Deck[Call[T]]) -> None:
        """Make ``call`` on a pool thread (its deck already counts it as running); when
        it ends well, that thread goes on with the deck's next call."""
        self.warm()
        self._work.put((call, deck))

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            self._run(*work)

    def _run(self, call: Call[T], deck: Deck[Call[T]]) -> None:
        current: Call[T] | None = call
        while current is not None:
            item, make = current
            try:
                result = make()
            except BaseException as exc:  # a bug: the sweep's thread raises it
                deck.handover(ok=False)
                self._results.put((item, exc))
                return
            current = deck.handover(ok=result.error is None)
            self._results.put((item, result))

    def results(self, timeout: float | None) -> list[tuple[T, CallResult]]:
        """What came back: waits up to ``timeout`` seconds for the first result (None or
        0: does not wait), then takes whatever else is there. Raises what kept the
        threads from starting, or what a call raised."""
        if self._failed is not None:
            raise RuntimeError("the sweep's calling threads could not start") from self._failed
        pending: list[tuple[T, CallResult | BaseException]] = []
        try:
            pending.append(
                self._results.get(timeout=timeout) if timeout else self._results.get_nowait()
            )
            while True:
                pending.append(self._results.get_nowait())
        except queue.Empty:
            pass
        found: list[tuple[T, CallResult]] = []
        for item, outcome in pending:
            if isinstance(outcome, BaseException):
                raise outcome
            found.append((item, outcome))
        return found

    def shutdown(self) -> None:
        """Wait for every call to end, then let the threads go."""
        if self._starter is None:
            return
        self._starter.join()
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._starter = None
