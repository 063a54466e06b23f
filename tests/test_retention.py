"""Retention per region: `purge` keeps each policy's finished notices exactly as long as
its retention says (today's config, else its newest stored record, else --older-than),
the daily aggregates by their own retention, and health and the metrics unchanged."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import time_machine
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep
from typer.testing import CliRunner, Result

import resetctl
from resetctl import ops
from resetctl.cli import app
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.store.operations import ALL_TIME_DAY
from resetctl.summary import iso

DAY = 86400.0
#: Two regions with retention of their own, and one without (it takes --older-than).
REGIONS = {"default": {}, "eu": {"retention": "7d"}, "us": {"retention": "90d"}, "apac": {}}
#: What a purge at NOW keeps of a notice finished this many days earlier, per region
#: (older_than 30d): exactly its retention is kept, a second more is not.
AGES = (1.0, 6.0, 7.0, 7.0 + 1 / DAY, 8.0, 29.0, 30.0, 31.0, 89.0, 90.0, 90.0 + 1 / DAY, 91.0)
#: Purges run here; every sweep runs before it, in the past (PostgreSQL claims what is
#: due on its own clock).
NOW = T0 + 300 * DAY
#: Tables the statements of a purge may only read by index.
GROWING = (
    "notices",
    "attempts",
    "events",
    "observations",
    "outbox",
    "limit_counts",
    "daily_counts",
    "refusals",
)
#: Health figures that describe the store as it is now, not a window.
NOT_WINDOWED = {"notices_by_phase", "last_sweep_at", "seconds_since_last_sweep"}


def _settings(regions: dict[str, dict[str, Any]] | None = None, **overrides: Any) -> Settings:
    return make_settings(policy=REGIONS if regions is None else regions, **overrides)


def _finish(store: Store, settings: Settings, region: str, at: float, count: int = 1) -> list[str]:
    """``count`` notices of ``region`` enqueued and accepted at ``at`` (they finish then)."""
    results = enqueue(store, settings, [reset_request(region=region) for _ in range(count)], at)
    run_sweep(store, settings, FakeClock(at))
    return [r.notice_id for r in results]


def _finished(store: Store) -> dict[str, tuple[str, float]]:
    """Finished notices: id -> (policy name, when it finished)."""
    rows = store.conn.execute(
        "SELECT id, policy_name, phase_since FROM notices WHERE due_at IS NULL"
    ).fetchall()
    return {str(i): (str(p), float(t)) for i, p, t in rows}


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).date().isoformat()


def _count(store: Store, table: str, where: str = "true") -> int:
    (count,) = store.conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}").fetchone()
    return int(count)


def _windowed(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in NOT_WINDOWED}


def _counters(store: Store, now: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every counter sample the metrics would write."""
    found = {}
    for family in ops.metric_families(store, now):
        if family.type == "counter":
            for sample in family.samples:
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _cli(*args: str, now: float = NOW) -> Result:
    """The command line in-process at ``now``."""
    with time_machine.travel(now, tick=False):
        return CliRunner().invoke(app, list(args), env={"RESETCTL_DB": ""})


def _config(tmp_path: Path, body: str) -> str:
    path = tmp_path / "resetctl.toml"
    path.write_text(body, encoding="utf-8")
    return str(path)


def test_each_region_keeps_its_rows_exactly_its_retention(store: Store) -> None:
    """eu (7d) and us (90d) rows go once past their own retention and not a second
    earlier; apac, with none, goes by --older-than; the report says which rule applied."""
    settings = _settings()
    for region in ("eu", "us", "apac"):
        for age in AGES:
            _finish(store, settings, region, NOW - age * DAY)
    before = _finished(store)
    keep = {"eu": 7 * DAY, "us": 90 * DAY, "apac": 30 * DAY, "default": 30 * DAY}
    expected = {i for i, (policy, at) in before.items() if at >= NOW - keep[policy]}

    report = ops.purge(store, 30 * DAY, NOW, batch=3, policies=settings.policies)

    assert set(_finished(store)) == expected
    assert report.deleted_by_policy == {"apac": 5, "default": 0, "eu": 9, "us": 2}
    assert report.deleted == len(before) - len(expected)
    assert {n: (r.seconds, r.source.value) for n, r in report.retention.items()} == {
        "apac": (30 * DAY, "older_than"),
        "default": (30 * DAY, "older_than"),
        "eu": (7 * DAY, "config"),
        "us": (90 * DAY, "config"),
    }
    # A second run at the same time finds nothing more: nothing left is past its retention.
    assert ops.purge(store, 30 * DAY, NOW, policies=settings.policies).deleted == 0


