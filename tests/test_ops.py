"""Operations: alerts, health, metrics, retention and structured logs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import time_machine
from conftest import T0, FakeClock, make_settings, reset_request, resetctl, run_sweep
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from resetctl import ops
from resetctl.cli import app
from resetctl.enqueue import enqueue
from resetctl.ops import AlertLevel
from resetctl.store import Store

PENDING = {"outbox": {"email_status": "pending", "sms_status": "pending"}}


def _enqueue(store: Store, settings: Any, now: float, **fields: Any) -> str:
    (result,) = enqueue(store, settings, [reset_request(**fields)], now)
    return result.notice_id


def _stall(store: Store, notice_id: str, now: float) -> None:
    """The notice's worker died holding a long lease: nothing moves it any more."""
    with store.transaction() as conn:
        conn.execute(
            "UPDATE notices SET lease_owner = 'dead', lease_token = 'x', lease_expires_at = ?,"
            " due_at = ? WHERE id = ?",
            (now + 3600, now + 3600, notice_id),
        )


def _situations(store: Store, mode: str) -> dict[str, str]:
    """Notices in every situation as seen at T0 + 300 s."""
    policy = {"alert_mode": mode}
    settings = make_settings(
        **PENDING, policy={"default": policy, "solo": {**policy, "channels": ["email"]}}
    )
    clock = FakeClock(T0)
    ids = {
        "fallback_impossible": _enqueue(store, settings, T0, ttl="7m"),
        "terminal": _enqueue(store, settings, T0, ttl="10m"),
    }
    run_sweep(store, settings, clock)
    for message in store.outbox_messages(ids["terminal"]):
        store.outbox_set_status(message["message_id"], "delivered", T0)
    clock.now = T0 + 15
    run_sweep(store, settings, clock)
    # Polled once, then its worker died: at +300 s only 2 minutes are left, under the
    # 3-minute fallback reserve, and its next read is overdue.
    _stall(store, ids["fallback_impossible"], clock.now)
    # Submitted at +100, then its worker died: at +300 s 220 s are left, so the fallback
    # can still go out (reserve 180 s) if the overdue read happens now.
    ids["act_now"] = _enqueue(store, settings, T0 + 100, ttl="7m")
    clock.now = T0 + 100
    run_sweep(store, settings, clock)
    _stall(store, ids["act_now"], clock.now)
    # Email-only, near expiry with a poll due: 30 s left, the read still possible.
    ids["near_expiry"] = _enqueue(store, settings, T0 + 180, region="solo", ttl="150s")
    clock.now = T0 + 180
    run_sweep(store, settings, clock)
    clock.now = T0 + 195
    run_sweep(store, settings, clock)
    _stall(store, ids["near_expiry"], clock.now)
    ids["polling"] = _enqueue(store, settings, T0 + 290, ttl="10m")
    clock.now = T0 + 290
    run_sweep(store, settings, clock)
    ids["fresh"] = _enqueue(store, settings, T0 + 299, ttl="10m")
    return ids


@pytest.mark.parametrize(("mode", "exit_code"), [("page", 2), ("observe", 0)])
def test_alerts_report_exactly_the_notices_at_risk(
    store: Store, db: str, mode: str, exit_code: int
) -> None:
    """Critical only while a useful action is overdue; past help is a warning, once."""
    ids = _situations(store, mode)
    now = T0 + 300
    report = ops.alerts(store, now)
    levels = {a.notice_id: a.level for a in report.notices}
    assert levels == {
        ids["act_now"]: AlertLevel.CRITICAL,
        ids["fallback_impossible"]: AlertLevel.WARNING,
        ids["near_expiry"]: AlertLevel.WARNING,
    }
    critical = next(a for a in report.notices if a.level is AlertLevel.CRITICAL)
    assert critical.actionable
    assert critical.remaining_seconds == pytest.approx(220)
    assert critical.needed_seconds == pytest.approx(180)
    assert critical.state_age_seconds == pytest.approx(200)
    assert critical.next_action == "poll"
    assert not any(a.actionable for a in report.notices if a.level is AlertLevel.WARNING)
    assert report.level is (AlertLevel.CRITICAL if mode == "page" else AlertLevel.OK)

    def would_page() -> int:
        query = "SELECT COUNT(*) FROM events WHERE kind = 'would_page'"
        return int(store.conn.execute(query).fetchone()[0])

    assert would_page() == (1 if mode == "observe" else 0)
    again = ops.alerts(store, now)  # past help is reported once; would_page once per notice
    assert [a.notice_id for a in again.notices] == [ids["act_now"]]
    assert would_page() == (1 if mode == "observe" else 0)
    with time_machine.travel(now, tick=False):
        result = CliRunner().invoke(app, ["alerts", "--json", "--db", db])
    assert result.exit_code == exit_code, result.output
    shown = json.loads(result.stdout)
    assert {a["notice_id"] for a in shown["alerts"]} == {ids["act_now"]}


