"""`health` over a window gives the same figures before and after a purge."""

from __future__ import annotations

from typing import Any

from conftest import T0, FakeClock, make_settings, reset_request, run_sweep

from resetctl import ops
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.observe import record_callback
from resetctl.store import Store

DAY = 86400.0
#: Figures that describe the store as it is now, not a window: they may change.
NOT_WINDOWED = {"notices_by_phase", "last_sweep_at", "seconds_since_last_sweep"}


def _day_of_outcomes(store: Store, start: float) -> None:
    """Accepted, fallback after a bounce, expired unanswered, late primary success."""
    settings = make_settings(
        outbox={"email_status": "pending", "sms_status": "delivered"},
        policy={"default": {}, "solo": {"channels": ["email"]}},
    )
    accepted, bounced, late = (
        r.notice_id for r in enqueue(store, settings, [reset_request() for _ in range(3)], start)
    )
    enqueue(store, settings, [reset_request(region="solo")], start)
    clock = FakeClock(start)
    run_sweep(store, settings, clock)
    for notice_id, status in ((accepted, "accepted"), (bounced, "failed")):
        (message,) = store.outbox_messages(notice_id)
        store.outbox_set_status(message["message_id"], status, start)
    clock.now = start + 1
    run_sweep(store, settings, clock, max_runtime=900)
    email = next(m for m in store.outbox_messages(late) if m["channel"] == "email")
    record_callback(store, "outbox", email["message_id"], "delivered", Status.DELIVERED, clock())


def _windowed(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in NOT_WINDOWED}


def test_health_figures_are_equal_before_and_after_purge(store: Store) -> None:
    """Attempt outcomes, expired without outcome and late primaries survive a purge."""
    for day in range(3):
        _day_of_outcomes(store, T0 + day * DAY)
    now = T0 + 40 * DAY
    window = 60 * DAY  # spans the purged days
    before = ops.health(store, now, window)
    assert before["expired_without_outcome"] == 3
    assert before["late_primary_after_fallback"] == 3
    assert before["attempts"]["email"]["failed"] == 3
    assert before["escalations"] >= 6
    assert ops.purge(store, 30 * DAY, now).deleted == 12
    assert store.phase_counts() == {}
    after = ops.health(store, now, window)
    assert _windowed(after) == _windowed(before)


def test_purged_days_outside_the_window_do_not_count(store: Store) -> None:
    """A window that starts after the purged days counts none of them."""
    _day_of_outcomes(store, T0)
    now = T0 + 40 * DAY
    ops.purge(store, 30 * DAY, now)
    recent = ops.health(store, now, 5 * DAY)
    assert recent["attempts"] == {}
    assert recent["expired_without_outcome"] == 0
    assert recent["late_primary_after_fallback"] == 0