@pytest.mark.parametrize("older_than_days", [1.0, 30.0, 365.0])
def test_a_policys_retention_wins_over_older_than_both_ways(
    store: Store, older_than_days: float
) -> None:
    """Whatever --older-than says, eu keeps 7 days: never deleted earlier (older_than
    1d), never kept longer (older_than 365d); apac follows --older-than."""
    settings = _settings()
    recent = _finish(store, settings, "eu", NOW - 6 * DAY)
    old = _finish(store, settings, "eu", NOW - 8 * DAY)
    apac = _finish(store, settings, "apac", NOW - 20 * DAY)

    ops.purge(store, older_than_days * DAY, NOW, policies=settings.policies)

    left = set(_finished(store))
    assert set(recent) <= left
    assert not set(old) & left
    assert (set(apac) <= left) == (older_than_days > 20)


def test_a_shortened_retention_reaches_rows_already_stored(store: Store) -> None:
    """Rows enqueued under eu version 1 (90d) go by today's eu version 2 (7d): retention
    is a rule about rows at rest, not one resolved at enqueue."""
    first = _settings({"default": {}, "eu": {"retention": "90d"}})
    stored = _finish(store, first, "eu", NOW - 30 * DAY, count=2)
    today = _settings({"default": {}, "eu": {"version": 2, "retention": "7d"}})

    report = ops.purge(store, 365 * DAY, NOW, policies=today.policies)

    assert report.deleted_by_policy["eu"] == 2
    assert not set(stored) & set(_finished(store))


def test_a_policy_removed_from_config_keeps_its_newest_stored_retention(store: Store) -> None:
    """legacy is no longer configured: its newest stored record (version 2, 14d) rules
    its rows, not version 1's 60d nor --older-than; a removed policy whose record sets
    no retention goes by --older-than."""
    v1 = _settings({"default": {}, "legacy": {"retention": "60d"}, "old": {}})
    v2 = _settings({"default": {}, "legacy": {"version": 2, "retention": "14d"}})
    under_v1 = _finish(store, v1, "legacy", NOW - 20 * DAY)
    kept = _finish(store, v2, "legacy", NOW - 13 * DAY)
    gone = _finish(store, v2, "legacy", NOW - 15 * DAY)
    old_kept = _finish(store, v1, "old", NOW - 40 * DAY)
    old_gone = _finish(store, v1, "old", NOW - 50 * DAY)
    today = _settings({"default": {}})

    report = ops.purge(store, 45 * DAY, NOW, policies=today.policies)

    left = set(_finished(store))
    assert left == {*kept, *old_kept}
    assert not {*under_v1, *gone, *old_gone} & left
    assert report.retention["legacy"] == ops.Retention(14 * DAY, ops.RetentionSource.STORED)
    assert report.retention["old"] == ops.Retention(45 * DAY, ops.RetentionSource.OLDER_THAN)
    assert report.deleted_by_policy == {"default": 0, "legacy": 2, "old": 1}


