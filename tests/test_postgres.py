"""PostgreSQL's own guarantees: one clock for leases, terminal rows guarded by a trigger,
time-outs, a lost connection treated as a crash, and every command on a server database."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pgcluster
import pytest
from conftest import T0, FakeClock, make_settings, reset_request, resetctl, run_sweep
from typer.testing import CliRunner

from resetctl.cli import app
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError, StoreError
from resetctl.machine import Phase
from resetctl.store import Store, open_store
from resetctl.store.postgres.connection import connect


def _database_later(store: Store, seconds: float) -> None:
    """Move this session's view of the database clock forward (a lease passes at once)."""
    store.conn.execute(f"SET resetctl.clock_offset = '{seconds}'")


def test_a_uri_without_the_driver_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, a postgresql:// database is one line naming the extra to install."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StoreError, match=r"pip install 'resetctl\[postgres\]'"):
        connect("postgresql:///nowhere?host=/nonexistent")
    result = CliRunner().invoke(app, ["health", "--db", "postgresql:///nowhere?host=/nonexistent"])
    assert result.exit_code != 0
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1, result.output
    assert "pip install 'resetctl[postgres]'" in lines[0]


def test_a_password_in_the_uri_is_refused(db: str) -> None:
    """A password belongs in PGPASSWORD or ~/.pgpass, never in argv: the URI is refused
    as bad input (every spelling: test_pg_secrets)."""
    with_password = db.replace("postgresql://", "postgresql://postgres:hunter2@", 1)
    with pytest.raises(ConfigError, match="PGPASSWORD") as raised:
        open_store(with_password)
    assert "hunter2" not in str(raised.value)


def test_every_statement_has_time_outs(store: Store) -> None:
    """statement_timeout and lock_timeout are set on every connection."""
    (statement,) = store.conn.execute("SHOW statement_timeout").fetchone()
    (lock,) = store.conn.execute("SHOW lock_timeout").fetchone()
    assert statement == "30s"
    assert lock == "10s"


def test_a_host_whose_clock_runs_fast_never_takes_over_a_live_lease(store: Store, db: str) -> None:
    """Leases are read on the database's clock: a host 30 s (or an hour) fast sees them live."""
    now = time.time()
    (notice_id,) = [r.notice_id for r in enqueue(store, make_settings(), [reset_request()], now)]
    (held,) = store.claim_due("honest", now, 60.0, 10)
    with Store(db) as fast:
        for skew in (30.0, 61.0, 3600.0):
            assert fast.claim_due("fast", now + skew, 60.0, 10) == []
        _database_later(fast, 61.0)  # now the lease has really passed
        (taken,) = fast.claim_due("fast", now + 3600.0, 60.0, 10)
    assert taken.notice_id == notice_id == held.notice_id
    assert taken.recovered


def test_the_database_refuses_to_move_a_terminal_notice(store: Store) -> None:
    """A trigger guards terminal rows against any writer, not only the compare-and-set."""
    settings = make_settings()
    (notice_id,) = [r.notice_id for r in enqueue(store, settings, [reset_request()], T0)]
    run_sweep(store, settings, FakeClock(T0))
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    assert loaded.state.phase is Phase.ACCEPTED
    import psycopg

    for change in ("phase = 'queued'", f"due_at = {T0}"):
        with pytest.raises(psycopg.errors.CheckViolation, match="terminal"):
            store.conn.execute(f"UPDATE notices SET {change} WHERE id = ?", (notice_id,))


