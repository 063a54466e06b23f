"""Cancel, complete and supersede: a notice that no longer helps stops, on both backends;
a call already made stays recorded; nothing is submitted after a cancel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, resetctl, run_sweep
from fakes import ScriptedTransport

from resetctl import api
from resetctl.controls import cancel
from resetctl.enqueue import enqueue
from resetctl.errors import InputError, NoticeNotFound
from resetctl.machine import Phase, Reason
from resetctl.store import Store
from resetctl.transports import build_transports

PENDING = {
    "outbox": {"email_status": "pending", "sms_status": "pending"},
    "unknown_region": "default",  # "eu" and "us" share the default policy
}


def _enqueue(store: Store, now: float = T0, **fields: Any) -> str:
    (result,) = enqueue(store, make_settings(**PENDING), [reset_request(**fields)], now)
    return result.notice_id


def _phase(store: Store, notice_id: str) -> tuple[Phase, str | None]:
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    return loaded.state.phase, loaded.reason


def test_a_cancelled_queued_notice_is_never_submitted(store: Store) -> None:
    """Cancelled before its first submission: the sweep submits nothing, the contact
    data and link are gone, and the history says who cancelled it and why."""
    notice_id = _enqueue(store)
    (result,) = cancel(store, [notice_id], Reason.COMPLETED, T0 + 1)
    assert (result.was, result.phase, result.cancelled) == (Phase.QUEUED, Phase.CANCELLED, True)
    summary = run_sweep(store, make_settings(**PENDING), FakeClock(T0 + 2))
    assert summary.submitted == 0
    assert store.outbox_messages() == []
    assert _phase(store, notice_id) == (Phase.CANCELLED, "completed")
    assert store.load_contact(notice_id) is None
    (event,) = [e for e in store.event_rows(notice_id) if e["kind"] == "cancel"]
    assert (event["old_phase"], event["new_phase"], event["reason"]) == (
        "queued",
        "cancelled",
        "completed",
    )


def test_a_cancel_while_the_primary_awaits_its_status_stops_polls_and_fallback(
    store: Store,
) -> None:
    """A pending email's notice, cancelled: no more status reads, no SMS, whatever time
    passes (the sweep that would escalate finds nothing to do)."""
    settings = make_settings(**PENDING)
    notice_id = _enqueue(store)
    clock = FakeClock(T0)
    transports = {
        c: ScriptedTransport(t) for c, t in build_transports(settings, store, clock).items()
    }
    run_sweep(store, settings, clock, transports)
    assert _phase(store, notice_id)[0] is Phase.PRIMARY_PENDING
    cancel(store, [notice_id], Reason.WITHDRAWN, clock.advance(5))
    for _ in range(10):  # past every poll and the fallback deadline
        run_sweep(store, settings, FakeClock(clock.advance(60)), transports)
    assert [m["channel"] for m in store.outbox_messages()] == ["email"]
    assert all(not t.reads for t in transports.values())
    assert _phase(store, notice_id) == (Phase.CANCELLED, "withdrawn")


def test_a_call_in_flight_when_the_cancel_lands_is_recorded_as_evidence(
    store: Store, db: str
) -> None:
    """The cancel commits while the submission is at the provider: the message it made
    is recorded on the attempt (so on-call sees it went out), and the notice stays
    cancelled."""
    settings = make_settings(**PENDING)
    notice_id = _enqueue(store)
    clock = FakeClock(T0)
    transports = build_transports(settings, store, clock)

    def cancel_meanwhile(_message: object, _key: str) -> None:
        with Store(db) as other:
            cancel(other, [notice_id], Reason.COMPLETED, clock())

    email = ScriptedTransport(transports["email"], on_submit=cancel_meanwhile)
    summary = run_sweep(store, settings, clock, {**transports, "email": email})
    assert summary.lost_races >= 1  # the outcome's decision lost to the cancel
    (attempt,) = store.attempt_rows(notice_id)
    (message,) = store.outbox_messages()
    assert (attempt["state"], attempt["message_id"]) == ("submitted", message["message_id"])
    assert _phase(store, notice_id) == (Phase.CANCELLED, "completed")


def test_cancelling_a_finished_notice_changes_nothing_and_says_how_it_ended(
    store: Store,
) -> None:
    """An accepted notice stays accepted: the cancel reports it was already over."""
    settings = make_settings()  # the outbox accepts at once
    (result,) = enqueue(store, settings, [reset_request()], T0)
    run_sweep(store, settings, FakeClock(T0))
    (cancelled,) = cancel(store, [result.notice_id], Reason.COMPLETED, T0 + 5)
    assert (cancelled.phase, cancelled.cancelled, cancelled.reason) == (
        Phase.ACCEPTED,
        False,
        "accepted",
    )
    assert _phase(store, result.notice_id) == (Phase.ACCEPTED, "accepted")
    assert not [e for e in store.event_rows(result.notice_id) if e["kind"] == "cancel"]


def test_an_unknown_notice_is_not_found_and_nothing_is_cancelled(store: Store) -> None:
    """One unknown id among several: NoticeNotFound, and the known one stays live."""
    notice_id = _enqueue(store)
    with pytest.raises(NoticeNotFound, match="ntc_nope"):
        cancel(store, [notice_id, "ntc_nope"], Reason.WITHDRAWN, T0)
    assert _phase(store, notice_id)[0] is Phase.QUEUED


def test_superseded_notices_are_cancelled_before_the_new_one_is_sent(store: Store) -> None:
    """A second reset for the account cancels the first (its link is dead) in the same
    transaction; another region's notice and an idempotent replay are left alone."""
    settings = make_settings(**PENDING)
    first = enqueue(store, settings, [reset_request(account_ref="acct-1")], T0)[0]
    elsewhere = enqueue(
        store, settings, [reset_request(account_ref="acct-1", region="eu")], T0 + 1
    )[0]
    other_account = enqueue(store, settings, [reset_request(account_ref="acct-2")], T0 + 1)[0]
    again = reset_request(account_ref="acct-1")
    (second,) = enqueue(store, settings, [again], T0 + 2)
    assert second.superseded == (first.notice_id,)
    assert second.to_json()["superseded"] == [first.notice_id]
    assert _phase(store, first.notice_id) == (Phase.CANCELLED, "superseded")
    for live in (elsewhere, other_account, second):
        assert _phase(store, live.notice_id)[0] is Phase.QUEUED
    (replayed,) = enqueue(store, settings, [again], T0 + 3)
    assert (replayed.created, replayed.superseded) == (False, ())
    assert _phase(store, second.notice_id)[0] is Phase.QUEUED
    run_sweep(store, settings, FakeClock(T0 + 4))
    assert {m["notice_id"] for m in store.outbox_messages()} == {
        elsewhere.notice_id,
        other_account.notice_id,
        second.notice_id,
    }