def _outcomes(store: Store, settings: Settings, start: float, regions: Sequence[str]) -> None:
    """Per region: an email accepted, one bounced (then the SMS fallback, if any), and
    one never answered (the SMS fallback, or an expiry)."""
    for region in regions:
        accepted, bounced, _ = (
            r.notice_id
            for r in enqueue(
                store, settings, [reset_request(region=region) for _ in range(3)], start
            )
        )
        clock = FakeClock(start)
        run_sweep(store, settings, clock)
        for notice_id, status in ((accepted, "accepted"), (bounced, "failed")):
            (message,) = store.outbox_messages(notice_id)
            store.outbox_set_status(message["message_id"], status, start)
        clock.now = start + 1
        run_sweep(store, settings, clock, max_runtime=900)


def test_health_and_metrics_are_unchanged_by_a_per_region_purge(store: Store) -> None:
    """Purging eu (7d) and us (90d) rows at their own ages leaves every windowed health
    figure and every metrics counter as it was."""
    regions = {**REGIONS, "apac": {"channels": ["email"]}}  # an unanswered email expires
    settings = _settings(regions, outbox={"email_status": "pending", "sms_status": "delivered"})
    for age in (3.0, 10.0, 60.0, 100.0):
        _outcomes(store, settings, NOW - age * DAY, ["eu", "us", "apac"])
    window = 200 * DAY
    health = ops.health(store, NOW, window)
    counters = _counters(store, NOW)
    assert health["expired_without_outcome"] > 0
    assert health["attempts"]["email"]["failed"] > 0

    report = ops.purge(store, 30 * DAY, NOW, policies=settings.policies)

    assert report.deleted_by_policy == {"apac": 6, "default": 0, "eu": 9, "us": 3}
    assert _windowed(ops.health(store, NOW, window)) == _windowed(health)
    assert _counters(store, NOW) == counters