def test_a_lost_connection_mid_sweep_is_a_crash_that_a_later_sweep_recovers(
    store: Store, db: str, pg_admin: str
) -> None:
    """The server drops a worker after its claim: its lease runs out and another sweep
    finishes the notice, sending each message once."""
    settings = make_settings()
    now = time.time()
    ids = [r.notice_id for r in enqueue(store, settings, [reset_request() for _ in range(3)], now)]
    with Store(db) as doomed:
        claims = doomed.claim_due("doomed", now, 60.0, 10)
        assert len(claims) == 3
        (pid,) = doomed.conn.execute("SELECT pg_backend_pid()").fetchone()
        with connect(pg_admin) as admin:
            admin.execute(f"SELECT pg_terminate_backend({int(pid)})")
        with pytest.raises(Exception, match=r"terminat|closed|connection"):
            doomed.load_notices([c.notice_id for c in claims])
    assert store.claim_due("rescuer", now, 60.0, 10) == []  # the lease is still live
    _database_later(store, 61.0)
    summary = run_sweep(store, settings, FakeClock(now + 61.0), worker="rescuer")
    assert summary.lease_recoveries == 3
    for notice_id in ids:
        loaded = store.load_notice(notice_id)
        assert loaded is not None
        assert loaded.state.phase is Phase.ACCEPTED
    messages = store.outbox_messages()
    assert sorted(m["notice_id"] for m in messages) == sorted(ids)


def test_every_command_works_on_a_server_database(db: str, tmp_path: Path) -> None:
    """enqueue --send, sweep, inspect, outbox, export-timings, replay, health, alerts,
    metrics, purge and demo, by the real command line on one PostgreSQL database."""

    def run(*args: str, stdin: str | None = None) -> Any:
        done = resetctl(*args, db=db, input=stdin)
        assert done.returncode == 0, (args, done.stderr)
        return done

    requests = [reset_request() for _ in range(3)]
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    sent = run("enqueue", "--send", stdin=lines)
    assert sent.stdout.count("ntc_") == 3
    run("sweep")
    ids = [m["notice_id"] for m in json.loads(run("outbox", "list", "--json").stdout)]
    assert len(ids) == 3
    report = json.loads(run("inspect", ids[0], "--json").stdout)
    assert report["phase"] == "accepted"
    message_id = json.loads(run("outbox", "list", "--json").stdout)[0]["message_id"]
    assert json.loads(run("outbox", "show", message_id, "--json").stdout)["scrubbed"]
    traces = tmp_path / "week.jsonl"
    run("export-timings", "--output", str(traces))
    assert len(traces.read_text().splitlines()) == 1 + 3  # the header, then a trace each
    run("replay", str(traces))
    assert json.loads(run("health", "--json", "--storage").stdout)
    run("alerts", "--json")
    run("metrics", "--textfile", str(tmp_path / "m.prom"))
    assert "resetctl_" in (tmp_path / "m.prom").read_text()
    time.sleep(1.2)
    purged = json.loads(run("purge", "--older-than", "1s", "--json").stdout)
    assert 3 in purged.values(), purged
    with Store(db) as store:
        assert store.row_counts()["notices"] == 0


def test_the_demo_runs_on_an_empty_server_database(db: str) -> None:
    """`resetctl demo --db postgresql://…` runs on an empty database."""
    done = resetctl("demo", "--db", db)
    assert done.returncode == 0, done.stderr
    assert "accepted" in done.stdout


def test_the_cluster_is_on_a_unix_socket(pg_admin: str) -> None:
    """The throwaway cluster listens on no TCP port."""
    with connect(pg_admin) as admin:
        (listen,) = admin.execute("SHOW listen_addresses").fetchone()
    assert listen == ""
    assert "host=/" in pg_admin
    assert pgcluster.bin_dir() is not None


def test_the_ended_watermark_never_skips_an_event_that_commits_late(store: Store, db: str) -> None:
    """Event ids are handed out at insert: a transaction that inserted first and commits
    last is still reported once, in a later read (the watermark follows finished
    transactions, not ids)."""
    settings = make_settings()
    early, late = [
        r.notice_id for r in enqueue(store, settings, [reset_request(), reset_request()], T0)
    ]
    ended = (
        "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase, reason)"
        " VALUES (?, ?, 'w', 'tick', 'primary_pending', 'expired', 'link_expired')"
    )
    with Store(db) as slow:
        with slow.transaction() as conn:
            conn.execute(ended, (early, T0 + 1))  # the lower id, committed last
            with store.transaction() as other:
                other.execute(ended, (late, T0 + 2))
            first, mark = store.ended_since(0, T0)
        second, _ = store.ended_since(mark, T0)
    # While the older transaction is open, nothing after it is reported; once it ends,
    # both are, in the order their transactions began.
    assert first == []
    assert [r["notice_id"] for r in second] == [early, late]