def test_within_one_batch_the_last_notice_of_an_account_survives(store: Store) -> None:
    """Three requests for one account in one enqueue: the last one is the live one."""
    settings = make_settings(**PENDING)
    results = enqueue(store, settings, [reset_request(account_ref="acct-9") for _ in range(3)], T0)
    assert set(results[-1].superseded) == {r.notice_id for r in results[:2]}
    assert [_phase(store, r.notice_id)[0] for r in results] == [
        Phase.CANCELLED,
        Phase.CANCELLED,
        Phase.QUEUED,
    ]


def test_supersede_older_false_keeps_every_notice(store: Store) -> None:
    """For a framework whose older tokens stay valid, older notices keep going."""
    settings = make_settings(**PENDING, policy={"default": {"supersede_older": False}})
    first = enqueue(store, settings, [reset_request(account_ref="acct-1")], T0)[0]
    second = enqueue(store, settings, [reset_request(account_ref="acct-1")], T0 + 1)[0]
    assert second.superseded == ()
    assert _phase(store, first.notice_id)[0] is Phase.QUEUED


def test_a_terminal_older_notice_is_not_superseded(store: Store) -> None:
    """Only live notices are superseded: an accepted one keeps its ending."""
    settings = make_settings()
    first = enqueue(store, settings, [reset_request(account_ref="acct-1")], T0)[0]
    run_sweep(store, settings, FakeClock(T0))
    second = enqueue(store, settings, [reset_request(account_ref="acct-1")], T0 + 5)[0]
    assert second.superseded == ()
    assert _phase(store, first.notice_id)[0] is Phase.ACCEPTED


def test_the_api_cancels_by_key_and_refuses_an_unknown_reason(db: str, tmp_path: Path) -> None:
    """handle.cancel by idempotency key; a reason outside the three is an InputError."""
    with api.open(db, clock=lambda: T0) as handle:
        (result,) = handle.enqueue([reset_request(idempotency_key="order-1")])
        with pytest.raises(InputError, match="completed, superseded, withdrawn"):
            handle.cancel(key="order-1", reason="bored")
        done = handle.cancel(key="order-1", reason="completed")
        assert (done.notice_id, done.phase, done.reason) == (
            result.notice_id,
            Phase.CANCELLED,
            "completed",
        )
        with pytest.raises(NoticeNotFound):
            handle.cancel(key="order-2")


def test_the_cli_cancels_and_reports_already_ended_and_unknown(db: str) -> None:
    """`resetctl cancel`: exit 0 and a line for a cancel, exit 0 saying how a finished
    notice ended, exit 1 for an unknown key; --json for scripts."""
    enqueued = resetctl("enqueue", db=db, input=json.dumps(reset_request(idempotency_key="k-1")))
    notice_id = json.loads(enqueued.stdout)["notice_id"]
    first = resetctl("cancel", "--key", "k-1", "--reason", "completed", "--json", db=db)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {
        "notice_id": notice_id,
        "was": "queued",
        "phase": "cancelled",
        "cancelled": True,
        "reason": "completed",
    }
    again = resetctl("cancel", notice_id, db=db)
    assert again.returncode == 0
    assert "already ended: cancelled (completed)" in again.stdout
    unknown = resetctl("cancel", "--key", "k-404", db=db)
    assert unknown.returncode == 1
    assert "k-404" in unknown.stderr
    both = resetctl("cancel", notice_id, "--key", "k-1", db=db)
    assert both.returncode == 2
    assert "one way" in both.stderr


def test_health_and_metrics_count_cancels_by_reason(db: str, tmp_path: Path) -> None:
    """health's `cancelled` and the transitions counter know the new phase and why."""
    with api.open(db, clock=lambda: T0) as handle:
        results = handle.enqueue([reset_request(), reset_request()])
        handle.cancel(results[0].notice_id, reason="completed")
        handle.cancel(results[1].notice_id, reason="withdrawn")
        report = handle.health(window=3600)
        assert report["cancelled"] == {"completed": 1, "withdrawn": 1}
        assert report["notices_by_phase"]["cancelled"] == 2
        textfile = tmp_path / "resetctl.prom"
        handle.write_metrics(textfile)
    metrics = textfile.read_text()
    assert (
        'resetctl_transitions_total{from_phase="queued",policy="default",policy_version="1",'
        'reason="completed",to_phase="cancelled"} 1.0' in metrics
    )
