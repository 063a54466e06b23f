"""Write paths never scan a growing table: every statement a sweep, an enqueue --send, a
callback, a scrub or a purge issues is checked with EXPLAIN QUERY PLAN."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from conftest import FakeClock, make_settings, reset_request, run_sweep

from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.observe import record_callback
from resetctl.store import Store

GROWING = (
    "notices",
    "attempts",
    "events",
    "observations",
    "outbox",
    "shadow_notices",
    "slice_answers",
)
#: A scan of the partial index over live notices reads the live queue, not the table.
LIVE_INDEX = "notices_due"
#: Partial indexes over live notices only: walking one reads no finished notice. The
#: claim walks notices_queued_expiry in expiry order for at most a batch of due rows
#: (the only queued rows not due are leased: a few).
LIVE_INDEXES = (LIVE_INDEX, "USING INDEX notices_queued_expiry")


@contextmanager
def _statements(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the store's connection runs, with its values bound."""
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        store.conn.set_trace_callback(None)


def _scans(conn: sqlite3.Connection, statement: str) -> list[str]:
    """The plan lines that read a growing table whole."""
    if not re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", statement, re.IGNORECASE):
        return []
    plan = conn.execute("EXPLAIN QUERY PLAN " + statement).fetchall()
    found = []
    for row in plan:
        detail = str(row[-1])
        match = re.match(r"SCAN (\w+)", detail)
        if match and match.group(1) in GROWING and not any(i in detail for i in LIVE_INDEXES):
            found.append(detail)
    return found


def _populated(store: Store, clock: FakeClock) -> list[str]:
    """A database with history: 400 finished notices and 50 live ones."""
    finished = make_settings()
    results = enqueue(store, finished, [reset_request() for _ in range(400)], clock())
    run_sweep(store, finished, clock, batch_size=100)
    clock.advance(3600)
    pending = make_settings(outbox={"email_status": "pending", "sms_status": "pending"})
    live = enqueue(store, pending, [reset_request() for _ in range(50)], clock())
    store.conn.execute("ANALYZE")
    return [r.notice_id for r in results + live]


def _check(store: Store, action: Callable[[], object]) -> list[str]:
    with _statements(store) as seen:
        action()
    assert seen, "the action ran no statement"
    return [f"{scan}  <=  {sql[:160]}" for sql in seen for scan in _scans(store.conn, sql)]


def test_sweep_enqueue_send_and_scrub_never_scan(store: Store, clock: FakeClock) -> None:
    """Claims, loads, intents, outcomes, polls and terminal scrubs read by index."""
    _populated(store, clock)
    pending = make_settings(outbox={"email_status": "pending", "sms_status": "pending"})
    scans = _check(store, lambda: run_sweep(store, pending, clock))
    clock.advance(400)  # polls spent: escalations, then expiries and scrubs
    scans += _check(store, lambda: run_sweep(store, pending, clock, max_runtime=300))
    scans += _check(
        store,
        lambda: enqueue(store, make_settings(), [reset_request()], clock(), send=True, clock=clock),
    )
    assert scans == []


def test_callbacks_never_scan(store: Store, clock: FakeClock) -> None:
    """A callback finds its attempt by provider id or attempt key, and its replay by index."""
    _populated(store, clock)
    pending = make_settings(outbox={"email_status": "pending", "sms_status": "pending"})
    run_sweep(store, pending, clock)
    message = store.outbox_messages()[-1]

    def callbacks() -> None:
        for _ in range(2):
            record_callback(
                store,
                "outbox",
                message["message_id"],
                "delivered",
                Status.DELIVERED,
                clock(),
                attempt_key=message["attempt_key"],
            )

    assert _check(store, callbacks) == []


def test_purge_never_scans(store: Store, clock: FakeClock) -> None:
    """Purge walks finished notices by index and deletes their rows by key."""
    _populated(store, clock)
    assert _check(store, lambda: store.purge_batch(clock(), 100)) == []


def test_finding_notices_never_scans(store: Store, clock: FakeClock) -> None:
    """list, inspect --key/--account and a supersede read by index: the live notices',
    an account's, creation time, or the idempotency key's; never every finished notice."""
    from resetctl.controls import cancel, find_notice_id
    from resetctl.machine import Reason

    ids = _populated(store, clock)
    settings = make_settings(outbox={"email_status": "pending", "sms_status": "pending"})

    (key,) = store.conn.execute("SELECT idempotency_key FROM notices LIMIT 1").fetchone()
    enqueue(store, settings, [reset_request(account_ref="acct-1")], clock())

    def finds() -> None:
        store.find_notices(limit=10, live_only=True, phases=["queued"], region="default")
        store.find_notices(limit=10, account_ref="acct-1")
        store.find_notices(limit=10, since=clock() - 60, phases=["accepted"])
        find_notice_id(store, key=key)
        find_notice_id(store, account="acct-1")
        enqueue(store, settings, [reset_request(account_ref="acct-1")], clock())  # supersedes
        cancel(store, ids[-1:], Reason.WITHDRAWN, clock())

    assert _check(store, finds) == []


def test_the_slice_and_shadow_never_scan(store: Store, clock: FakeClock) -> None:
    """Slice answers looked up, recorded and pruned, shadow marks written at enqueue and
    read by a sweep: by key or by index, with days of answers and notices behind them."""
    _populated(store, clock)
    settings = make_settings(rollout={"percent": 30, "mode": "shadow"})
    enqueue(store, settings, [reset_request() for _ in range(200)], clock())
    clock.advance(3 * 86400)  # the answers so far are past their keeping: pruned next
    store.conn.execute("ANALYZE")

    def rollout() -> None:
        enqueue(store, settings, [reset_request() for _ in range(50)], clock())
        run_sweep(store, settings, clock)

    assert _check(store, rollout) == []
    (left,) = store.conn.execute("SELECT COUNT(*) FROM slice_answers").fetchone()
    assert left < 150  # some were pruned on the way