def test_hosts_opening_an_empty_database_together_create_the_schema_once(db: str) -> None:
    """Migrations hold an advisory lock: four hosts starting at once all open it."""
    from concurrent.futures import ThreadPoolExecutor

    def open_and_read(_: int) -> bytes:
        with Store(db) as opened:
            return opened.salt()

    with ThreadPoolExecutor(4) as pool:
        salts = set(pool.map(open_and_read, range(4)))
    assert len(salts) == 1


def test_a_database_from_a_newer_resetctl_is_refused(store: Store, db: str) -> None:
    """A schema version above this code's is not touched."""
    from resetctl.schema_facts import SCHEMA_VERSION

    store.conn.execute(
        "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    with pytest.raises(StoreError, match="newer than this resetctl"):
        Store(db)


def test_a_fast_host_waits_out_a_live_lease_instead_of_asking_again_at_once(
    store: Store, db: str
) -> None:
    """A --max-runtime sweep whose clock says another host's lease has passed, while the
    database says it has not, asks once per idle poll, not in a tight loop."""
    settings = make_settings()
    now = time.time()
    enqueue(store, settings, [reset_request()], now)
    assert len(store.claim_due("holder", now, 60.0, 10)) == 1
    with Store(db) as fast:
        claims = 0
        claim_due = fast.claim_due

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal claims
            claims += 1
            return claim_due(*args, **kwargs)

        fast.claim_due = counted  # type: ignore[method-assign]
        from resetctl.sweep import Sweeper
        from resetctl.transports import build_transports
        from resetctl.work import SweepOptions

        def ahead() -> float:
            return time.time() + 90.0

        sweeper = Sweeper(fast, settings, build_transports(settings, fast, ahead), clock=ahead)
        summary = sweeper.run(SweepOptions("fast", 10, 60.0, 2.0))
    assert summary.claimed == 0
    assert claims <= 5, claims


def _wait_until_blocked(admin: Any, pid: int) -> None:
    """Until backend ``pid`` waits for another transaction's row lock."""
    for _ in range(10_000):
        (waiting,) = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ? AND wait_event_type = 'Lock'",
            (pid,),
        ).fetchone()
        if waiting:
            return
        time.sleep(0.001)
    pytest.fail(f"backend {pid} never waited for a lock")


