"""The sweep's calling threads and each lane's deck: a call on deck takes only the slot
of a call that ended well, so the provider never sees more than the lane's cap; what a
failed call leaves on deck waits for the sweep's thread, which starts it or takes it
back."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from resetctl.calls import CallResult
from resetctl.pool import Call, CallPool, Deck, deck_depth

#: How long a test waits for a pool thread (bounded, never a sleep).
DEADLINE = 30.0


def _call(result: CallResult | None = None) -> Callable[[], CallResult]:
    return lambda: result or CallResult(1.0)


def test_a_deck_holds_calls_only_while_one_of_its_lanes_calls_runs() -> None:
    deck: Deck[str] = Deck(cap=2)
    assert deck.place("a") is False  # nothing runs to hand it over: start it now
    assert deck.running == 1
    assert deck.place("b") is True
    assert (len(deck), deck.running) == (1, 1)


def test_a_call_that_ends_well_hands_its_slot_to_the_next_on_deck() -> None:
    deck: Deck[str] = Deck(cap=1)
    deck.begin()
    deck.place("next")
    assert deck.handover(ok=True) == "next"
    assert (len(deck), deck.running) == (0, 1)  # the slot passed on, never two at once
    assert deck.handover(ok=True) is None
    assert deck.running == 0


def test_a_failed_call_hands_nothing_over_and_the_sweep_starts_or_recalls_it() -> None:
    deck: Deck[str] = Deck(cap=1)
    deck.begin()
    deck.place("next")
    assert deck.handover(ok=False) is None  # a throttle or an error: read it first
    assert (len(deck), deck.running) == (1, 0)
    assert deck.promote() == ["next"]
    assert (len(deck), deck.running) == (0, 1)
    deck.place("later")
    assert deck.promote() == []  # the slot is taken
    assert deck.recall() == ["later"]
    assert len(deck) == 0


@pytest.mark.parametrize(
    ("cap", "call_seconds", "depth"),
    [
        (32, None, 4),  # no call has ended yet: the most
        (32, 0.05, 4),  # 32 calls of 50 ms: 6.4 end in 10 ms, at most one per 8 slots
        (64, 0.05, 8),
        (32, 0.2, 2),  # 1.6 end in 10 ms
        (32, 5.0, 1),  # a provider taking 5 s a call: one waits
        (8, 5.0, 1),
        (4, 0.001, 0),  # a small lane: none (a provider's own limit)
        (4, None, 0),
    ],
)
def test_a_deck_is_as_deep_as_the_calls_that_end_while_the_sweep_writes(
    cap: int, call_seconds: float | None, depth: int
) -> None:
    assert deck_depth(cap, call_seconds) == depth


def test_a_decks_depth_follows_its_lanes_call_times() -> None:
    deck: Deck[str] = Deck(cap=32)
    assert deck.room() == 4  # nothing known yet: the most
    for _ in range(100):
        deck.timed(5.0)  # a provider taking 5 s a call: fewer intents wait uncalled
    assert deck.room() == 1
    for _ in range(50):
        deck.timed(0.05)
    assert deck.room() == 4


def test_the_pool_goes_on_with_the_deck_in_the_thread_of_the_call_that_ended() -> None:
    pool: CallPool[str] = CallPool(2)
    deck: Deck[Call[str]] = Deck(cap=1)
    release = threading.Event()
    threads: dict[str, int] = {}

    def call(name: str, wait: bool = False) -> Callable[[], CallResult]:
        def make() -> CallResult:
            threads[name] = threading.get_ident()
            if wait:
                assert release.wait(DEADLINE)
            return CallResult(1.0)

        return make

    try:
        deck.begin()
        pool.start(("first", call("first", wait=True)), deck)
        assert deck.place(("second", call("second"))) is True
        release.set()
        came_back: list[str] = []
        while len(came_back) < 2:
            came_back += [name for name, _ in pool.results(DEADLINE)]
    finally:
        pool.shutdown()
    assert came_back == ["first", "second"]
    assert threads["second"] == threads["first"]
    assert deck.running == 0


def test_a_failed_call_leaves_the_deck_for_the_sweep() -> None:
    pool: CallPool[str] = CallPool(2)
    deck: Deck[Call[str]] = Deck(cap=1)
    failed = CallResult(1.0, error=RuntimeError("provider said no"))
    try:
        deck.begin()
        deck.place(("next", _call()))
        pool.start(("first", _call(failed)), deck)
        (back,) = pool.results(DEADLINE)
    finally:
        pool.shutdown()
    assert back[0] == "first"
    assert back[1].error is failed.error
    assert (len(deck), deck.running) == (1, 0)  # not started: the sweep decides


def test_a_call_that_raises_is_raised_in_the_sweeps_thread() -> None:
    pool: CallPool[str] = CallPool(1)
    deck: Deck[Call[str]] = Deck(cap=1)

    def broken() -> CallResult:
        raise ZeroDivisionError("a bug in a call")

    try:
        deck.begin()
        pool.start(("broken", broken), deck)
        with pytest.raises(ZeroDivisionError):
            pool.results(DEADLINE)
    finally:
        pool.shutdown()
    assert deck.running == 0


def test_many_threads_never_run_more_than_the_lanes_cap() -> None:
    """Four slots, eight threads, 400 calls put on deck as fast as they go: at no moment
    do more than four run."""
    cap, total = 4, 400
    pool: CallPool[int] = CallPool(8)
    deck: Deck[Call[int]] = Deck(cap=cap)
    lock = threading.Lock()
    running = peak = 0

    def call() -> CallResult:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        with lock:
            running -= 1
        return CallResult(1.0)

    done = 0
    try:
        for number in range(total):
            if not deck.place((number, call)):
                pool.start((number, call), deck)
            for started in deck.promote():
                pool.start(started, deck)
            done += len(pool.results(None))
        while done < total:
            for started in deck.promote():
                pool.start(started, deck)
            done += len(pool.results(0.01))
    finally:
        pool.shutdown()
    assert done == total
    assert peak <= cap
    assert deck.running == 0
