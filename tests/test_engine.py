"""The delivery engine: calls fan out through per-transport lanes, writes funnel in. A
slow provider holds only its own lane, a failure read's fallback goes out at once, a
provider's rate and Retry-After are kept, and the nearest deadline goes first. Each
test counts what happened; none times a sweep."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, run_sweep
from providers_twilio import SENDER, FakeTwilio
from test_ambiguity_end_to_end import ENVIRON

from resetctl import ops
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.report import notice_report
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports, close_transports
from resetctl.transports.base import Message, ProviderStatus
from resetctl.work import SweepOptions

#: How long a test waits for another thread to get somewhere (bounded, never a sleep).
DEADLINE = 30.0
SMS_FIRST = {"channels": ["sms", "email"]}


@dataclass
class GatedSms:
    """An SMS provider whose calls wait at a gate the test opens (a provider taking 5 s
    a call today, without the test waiting 5 s). It dedupes by key."""

    gate: threading.Event = field(default_factory=threading.Event)
    name: str = "gated"
    recovers_by_key: bool = True
    call_timeout: float = 30.0
    status_of: Callable[[str], str] = lambda _key: "delivered"
    gate_reads: bool = False
    in_flight: int = 0
    submits: Counter[str] = field(default_factory=Counter)
    reads: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _wait(self) -> None:
        with self.lock:
            self.in_flight += 1
        try:
            assert self.gate.wait(DEADLINE), "the test never opened the gate"
        finally:
            with self.lock:
                self.in_flight -= 1

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        with self.lock:
            self.submits[attempt_key] += 1
        self._wait()
        return ProviderStatus(f"m-{attempt_key}", "queued", Status.PENDING)

    def status(self, message_id: str) -> ProviderStatus:
        raw = self.status_of(message_id)
        with self.lock:
            self.reads.append(message_id)
        if self.gate_reads and raw != "undelivered":
            self._wait()
        status = Status.FAILED if raw == "undelivered" else Status.DELIVERED
        return ProviderStatus(message_id, raw, status)

    def close(self) -> None:
        self.gate.set()


def _until(condition: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > give_up:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def gated() -> Iterator[GatedSms]:
    sms = GatedSms()
    yield sms
    sms.gate.set()


def _in_background(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = work()
        except BaseException as exc:  # reported by the test, not lost in the thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_slow_provider_does_not_delay_another_providers_submissions(
    store: Store, clock: FakeClock, gated: GatedSms
) -> None:
    """10 SMS-first notices on a provider stuck mid-call and 50 email-first ones on the
    outbox, one sweep: all 50 emails are submitted while every text is still in flight."""
    settings = make_settings(policy={"default": {"batch_size": 100}, "smsfirst": SMS_FIRST})
    texts = enqueue(store, settings, [reset_request(region="smsfirst") for _ in range(10)], clock())
    emails = enqueue(store, settings, [reset_request() for _ in range(50)], clock())
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    transports["sms"] = gated
    sweeper = Sweeper(store, settings, transports, clock=clock, sleep=clock.sleep)
    thread, out = _in_background(lambda: sweeper.run(SweepOptions("w", 100, 600.0)))
    _until(lambda: gated.in_flight == 10, "every text to be in flight")
    # The outbox is the sweep's own database: read what it committed from here.
    with Store(store.path) as reader:
        _until(
            lambda: len(reader.outbox_messages()) == 50,
            "the 50 emails while the texts are stuck",
        )
        sent = {m["notice_id"] for m in reader.outbox_messages()}
    assert sent == {r.notice_id for r in emails}
    assert gated.in_flight == 10  # still stuck: the emails did not wait for them
    gated.gate.set()
    thread.join(DEADLINE)
    assert "error" not in out, out
    assert set(gated.submits.values()) == {1}
    assert len(gated.submits) == len(texts)


def test_a_failure_reads_fallback_goes_out_while_other_reads_are_slow(
    store: Store, clock: FakeClock, gated: GatedSms
) -> None:
    """Five texts wait for their first status read; one read says undelivered at once,
    the other four hang: that notice's email is submitted while they still hang."""
    settings = make_settings(policy={"default": SMS_FIRST})
    requests = [reset_request() for _ in range(5)]
    results = enqueue(store, settings, requests, clock())
    doomed = results[2].notice_id
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    transports["sms"] = gated
    gated.gate.set()  # submissions go through at once
    run_sweep(store, settings, clock, transports)
    assert len(gated.submits) == 5
    gated.gate.clear()
    gated.gate_reads = True
    gated.status_of = lambda message_id: "undelivered" if doomed in message_id else "sent"
    clock.advance(15)  # the first poll slot
    sweeper = Sweeper(store, settings, transports, clock=clock, sleep=clock.sleep)
    thread, out = _in_background(lambda: sweeper.run(SweepOptions("w", 50, 600.0)))
    _until(lambda: gated.in_flight == 4, "the four slow reads")
    with Store(store.path) as reader:
        _until(lambda: bool(reader.outbox_messages(doomed)), "the doomed notice's email")
        assert [m["channel"] for m in reader.outbox_messages()] == ["email"]
    assert gated.in_flight == 4  # the other reads still hang
    gated.gate.set()
    thread.join(DEADLINE)
    assert "error" not in out, out