def test_alerts_page_only_while_on_call_can_act(store: Store) -> None:
    """A stuck read with the fallback still possible pages; once past help, it warns once."""
    settings = make_settings(**PENDING)
    clock = FakeClock(T0)
    notice_id = _enqueue(store, settings, T0, ttl="10m")
    run_sweep(store, settings, clock)
    never_stalled = 1e9  # this test is about the notice, not the sweeper

    def level_at(remaining: float) -> tuple[AlertLevel, list[str]]:
        report = ops.alerts(store, T0 + 600 - remaining, never_stalled)
        return report.level, [a.notice_id for a in report.notices]

    assert level_at(599) == (AlertLevel.OK, [])
    assert level_at(250) == (AlertLevel.OK, [])  # 70 s of margin: more than alert_warning
    # The overdue read needs the 3-minute reserve behind it; 230 s left is inside the
    # 1-minute warning margin and someone restarting the sweeper still saves it.
    assert level_at(230) == (AlertLevel.CRITICAL, [notice_id])
    # Under the fallback reserve: nothing anyone does can help any more.
    assert level_at(170) == (AlertLevel.WARNING, [notice_id])
    assert level_at(100) == (AlertLevel.OK, [])


def test_metrics_parse_and_keep_label_sets_bounded(store: Store, tmp_path: Path) -> None:
    """The textfile parses with prometheus_client; series don't grow with the notices."""
    settings = make_settings(**PENDING)
    clock = FakeClock(T0)
    enqueue(store, settings, [reset_request() for _ in range(200)], T0)
    run_sweep(store, settings, clock, max_runtime=200)
    first = tmp_path / "a.prom"
    ops.write_metrics(store, first, T0 + 200)
    enqueue(store, settings, [reset_request() for _ in range(2000)], T0 + 200)
    clock.now = T0 + 200
    run_sweep(store, settings, clock, max_runtime=200)
    second = tmp_path / "b.prom"
    ops.write_metrics(store, second, T0 + 400)

    def series(path: Path) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        found = set()
        for family in text_string_to_metric_families(path.read_text()):
            for sample in family.samples:
                found.add((sample.name, tuple(sorted(sample.labels.items()))))
        return found

    assert series(second) == series(first) or len(series(second)) <= len(series(first)) + 10
    names = {name for name, _ in series(second)}
    assert {
        "resetctl_events_total",
        "resetctl_live_notices",
        "resetctl_sweep_lag_seconds",
        "resetctl_last_sweep_duration_seconds",
    } <= names
    for _, labels in series(second):
        for key, _value in labels:
            assert key in {
                "kind",
                "channel",
                "status",
                "policy",
                "policy_version",
                "from_phase",
                "to_phase",
                "reason",
                "template_version",
                "phase",
                "level",  # critical or warning (resetctl_notices_at_risk)
                "transport",  # a configured transport's name (the lane metrics)
                "region",  # the policy's name (the distributions), never a notice's region
                "le",  # a histogram bucket's bound, fixed in resetctl.distributions
                "segments",  # an SMS segment bucket: 1, 2, 3 or 4+
                "encoding",  # gsm7 or ucs2
            }
    polls = sum(
        sample.value
        for family in text_string_to_metric_families(second.read_text())
        for sample in family.samples
        if sample.name == "resetctl_events_total" and sample.labels["kind"] == "poll"
    )
    assert (
        polls == store.conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'poll'").fetchone()[0]
    )


def test_purge_keeps_counts_and_never_touches_live_notices(store: Store) -> None:
    """Old finished notices go, with their rows; live ones stay; health still adds up."""
    settings = make_settings()
    clock = FakeClock(T0)
    old = [r.notice_id for r in enqueue(store, settings, [reset_request() for _ in range(30)], T0)]
    run_sweep(store, settings, clock)
    before = ops.health(store, T0 + 40 * 86400, 60 * 86400)
    live_settings = make_settings(**PENDING)
    live = _enqueue(store, live_settings, T0 + 40 * 86400)
    assert ops.purge(store, 30 * 86400, T0 + 40 * 86400, batch=7).deleted == 30
    assert store.load_notice(live) is not None
    assert all(store.load_notice(n) is None for n in old)
    remaining = store.conn.execute(
        "SELECT COUNT(*) FROM attempts WHERE notice_id != ?", (live,)
    ).fetchone()[0]
    assert remaining == 0
    after = ops.health(store, T0 + 40 * 86400, 60 * 86400)
    assert after["attempts"] == before["attempts"]  # the rows are gone, their counts live on
    assert before["status_reads"] == after["status_reads"]
    counted = store.conn.execute(
        "SELECT SUM(count) FROM daily_counts WHERE kind NOT LIKE 'health:%'"
    ).fetchone()[0]
    assert counted == 30 * 2  # intent + outcome per notice


