"""`resetctl alerts`: page only when on-call can act, never miss an ending, never lie."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import time_machine
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep
from typer.testing import CliRunner

from resetctl import ops
from resetctl.cli import app
from resetctl.enqueue import enqueue
from resetctl.ops import AlertLevel
from resetctl.store import Store

PENDING = {"outbox": {"email_status": "pending", "sms_status": "pending"}}
NEVER_STALLED = 1e9


def _enqueue(store: Store, settings: Any, now: float, **fields: Any) -> str:
    (result,) = enqueue(store, settings, [reset_request(**fields)], now)
    return result.notice_id


def _cli_alerts(db_path: Path | str, now: float, *args: str) -> Any:
    with time_machine.travel(now, tick=False):
        return CliRunner().invoke(app, ["alerts", "--db", str(db_path), *args])


def test_a_short_link_past_its_fallback_deadline_warns_once_and_never_pages(
    store: Store,
) -> None:
    """A 150 s link polls past the fallback deadline: nobody can help, so one warning."""
    settings = make_settings(**PENDING)
    clock = FakeClock(T0)
    notice_id = _enqueue(store, settings, T0, ttl="150s")
    levels = []
    ended: list[str] = []
    for at in (0, 15, 45, 105):  # the sweeper is healthy and polls on time
        clock.now = T0 + at
        run_sweep(store, settings, clock)
        report = ops.alerts(store, clock.now + 1, NEVER_STALLED)
        levels.append((report.level, [(a.notice_id, a.actionable) for a in report.notices]))
        ended.extend(e.notice_id for e in report.ended)
    assert levels[0] == (AlertLevel.WARNING, [(notice_id, False)])
    assert levels[1:3] == [(AlertLevel.OK, [])] * 2
    # Its budget spent with no time for the fallback, it expires: reported once, a warning.
    assert levels[3] == (AlertLevel.WARNING, [])
    assert ended == [notice_id]


def test_a_link_that_expires_between_two_runs_is_reported_once(store: Store) -> None:
    """A 2-minute link dying between runs is in the next run's report, and only that one."""
    settings = make_settings(**PENDING, policy={"default": {"channels": ["email"]}})
    clock = FakeClock(T0)
    before = ops.alerts(store, T0, NEVER_STALLED)
    assert before.level is AlertLevel.OK
    notice_id = _enqueue(store, settings, T0 + 5, ttl="2m")
    for at in (5, 20, 50, 110, 126):
        clock.now = T0 + at
        run_sweep(store, settings, clock)
    assert store.load_notice(notice_id).state.phase == "expired"  # type: ignore[union-attr]
    reports = [ops.alerts(store, T0 + at, NEVER_STALLED) for at in (180, 240)]
    assert [e.notice_id for e in reports[0].ended] == [notice_id]
    assert reports[0].ended[0].phase == "expired"
    assert reports[0].level is AlertLevel.WARNING
    assert (reports[1].ended, reports[1].level) == ([], AlertLevel.OK)


def test_an_ending_committed_after_a_run_began_is_not_skipped(store: Store) -> None:
    """The watermark is the event id, not the clock: a step written with an earlier
    time after the previous run is still reported."""
    settings = make_settings(**PENDING, policy={"default": {"channels": ["email"]}})
    notice_id = _enqueue(store, settings, T0, ttl="2m")
    run_sweep(store, settings, FakeClock(T0))
    assert ops.alerts(store, T0 + 200, NEVER_STALLED).ended == []
    # A slow sweep whose clock said T0 + 150 commits after the run at T0 + 200.
    run_sweep(store, settings, FakeClock(T0 + 150))
    report = ops.alerts(store, T0 + 260, NEVER_STALLED)
    assert [e.notice_id for e in report.ended] == [notice_id]


