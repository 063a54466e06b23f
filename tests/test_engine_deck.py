"""A lane's deck in a sweep: while every slot of a lane is busy, its next submission's
intent is committed and waits on deck; the first of the lane's calls to end well starts
it in its own thread. The provider never sees more than the lane's cap, a crash leaves
at most the deck in doubt beyond the calls in flight, a throttle or a stopping sweep
takes what is on deck back uncalled (no retry spent), and it goes out later, once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request
from test_engine import DEADLINE, _until

from resetctl.config import LaneLimits
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports
from resetctl.transports.base import Message, ProviderStatus, ThrottledError
from resetctl.work import SweepOptions

SMS_ONLY = {"default": {"channels": ["sms"], "batch_size": 50}}


@dataclass
class Call:
    notice_id: str
    attempt_key: str
    thread: int
    at: float
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class HeldSms:
    """An SMS provider whose every call waits until the test lets that one call end. It
    counts the calls it is making at once, and dedupes by key."""

    clock: Callable[[], float]
    name: str = "held"
    recovers_by_key: bool = True
    call_timeout: float = 30.0
    #: the first call is turned away with a Retry-After of this many seconds
    throttle_first: float | None = None
    #: status reads wait here too (and count as calls in flight)
    reads: threading.Event | None = None
    calls: list[Call] = field(default_factory=list)
    submits: Counter[str] = field(default_factory=Counter)
    running: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the sweeps running against it, joined before the test's store closes
    sweeps: list[threading.Thread] = field(default_factory=list)

    def _wait_at(self, gate: threading.Event, what: str, call: Call | None = None) -> bool:
        """One call in flight (counted, with the most at once, and recorded with the
        count when it is a submission) until ``gate`` opens; True for the first one."""
        with self.lock:
            if call is not None:
                self.calls.append(call)
            first = len(self.calls) == 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            assert gate.wait(DEADLINE), f"the test never let the {what} end"
        finally:
            with self.lock:
                self.running -= 1
        return first

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        call = Call(message.notice_id, attempt_key, threading.get_ident(), self.clock())
        first = self._wait_at(call.release, "call", call)
        if first and self.throttle_first is not None:
            raise ThrottledError("slow down", retry_after=self.throttle_first)
        with self.lock:
            self.submits[attempt_key] += 1
        return ProviderStatus(f"m-{attempt_key}", "sent", Status.PENDING)

    def status(self, message_id: str) -> ProviderStatus:
        if self.reads is not None:
            self._wait_at(self.reads, "reads")
        return ProviderStatus(message_id, "delivered", Status.DELIVERED)

    def let_all_go(self) -> None:
        with self.lock:
            calls = list(self.calls)
        for call in calls:
            call.release.set()

    def close(self) -> None:
        self.let_all_go()


def _intents(reader: Store, ids: list[str]) -> list[str]:
    """The notices whose attempt is committed as an intent, with no outcome yet."""
    return [nid for nid in ids for a in reader.attempt_rows(nid) if a["state"] == "intent"]


@pytest.fixture
def held(clock: FakeClock) -> Iterator[HeldSms]:
    sms = HeldSms(clock)
    yield sms
    for sweep in sms.sweeps:  # (a failed test must not close the store under a sweep)
        while sweep.is_alive():
            sms.let_all_go()
            if sms.reads is not None:
                sms.reads.set()
            sweep.join(0.05)


def _sweep_in_background(
    store: Store, settings: Any, clock: FakeClock, held: HeldSms, concurrency: int
) -> tuple[Sweeper, threading.Thread, dict[str, Any]]:
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    transports["sms"] = held
    sweeper = Sweeper(store, settings, transports, clock=clock, sleep=clock.sleep)
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["summary"] = sweeper.run(SweepOptions("w", 50, 600.0, concurrency=concurrency))
        except BaseException as exc:  # reported by the test, not lost in the thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    held.sweeps.append(thread)
    return sweeper, thread, out


def _full_lane(
    store: Store, clock: FakeClock, held: HeldSms, texts: int
) -> tuple[Sweeper, threading.Thread, dict[str, Any], list[str]]:
    """A sweep of eight slots over ``texts`` texts, once all eight calls hang and the
    ninth text's intent waits on deck."""
    settings = make_settings(policy=SMS_ONLY)
    results = enqueue(store, settings, [reset_request() for _ in range(texts)], clock())
    ids = [r.notice_id for r in results]
    sweeper, thread, out = _sweep_in_background(store, settings, clock, held, concurrency=8)
    with Store(store.path) as reader:
        _until(lambda: len(held.calls) == 8, "eight calls in flight")
        _until(lambda: len(_intents(reader, ids)) == 9, "the deck's intent")
    return sweeper, thread, out, ids


def test_a_full_lanes_next_submission_waits_on_deck_and_takes_the_first_freed_slot(
    store: Store, clock: FakeClock, held: HeldSms
) -> None:
    """Eight slots, twelve texts: eight calls are made and one more intent is committed
    (the deck: one per eight slots), no more. When the first call ends, the next starts
    in its thread; the provider never has more than eight at once, and each text goes
    out once."""
    _, thread, out, ids = _full_lane(store, clock, held, 12)
    with Store(store.path) as reader:
        # A crash now leaves in doubt the eight calls and the one on deck: no more.
        assert len(_intents(reader, ids)) == 9
        assert held.running == 8
        first = held.calls[0]
        first.release.set()
        _until(lambda: len(held.calls) == 9, "the call on deck to start")
        assert held.calls[8].thread == first.thread  # it took the freed slot in place
        _until(lambda: len(_intents(reader, ids)) == 9, "the deck filled again")
    _until(lambda: (held.let_all_go(), len(held.submits) == 12)[1], "every text")
    thread.join(DEADLINE)
    assert "error" not in out, out
    assert held.peak == 8
    assert set(held.submits.values()) == {1}
    assert out["summary"].submitted == 12