def test_aggregates_keep_their_own_retention(store: Store) -> None:
    """A day of aggregates goes once the whole day ended more than
    aggregates_older_than ago, never the day after; its counts join the all-time totals,
    so the metrics' counters and health over the days kept do not change."""
    now = T0 + 500 * DAY + 12 * 3600
    settings = _settings(outbox={"email_status": "pending", "sms_status": "delivered"})
    _outcomes(store, settings, T0, ["eu"])  # 500 days old
    _outcomes(store, settings, T0 + 300 * DAY, ["eu"])  # 200 days old
    kept_from = _day(now - 400 * DAY)
    with store.transaction() as conn:
        conn.executemany(
            "INSERT INTO refusals (day, minute, policy, reason, count)"
            " VALUES (?, ?, 'eu', 'rate_limited', ?)",
            [
                (_day(at), int(at // 60), n)
                for at, n in ((T0, 3), (now - 401 * DAY, 2), (now - 400 * DAY, 5))
            ],
        )
    ops.purge(store, 30 * DAY, now, policies=settings.policies, aggregates_older_than=3660 * DAY)
    assert _count(store, "notices") == 0
    assert _count(store, "daily_counts", f"day = '{_day(T0)}'") > 0
    counters = _counters(store, now)
    health = ops.health(store, now, 300 * DAY)
    folded = _count(store, "daily_counts", f"day = '{_day(T0)}'")

    report = ops.purge(store, 30 * DAY, now, policies=settings.policies)

    assert report.aggregates_kept_from == kept_from
    assert report.daily_counts_deleted == folded
    assert report.refusals_deleted == 2
    assert _count(store, "daily_counts", f"day < '{kept_from}' AND day <> '{ALL_TIME_DAY}'") == 0
    assert _count(store, "daily_counts", f"day = '{_day(T0 + 300 * DAY)}'") > 0
    refusals = dict(store.conn.execute("SELECT day, count FROM refusals").fetchall())
    assert refusals == {ALL_TIME_DAY: 5, kept_from: 5}
    assert _counters(store, now) == counters
    assert _windowed(ops.health(store, now, 300 * DAY)) == _windowed(health)


def test_idle_limit_counters_go_after_the_longest_window(store: Store) -> None:
    """A counter last counted more than 30 days ago (no limit window is longer) goes; one
    counted at 30 days exactly, or since, stays."""
    with store.transaction() as conn:
        conn.executemany(
            "INSERT INTO limit_counts (rule, policy, subject, counts, last_at)"
            " VALUES ('recipient', 'eu', ?, '[]', ?)",
            [("idle", NOW - 30 * DAY - 1), ("edge", NOW - 30 * DAY), ("busy", NOW - DAY)],
        )

    report = ops.purge(store, 30 * DAY, NOW, batch=1)

    assert report.limit_counts_deleted == 1
    subjects = {row[0] for row in store.conn.execute("SELECT subject FROM limit_counts")}
    assert subjects == {"edge", "busy"}


class _Recording:
    """A connection that remembers every statement and its values, then runs it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.seen: list[tuple[str, Any]] = []

    def execute(self, sql: str, parameters: Any = None, /) -> Any:
        self.seen.append((sql, parameters))
        return self.conn.execute(sql, () if parameters is None else parameters)

    def executemany(self, sql: str, rows: Any, /) -> Any:
        return self.conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _plans(store: Store, seen: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(statement, its plan) of every statement that reads or writes a table."""
    raw = store.conn
    if store.backend == "postgresql":
        # Tables this small are cheaper to scan whole: forbid that, to see the index used.
        raw.execute("SET enable_seqscan = off")
    explain = "EXPLAIN QUERY PLAN " if store.backend == "sqlite" else "EXPLAIN "
    plans = []
    for sql, parameters in seen:
        if sql.split()[0].upper() not in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH"):
            continue
        rows = raw.execute(explain + sql, () if parameters is None else parameters).fetchall()
        plans.append(
            (sql, " | ".join(str(row[-1] if store.backend == "sqlite" else row[0]) for row in rows))
        )
    return plans


def _scans(store: Store, plan: str) -> list[str]:
    """The steps of a plan that read a growing table whole."""
    steps = plan.split(" | ")
    if store.backend == "sqlite":
        return [s for s in steps if any(s.strip().startswith(f"SCAN {t}") for t in GROWING)]
    return [s for s in steps if any(f"Seq Scan on {t}" in s for t in GROWING)]


def test_purge_reads_each_policys_rows_by_its_index(store: Store) -> None:
    """Every statement of a purge reads by index: each policy's finished notices through
    notices_finished_policy, the aggregates by day, the limit counters by last_at."""
    settings = _settings()
    for region in ("eu", "us", "apac"):
        for age in (1.0, 8.0, 40.0, 100.0):
            _finish(store, settings, region, NOW - age * DAY, count=20)
    live = _settings(outbox={"email_status": "pending", "sms_status": "pending"})
    enqueue(store, live, [reset_request(region="eu") for _ in range(20)], NOW)
    with store.transaction() as conn:
        conn.executemany(
            "INSERT INTO limit_counts (rule, policy, subject, counts, last_at)"
            " VALUES ('recipient', 'eu', ?, '[]', ?)",
            [(f"s{i}", NOW - i * DAY) for i in range(60)],
        )
        conn.executemany(
            "INSERT INTO refusals (day, minute, policy, reason, count)"
            " VALUES (?, ?, 'eu', 'rate_limited', 1)",
            [(_day(NOW - i * DAY), int((NOW - i * DAY) // 60)) for i in range(390, 410)],
        )
    store.conn.execute("ANALYZE")
    recording = _Recording(store.conn)
    store.conn = recording  # type: ignore[assignment]
    try:
        report = ops.purge(store, 30 * DAY, NOW, batch=25, policies=settings.policies)
    finally:
        store.conn = recording.conn
    assert report.deleted > 0
    assert report.limit_counts_deleted > 0
    assert report.refusals_deleted > 0

    plans = _plans(store, recording.seen)

    assert [(sql[:120], _scans(store, plan)) for sql, plan in plans if _scans(store, plan)] == []
    walks = [plan for sql, plan in plans if "policy_name = ?" in sql and "phase_since <" in sql]
    assert len(walks) >= 4  # one per policy at least (some in several batches)
    assert all("notices_finished_policy" in plan for plan in walks), walks


def test_purge_json_and_text_say_what_went_per_policy(
    db: str, store: Store, tmp_path: Path
) -> None:
    """--json keeps at and deleted and adds the count and the rule per policy and the
    aggregate rows; the text names each policy, its count and where its retention came
    from."""
    config = _config(tmp_path, '[policy.eu]\nretention = "7d"\n\n[policy.apac]\n')
    settings = _settings({"default": {}, "eu": {"retention": "7d"}, "apac": {}})
    _finish(store, settings, "eu", NOW - 8 * DAY, count=2)
    _finish(store, settings, "apac", NOW - 31 * DAY)

    shown = _cli("purge", "--json", "--db", db, "--config", config)

    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["deleted"] == 3
    assert report["at"] == iso(NOW)
    assert report["deleted_by_policy"] == {"apac": 1, "default": 0, "eu": 2}
    assert report["retention_by_policy"]["eu"] == {"seconds": 7 * DAY, "from": "config"}
    assert report["retention_by_policy"]["apac"] == {"seconds": 30 * DAY, "from": "older_than"}
    assert report["aggregates_deleted"] == {"daily_counts": 0, "refusals": 0}
    assert report["aggregates_kept_from"] == _day(NOW - 400 * DAY)
    assert report["limit_counts_deleted"] == 0
    _finish(store, settings, "eu", NOW - 8 * DAY)
    text = _cli("purge", "--db", db, "--config", config).stdout
    assert text.splitlines()[0] == "deleted 1 finished notice(s)"
    assert any(line.split()[:4] == ["eu", "1", "kept", "7d"] for line in text.splitlines())
    assert "no retention set: --older-than" in text


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--aggregates-older-than", "0", "must be a positive duration"),
        ("--aggregates-older-than", "12h", "must be at least 1d"),
        ("--aggregates-older-than", "3661d", "must be at most 3660d"),
        ("--aggregates-older-than", "soon", "is not a duration"),
        ("--older-than", "0", "must be a positive duration"),
    ],
)
def test_a_bad_value_names_its_option_exits_2_and_deletes_nothing(
    db: str, store: Store, option: str, value: str, says: str
) -> None:
    """A bad retention is one line naming the option, exit 2, and not one row deleted."""
    settings = _settings()
    _finish(store, settings, "eu", NOW - 100 * DAY, count=2)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO refusals (day, minute, policy, reason, count)"
            " VALUES ('2020-01-01', 26298720, 'eu', 'x', 1)"
        )
    tables = ("notices", "events", "attempts", "daily_counts", "refusals")
    before = {table: _count(store, table) for table in tables}

    refused = _cli("purge", "--db", db, option, value)

    assert refused.exit_code == 2
    assert refused.stderr.startswith(f"error: {option}: ")
    assert says in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert {table: _count(store, table) for table in tables} == before


def test_the_api_refuses_bad_values_before_deleting(db: str, store: Store) -> None:
    """The Python API checks its values first too, naming each parameter."""
    _finish(store, _settings(), "eu", NOW - 100 * DAY)
    with resetctl.open(db, _settings(), clock=lambda: NOW) as handle:
        for bad, name in (
            ({"aggregates_older_than": 0}, "aggregates_older_than"),
            ({"older_than": 0.0}, "older_than"),
            ({"batch_size": 0}, "batch_size"),
        ):
            with pytest.raises(ConfigError, match=f"^{name}: "):
                handle.purge(**bad)
        assert _count(store, "notices") == 1
        assert handle.purge()["deleted_by_policy"]["eu"] == 1


def test_purge_help_states_the_rules_with_an_example() -> None:
    """purge --help says which retention applies and shows it at work."""
    shown = _cli("purge", "--help").stdout
    flat = " ".join(shown.split())
    assert "for a policy no longer configured, the retention in the newest record" in flat
    assert "never deleted before it has passed, nor kept past the first purge" in flat
    assert "--aggregates-older-than is the aggregates' own retention" in flat
    assert "resetctl purge --older-than 90d --aggregates-older-than 730d --json" in shown