@pytest.mark.slow
def test_purge_runs_safely_beside_a_sweep_process(db_path: Path, tmp_path: Path) -> None:
    """purge and a real sweep process on one file: nothing live lost, no 'database is locked'."""
    settings = make_settings()
    now = time.time()
    with Store(db_path) as store:
        enqueue(store, settings, [reset_request() for _ in range(400)], now - 40 * 86400)
        run_sweep(store, settings, FakeClock(now - 40 * 86400))
        live = [
            r.notice_id
            for r in enqueue(store, settings, [reset_request() for _ in range(300)], now)
        ]
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resetctl",
            "--log-level",
            "warning",
            "sweep",
            "--db",
            str(db_path),
            "--batch-size",
            "5",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    purge = resetctl(
        "--log-level",
        "warning",
        "purge",
        "--older-than",
        "30d",
        "--batch-size",
        "20",
        "--json",
        db=db_path,
    )
    _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 0, err
    assert purge.returncode == 0, purge.stderr
    for text in (err, purge.stderr):
        assert "locked" not in text
        assert "Traceback" not in text
    assert json.loads(purge.stdout)["deleted"] == 400
    with Store(db_path) as store:
        phases = [store.load_notice(n) for n in live]
        assert all(p is not None and p.state.phase.value == "accepted" for p in phases)
        assert store.conn.execute("SELECT COUNT(*) FROM notices").fetchone()[0] == 300


def test_health_and_storage_report_population_numbers(store: Store) -> None:
    """health counts escalations, reads and outcomes; --storage measures bytes per event."""
    settings = make_settings(outbox={"email_status": "failed"})
    clock = FakeClock(T0)
    enqueue(store, settings, [reset_request() for _ in range(10)], T0)
    run_sweep(store, settings, clock)
    report = ops.health(store, T0 + 10, 300)
    assert report["escalations"] == 10
    assert report["notices_by_phase"] == {"accepted": 10}
    assert report["attempts"] == {"email": {"failed": 10}, "sms": {"delivered": 10}}
    assert report["sweep_lag_seconds"] == 0.0
    storage = ops.storage(store, T0 + 10, 30 * 86400)
    assert storage["bytes_per_event"] > 0
    assert storage["projected_bytes"] > 0
    assert storage["rows"]["events"] == 40


CANARIES = ("ops.canary@example.org", "+61491570158", "61491570158", "OPS-CANARY-TOKEN")


def test_no_recipient_url_or_payload_in_health_alerts_metrics_or_logs(
    db_path: Path, tmp_path: Path
) -> None:
    """health, alerts, metrics and JSON logs carry no address, number, URL or raw payload."""
    config = tmp_path / "c.toml"
    config.write_text('[outbox]\nemail_status = "failed"\nsms_status = "pending"\n')
    line = json.dumps(
        {
            "idempotency_key": "k",
            "email": CANARIES[0],
            "phone": CANARIES[1],
            "reset_url": f"https://shop.example/r/{CANARIES[3]}",
            "ttl": "4m",
        }
    )
    outputs = []
    env = {"RESETCTL_CONFIG": str(config), "RESETCTL_HASH_KEY": "test-hash-key-0123456789abcdef"}
    outputs.append(resetctl("enqueue", db=db_path, input=line + "\n", env=env))
    outputs.append(resetctl("--log-format", "json", "sweep", db=db_path, env=env))
    outputs.append(resetctl("health", "--json", "--storage", db=db_path, env=env))
    outputs.append(resetctl("alerts", "--json", db=db_path, env=env))
    outputs.append(resetctl("metrics", "--textfile", str(tmp_path / "m.prom"), db=db_path, env=env))
    text = "\n".join(o.stdout + o.stderr for o in outputs) + (tmp_path / "m.prom").read_text()
    for canary in CANARIES:
        assert canary not in text
    logs = [json.loads(x) for x in outputs[1].stderr.splitlines() if x.startswith("{")]
    transitions = [x for x in logs if x.get("message") == "transition"]
    assert transitions
    assert all(len(x["recipient"]) == 24 for x in transitions)
    assert {x["kind"] for x in transitions} >= {"intent", "outcome"}


def test_live_queue_gauges_read_zero_when_empty(store: Store, tmp_path: Path) -> None:
    """Every live phase of every policy has a sample, 0 when nothing waits."""
    settings = make_settings()
    enqueue(store, settings, [reset_request()], T0)
    run_sweep(store, settings, FakeClock(T0))  # accepted: the queue is empty again
    target = tmp_path / "m.prom"
    ops.write_metrics(store, target, T0 + 60, [("apac", 3)])
    samples = {
        (s.labels["phase"], s.labels["policy"], s.labels["policy_version"]): s.value
        for family in text_string_to_metric_families(target.read_text())
        for s in family.samples
        if s.name == "resetctl_live_notices"
    }
    phases = ("queued", "primary_pending", "fallback_pending")
    expected = {(p, name, v): 0.0 for p in phases for name, v in (("default", "1"), ("apac", "3"))}
    assert samples == expected


def test_health_shows_the_last_sweep(store: Store) -> None:
    """health reports when the last sweep ended, how long ago, and how long it ran."""
    assert ops.health(store, T0, 300)["last_sweep_at"] is None
    run_sweep(store, make_settings(), FakeClock(T0))
    report = ops.health(store, T0 + 90, 300)
    assert report["last_sweep_at"] == "2026-01-01T00:00:00Z"
    assert report["seconds_since_last_sweep"] == 90
    assert report["sweep_lag_seconds"] == 0.0