def test_a_round_the_server_rolls_back_to_break_a_deadlock_is_written_again(
    store: Store, db: str, pg_admin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two writers locking the same attempts in opposite orders deadlock; when the
    server picks the sweep's round as the victim, the round is written again, whole and
    once, instead of the sweep dying with 'deadlock detected'."""
    import threading

    from resetctl.machine import ActionKind, AttemptState, Decision, Reason
    from resetctl.store.records import OutcomeFacts, Step

    settings = make_settings()
    requests = [reset_request(), reset_request()]
    ids = sorted(r.notice_id for r in enqueue(store, settings, requests, T0))
    run_sweep(store, settings, FakeClock(T0))
    first, second = (store.attempt_rows(n)[0]["attempt_key"] for n in ids)
    steps = [  # a stale worker's outcomes: its decisions lose, its facts are kept
        Step(
            notice_id=notice_id,
            version=0,
            lease_token=None,
            old_phase=Phase.PRIMARY_PENDING,
            decision=Decision(Phase.PRIMARY_PENDING, ActionKind.POLL, "email", T0, Reason.RETRY),
            release=False,
            facts=OutcomeFacts(key, AttemptState.REJECTED, None, None, None, "refused"),
            kind="outcome",
            worker="stale",
            now=T0,
        )
        for notice_id, key in zip(ids, (first, second), strict=True)
    ]
    before = store.event_rows(ids[0]) + store.event_rows(ids[1])
    # The round's session finds the cycle first, so the server makes it the victim.
    store.conn.execute("SET deadlock_timeout = '10ms'")
    caplog.set_level("INFO", logger="resetctl.store")
    (pid,) = store.conn.execute("SELECT pg_backend_pid()").fetchone()
    with connect(pg_admin) as admin, connect(db, "other writer") as other:
        other.execute("SET deadlock_timeout = '30s'")
        other.execute("BEGIN")
        other.execute("UPDATE attempts SET last_error = 'other' WHERE attempt_key = ?", (second,))
        written: list[object] = []

        def write() -> None:
            try:
                written.append(store.write_round(steps))
            except Exception as exc:  # reported by the assertion below
                written.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        _wait_until_blocked(admin, int(pid))  # the round holds `first`, waits for `second`
        other.execute("UPDATE attempts SET last_error = 'other' WHERE attempt_key = ?", (first,))
        other.execute("COMMIT")
        writer.join(timeout=60)
    rolled_back = [r.getMessage() for r in caplog.records if r.name == "resetctl.store"]
    assert rolled_back == ["write rolled back by the database (DeadlockDetected); again"], (
        "the premise: the server broke one deadlock, the round's"
    )
    assert len(written) == 1, "the round never finished"
    assert isinstance(written[0], list), written[0]
    for notice_id, key in zip(ids, (first, second), strict=True):
        (attempt,) = [a for a in store.attempt_rows(notice_id) if a["attempt_key"] == key]
        assert attempt["last_error"] == "refused"  # the round's facts, written after the other's
    after = store.event_rows(ids[0]) + store.event_rows(ids[1])
    assert len(after) - len(before) == len(steps)  # once each, nothing from the rolled-back try


def undo_version_7(store: Store) -> None:
    """Take a new database back to version 6 (what 6 → 7 added)."""
    store.conn.execute("ALTER TABLE notices DROP COLUMN consent")
    store.conn.execute("DROP INDEX notices_finished_policy")
    store.conn.execute("DROP TABLE limit_counts")
    store.conn.execute("DROP TABLE refusals")


def test_a_version_6_database_learns_consent_retention_and_limits(store: Store, db: str) -> None:
    """Migrating 6 → 7 adds the consent column, the per-policy purge index and the
    tables of limit counts and refusals, as a new database has them."""
    undo_version_7(store)
    store.conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    with Store(db) as migrated:
        tables = {
            name
            for (name,) in migrated.conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
        assert {"limit_counts", "refusals"} <= tables
        (indexed,) = migrated.conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'notices_finished_policy'"
        ).fetchone()
        assert indexed == 1
        (consent,) = migrated.conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'notices' AND column_name = 'consent'"
        ).fetchone()
        assert consent == 1


def test_a_version_5_database_learns_the_cancelled_phase_and_the_account_index(
    store: Store, db: str
) -> None:
    """Migrating 5 → 6 replaces the terminal guard (a cancelled notice never moves again)
    and adds the account index and the events' lane wait, as a new database has them."""
    import psycopg

    from resetctl.controls import cancel
    from resetctl.machine import Reason

    store.conn.execute("DROP INDEX notices_account")
    store.conn.execute("ALTER TABLE events DROP COLUMN lane_wait")
    undo_version_7(store)
    store.conn.execute(
        "CREATE OR REPLACE FUNCTION notices_terminal_guard() RETURNS trigger"
        " LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$"
    )
    store.conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    with Store(db) as migrated:
        (indexed,) = migrated.conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'notices_account'"
        ).fetchone()
        assert indexed == 1
        (waits,) = migrated.conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'events' AND column_name = 'lane_wait'"
        ).fetchone()
        assert waits == 1
        settings = make_settings()
        (notice_id,) = [r.notice_id for r in enqueue(migrated, settings, [reset_request()], T0)]
        cancel(migrated, [notice_id], Reason.WITHDRAWN, T0)
        with pytest.raises(psycopg.errors.CheckViolation, match="terminal"):
            migrated.conn.execute("UPDATE notices SET phase = 'queued' WHERE id = ?", (notice_id,))