def test_a_throttle_takes_back_the_deck_uncalled_and_it_goes_out_after_the_pause(
    store: Store, clock: FakeClock, held: HeldSms
) -> None:
    """Eight slots, nine texts: the first call is turned away with Retry-After 5 while the
    ninth text waits on deck. Nothing is called during the pause (the seven other calls
    end well, yet hand nothing over): the ninth's intent is declined (no attempt spent),
    and after the pause the first and the ninth go out, once each."""
    held.throttle_first = 5.0
    _, thread, out, ids = _full_lane(store, clock, held, 9)
    with Store(store.path) as reader:
        (on_deck,) = set(ids) - {c.notice_id for c in held.calls}
        throttled_at = clock()
        held.calls[0].release.set()
        _until(
            lambda: "declined" in [e["kind"] for e in reader.event_rows(on_deck)],
            "the deck taken back",
        )
    # The seven others end well while the lane is paused: they hand nothing over.
    _until(lambda: (held.let_all_go(), len(held.submits) == 9)[1], "every text")
    thread.join(DEADLINE)
    assert "error" not in out, out
    summary = out["summary"]
    assert (summary.throttled, summary.submitted) == (1, 9)
    after = held.calls[8:]
    assert len(after) == 2  # the throttled one's and the ninth's, once each
    assert {c.notice_id for c in after} == {held.calls[0].notice_id, on_deck}
    assert all(c.at >= throttled_at + 5.0 for c in after)  # after the pause
    for notice_id in ids:
        (attempt,) = store.attempt_rows(notice_id)
        assert (attempt["state"], attempt["calls"]) == ("submitted", 1)
    kinds = [e["kind"] for e in store.event_rows(on_deck)]
    assert kinds.count("declined") == 1  # taken back from the deck: no call, no attempt


def test_a_stopping_sweep_calls_nothing_on_deck_and_a_later_sweep_sends_it_once(
    store: Store, clock: FakeClock, held: HeldSms
) -> None:
    """Eight slots, nine texts; the sweep is told to stop while eight calls hang and the
    ninth waits on deck. The eight finish and are recorded; the ninth is not called,
    and the next sweep sends it."""
    sweeper, thread, out, ids = _full_lane(store, clock, held, 9)
    sweeper.stop()
    held.let_all_go()
    thread.join(DEADLINE)
    assert "error" not in out, out
    assert len(held.calls) == 8
    assert out["summary"].submitted == 8
    (left,) = set(ids) - {c.notice_id for c in held.calls}
    # Not left in doubt: it was never called, and its intent is undone.
    assert [a["state"] for a in store.attempt_rows(left)] == []
    assert "declined" in [e["kind"] for e in store.event_rows(left)]
    clock.advance(1)
    settings = make_settings(policy=SMS_ONLY)
    _, thread, out = _sweep_in_background(store, settings, clock, held, concurrency=8)
    _until(lambda: (held.let_all_go(), len(held.submits) == 9)[1], "the ninth text")
    thread.join(DEADLINE)
    assert "error" not in out, out
    assert set(held.submits.values()) == {1}


def test_reads_that_fill_a_lane_leave_no_room_for_a_deck_beyond_its_cap(
    store: Store, clock: FakeClock, held: HeldSms
) -> None:
    """A lane of eight in a sweep of sixteen: eight texts are due for their first status
    read and ten new ones wait. The eight reads take every slot of the lane, and the
    provider never has a ninth call at once (a new text waits on deck, and is called
    only in place of a read that ended)."""
    settings = replace(
        make_settings(policy=SMS_ONLY), lane_limits={"held": LaneLimits(max_in_flight=8)}
    )
    enqueue(store, settings, [reset_request() for _ in range(8)], clock())
    _, thread, out = _sweep_in_background(store, settings, clock, held, concurrency=16)
    _until(lambda: (held.let_all_go(), len(held.submits) == 8)[1], "the first eight texts")
    thread.join(DEADLINE)
    assert "error" not in out, out
    clock.advance(40)  # past the first poll slot
    enqueue(store, settings, [reset_request() for _ in range(10)], clock())
    held.reads = threading.Event()
    held.peak = 0
    _, thread, out = _sweep_in_background(store, settings, clock, held, concurrency=16)
    _until(lambda: held.running == 8, "eight reads in flight")
    with Store(store.path) as reader:
        _until(
            lambda: (
                reader.conn.execute(
                    "SELECT count(*) FROM attempts WHERE state = 'intent'"
                ).fetchone()[0]
                == 1
            ),
            "a new text's intent on deck",
        )
    assert (held.running, len(held.calls)) == (8, 8)  # the reads; the new text waits
    held.reads.set()
    _until(lambda: (held.let_all_go(), len(held.submits) == 18)[1], "every text")
    thread.join(DEADLINE)
    assert "error" not in out, out
    assert held.peak == 8