def test_a_stalled_sweeper_pages_while_live_notices_wait(store: Store, db: str) -> None:
    """No sweep for longer than alert_stalled_after with live notices: critical."""
    settings = make_settings(**PENDING)
    clock = FakeClock(T0)
    _enqueue(store, settings, T0, ttl="1h")
    run_sweep(store, settings, clock)
    assert ops.alerts(store, T0 + 170).stalled is None
    stalled = ops.alerts(store, T0 + 200)
    assert stalled.level is AlertLevel.CRITICAL
    assert stalled.stalled is not None
    assert stalled.stalled.seconds_since_last_sweep == pytest.approx(200)
    result = _cli_alerts(db, T0 + 200, "--json")
    assert result.exit_code == 2
    shown = json.loads(result.stdout)
    assert shown["alerts"][0]["alert"] == "resetctl_sweep_stalled"
    assert shown["at"] == "2026-01-01T00:03:20Z"


def test_stalled_threshold_comes_from_the_default_policy(
    store: Store, db: str, tmp_path: Path
) -> None:
    """[policy.default] alert_stalled_after moves the threshold."""
    settings = make_settings(**PENDING)
    _enqueue(store, settings, T0, ttl="1h")
    run_sweep(store, settings, FakeClock(T0))
    config = tmp_path / "c.toml"
    config.write_text('[policy.default]\nalert_stalled_after = "10m"\n')
    assert _cli_alerts(db, T0 + 300, "--config", str(config)).exit_code == 0
    assert _cli_alerts(db, T0 + 300).exit_code == 2


def test_never_swept_notices_older_than_the_threshold_mean_stalled(store: Store) -> None:
    """With no sweep ever recorded, a notice waiting past the threshold means stalled."""
    _enqueue(store, make_settings(), T0, ttl="1h")
    assert ops.alerts(store, T0 + 60).stalled is None
    assert ops.alerts(store, T0 + 600).stalled is not None


def test_no_live_notices_is_not_a_stall(store: Store) -> None:
    """An idle system whose last sweep is old is fine: nothing waits."""
    settings = make_settings()
    _enqueue(store, settings, T0)
    run_sweep(store, settings, FakeClock(T0))
    assert store.live_summary()[0] == 0
    assert ops.alerts(store, T0 + 86400).stalled is None


def _corrupt(path: Path) -> None:
    path.write_bytes(b"this is not a database, just some bytes " * 200)


def _newer(path: Path) -> None:
    Store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")


ERRORS = {
    "missing database": (lambda db, cfg: None, "no such file"),
    "empty file": (lambda db, cfg: db.write_bytes(b""), "not a resetctl database"),
    "corrupt database": (lambda db, cfg: _corrupt(db), "not a database"),
    "newer schema": (lambda db, cfg: _newer(db), "newer than this resetctl"),
    "bad config": (lambda db, cfg: cfg.write_text("nonsense = 1\n"), "nonsense: unknown key"),
    "unreadable config": (lambda db, cfg: cfg.mkdir(), "cannot read"),
    "invalid TOML": (lambda db, cfg: cfg.write_text("[[[\n"), "config"),
}


@pytest.mark.parametrize("kind", sorted(ERRORS))
@pytest.mark.parametrize("json_output", [False, True])
def test_every_error_is_unknown_exit_3(tmp_path: Path, kind: str, json_output: bool) -> None:
    """Missing or broken database, bad or unreadable config: UNKNOWN, and JSON with --json."""
    db_path, config = tmp_path / "typo.db", tmp_path / "c.toml"
    prepare, expected = ERRORS[kind]
    if kind not in ("missing database",) and "config" in kind:
        Store(db_path).close()
    else:
        config.write_text("")
    prepare(db_path, config)
    args = ["--config", str(config), *(["--json"] if json_output else [])]
    result = _cli_alerts(db_path, T0, *args)
    assert result.exit_code == 3, result.output
    if json_output:
        shown = json.loads(result.stdout)
        assert shown["status"] == "unknown"
        assert expected in shown["error"]
    else:
        assert result.stdout.startswith("UNKNOWN: ")
        assert expected in result.stdout
    if kind == "missing database":
        assert not db_path.exists()