def _twilio_settings(twilio: FakeTwilio, **lane: Any) -> Any:
    return make_settings(
        transport={"sms": "twilio"},
        twilio={"base_url": twilio.base_url, "from": SENDER, **lane},
        policy={"default": {"channels": ["sms"]}},
    )


def _real_sweep(store: Store, settings: Any, concurrency: int = 16) -> Any:
    """A sweep on the real clock: a rate limit and a pause are kept in real time."""
    transports = build_transports(settings, store, time.time, ENVIRON)
    try:
        sweeper = Sweeper(store, settings, transports)
        return sweeper.run(SweepOptions("w", 100, 600.0, concurrency=concurrency))
    finally:
        close_transports(transports)


def test_max_rate_is_never_exceeded_in_any_second(store: Store) -> None:
    """[twilio] max_rate = 5: twelve texts sent concurrently reach the provider at no more
    than five in any one-second window (as the provider saw them arrive)."""
    twilio = FakeTwilio()
    try:
        settings = _twilio_settings(twilio, max_rate=5)
        enqueue(store, settings, [reset_request() for _ in range(12)], time.time())
        summary = _real_sweep(store, settings)
        arrivals = sorted(twilio.arrivals)
        assert twilio.violations == []
    finally:
        twilio.close()
    assert summary.submitted == 12
    assert len(arrivals) == 12
    for first in arrivals:
        # A little slack for the path from the sweep's clock to the server's.
        assert sum(1 for at in arrivals if first <= at < first + 0.98) <= 5


def test_a_429_with_retry_after_pauses_the_lane_and_spends_no_retry(store: Store) -> None:
    """Twilio answers 429 with Retry-After: 1: nothing more is sent on that lane for a
    second, then the text goes out under the same key, its attempt counted once."""
    twilio = FakeTwilio()
    try:
        twilio.outcomes = ["throttle"]
        twilio.retry_after = "1"
        settings = _twilio_settings(twilio)
        (result,) = enqueue(store, settings, [reset_request()], time.time())
        summary = _real_sweep(store, settings)
        arrivals = list(twilio.arrivals)
    finally:
        twilio.close()
    assert (summary.throttled, summary.submitted) == (1, 1)
    assert len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 0.95
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["calls"]) == ("submitted", 1)
    kinds = [e["kind"] for e in store.event_rows(result.notice_id)]
    assert kinds.count("declined") == 1  # the throttled call was no attempt
    lanes = ops.health(store, time.time(), 300)["lanes"]
    assert (lanes["twilio"]["calls"], lanes["twilio"]["throttled"]) == (2, 1)
    assert lanes["twilio"]["waited_seconds"] >= 0.95  # the pause, as time waited
    # inspect says which step waited, and for how long: the retry's intent, the pause.
    history = notice_report(store, result.notice_id, time.time())["history"]
    waits = {h["kind"]: h["lane_wait_seconds"] for h in history if h["lane_wait_seconds"]}
    assert set(waits) == {"intent"}
    assert waits["intent"] >= 0.95


def test_a_short_lived_notice_behind_a_backlog_is_submitted_in_time(
    store: Store, clock: FakeClock
) -> None:
    """300 ten-minute notices wait, each call takes 0.5 s (on the sweep's clock), and a
    notice with a 100 s link is enqueued last: it is submitted first, well in time."""
    settings = make_settings(policy={"default": {"batch_size": 50}})
    enqueue(store, settings, [reset_request() for _ in range(300)], clock())
    clock.advance(1)
    (short,) = enqueue(store, settings, [reset_request(ttl="100s")], clock())
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    outbox = transports["email"]
    order: list[str] = []

    @dataclass
    class Slow:
        name: str = "slowbox"
        recovers_by_key: bool = True
        call_timeout: float = 0.0

        def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
            order.append(message.notice_id)
            clock.advance(0.5)
            reply: ProviderStatus = outbox.submit(message, attempt_key)
            return reply

        def status(self, message_id: str) -> ProviderStatus:
            reply: ProviderStatus = outbox.status(message_id)
            return reply

        def close(self) -> None:
            pass

    transports["email"] = Slow()
    run_sweep(store, settings, clock, transports, batch_size=50, lease=3600.0)
    assert len(order) == 301
    assert order.index(short.notice_id) == 0
    loaded = store.load_notice(short.notice_id)
    assert loaded is not None
    assert loaded.state.phase == "accepted"
