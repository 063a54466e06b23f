"""One answer to "is it at risk?": `inspect` and `alerts` read the machine's budget, so
they agree for every notice, in every phase, at every remaining lifetime, under every
policy shape (escalate or expire, one channel or two)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep

from resetctl import ops
from resetctl.enqueue import enqueue
from resetctl.report import notice_report
from resetctl.store import Store

#: Regions, one per policy shape; outbox statuses stay pending so notices keep polling.
POLICIES = {
    "escalate": {"channels": ["email", "sms"]},
    "expire": {"channels": ["email", "sms"], "on_poll_budget_spent": "expire"},
    "solo": {"channels": ["email"]},
}
SETTINGS = make_settings(
    outbox={"email_status": "pending", "sms_status": "pending"},
    policy={"default": POLICIES["escalate"], **POLICIES},
)
#: Link lifetimes: ample, inside the fallback reserve plus the warning, inside the
#: fallback reserve, inside the send reserve.
TTLS = ("10m", "250s", "170s", "25s")
#: How far past enqueue the table is read: at once, mid-schedule, and late.
READ_AT = (0.0, 20.0, 50.0, 130.0)


def _stall(store: Store, notice_id: str, now: float) -> None:
    """The notice's worker died holding a long lease: its next action is overdue."""
    with store.transaction() as conn:
        conn.execute(
            "UPDATE notices SET lease_owner = 'dead', lease_token = 'x', lease_expires_at = ?,"
            " due_at = ? WHERE id = ? AND due_at IS NOT NULL",
            (now + 3600, now + 3600, notice_id),
        )


def _population(store: Store) -> dict[str, tuple[str, str, str]]:
    """Notices in every phase a live notice can be in, per policy and lifetime: queued
    (never swept), primary pending (email polling), fallback pending (the email failed),
    each also with its worker dead (overdue)."""
    clock = FakeClock(T0)
    cells: dict[str, tuple[str, str, str]] = {}
    for region in POLICIES:
        for ttl in TTLS:
            for shape in ("queued", "primary", "fallback", "primary-stalled"):
                if shape == "fallback" and region == "solo":
                    continue
                request = reset_request(region=region, ttl=ttl)
                (result,) = enqueue(store, SETTINGS, [request], T0)
                cells[result.notice_id] = (region, ttl, shape)
    swept = [n for n, (_, _, shape) in cells.items() if shape != "queued"]
    queued = [n for n in cells if n not in swept]
    for notice_id in queued:  # kept out of the sweep: held elsewhere, as a claim would
        _stall(store, notice_id, T0)
    run_sweep(store, SETTINGS, clock)
    for message in store.outbox_messages():
        region_ttl_shape = cells.get(message["notice_id"])
        if region_ttl_shape and region_ttl_shape[2] == "fallback":
            store.outbox_set_status(message["message_id"], "failed", T0 + 1)
    clock.advance(15)
    run_sweep(store, SETTINGS, clock)
    for notice_id, (_, _, shape) in cells.items():
        if shape == "primary-stalled":
            _stall(store, notice_id, T0 + 15)
    for notice_id in queued:
        with store.transaction() as conn:
            conn.execute(
                "UPDATE notices SET lease_owner = NULL, lease_token = NULL,"
                " lease_expires_at = NULL, due_at = ? WHERE id = ? AND due_at IS NOT NULL",
                (T0, notice_id),
            )
    return cells


@pytest.mark.parametrize("read_at", READ_AT)
def test_inspect_and_alerts_agree_on_every_notice(store: Store, read_at: float) -> None:
    """For every cell of phase x remaining time x policy, inspect's at_risk is true
    exactly when alerts lists the notice, at the same level."""
    cells = _population(store)
    now = T0 + 15 + read_at
    report = ops.alerts(store, now, stalled_after=1e9, peek=True)
    listed = {a.notice_id: a.level.name.lower() for a in report.notices}
    seen: dict[str, Any] = {}
    for notice_id, cell in cells.items():
        shown = notice_report(store, notice_id, now)
        if shown["phase"] in ("accepted", "failed", "expired"):
            continue
        budget = shown["action_budget"]
        seen[notice_id] = (cell, shown["phase"], budget["at_risk"], budget["level"])
        assert budget["at_risk"] is (notice_id in listed), (cell, shown["phase"], budget)
        if budget["at_risk"]:
            assert budget["level"] == listed[notice_id], (cell, shown["phase"])
    phases = {phase for _, phase, _, _ in seen.values()}
    risks = {at_risk for _, _, at_risk, _ in seen.values()}
    # The table is not trivially agreeing: it has live phases and both answers.
    assert {"queued", "primary_pending"} <= phases
    if read_at < 100:
        assert "fallback_pending" in phases
    assert risks == {True, False}


def test_peeking_uses_up_nothing(store: Store) -> None:
    """`alerts --peek` reports what a run would, and the next real run still reports the
    one-time warnings and the ended notices."""
    _population(store)
    now = T0 + 15 + 130
    first = ops.alerts(store, now, stalled_after=1e9, peek=True)
    again = ops.alerts(store, now, stalled_after=1e9, peek=True)
    real = ops.alerts(store, now, stalled_after=1e9)
    after = ops.alerts(store, now, stalled_after=1e9)
    assert [a.notice_id for a in first.notices] == [a.notice_id for a in again.notices]
    assert [a.notice_id for a in real.notices] == [a.notice_id for a in first.notices]
    assert first.ended_total == real.ended_total
    assert any(not a.actionable for a in real.notices)  # one-time warnings were there
    assert len(after.notices) < len(real.notices)  # ...and a real run used them up


def test_the_command_line_peeks_too(store: Store, db: str) -> None:
    """`resetctl alerts --peek` twice lists the same notices; a plain run then still
    lists them (nothing was used up)."""
    import json

    import time_machine
    from typer.testing import CliRunner

    from resetctl.cli import app

    _population(store)
    now = T0 + 15 + 130

    def listed(*extra: str) -> list[str]:
        with time_machine.travel(now, tick=False):
            shown = CliRunner().invoke(app, ["alerts", "--json", "--db", db, *extra])
        return sorted(a.get("notice_id", "") for a in json.loads(shown.stdout)["alerts"])

    peeked = listed("--peek")
    assert peeked
    assert listed("--peek") == peeked
    assert listed() == peeked
    assert len(listed()) < len(peeked)
