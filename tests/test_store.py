"""The store: schema and migration, the claim's plan, compare-and-set, uniqueness."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import INTEGRITY_ERRORS, T0, FakeClock, make_settings, reset_request

from resetctl.enqueue import enqueue
from resetctl.errors import StoreError
from resetctl.machine import ActionKind, Decision, Phase, Reason
from resetctl.store import SCHEMA_VERSION, IntentFacts, Step, Store


def test_new_file_gets_the_schema_in_wal_mode(db_path: Path) -> None:
    """Opening a new file creates schema.sql's tables, in WAL mode, at the current version."""
    with Store(db_path) as store:
        tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master")}
        assert {"notices", "notice_secrets", "attempts", "observations", "events"} <= tables
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with Store(db_path) as again:  # reopening migrates nothing and loses nothing
        assert again.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_file_from_a_newer_resetctl_is_refused(db_path: Path) -> None:
    """A database written by a newer schema is not touched."""
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this resetctl"):
        Store(db_path)


def test_claim_uses_the_live_notice_index_among_many_finished(store: Store) -> None:
    """The claim searches the partial index: no full scan, no temp B-tree, however many are done."""
    with store.transaction() as conn:
        conn.executemany(
            "INSERT INTO notices (id, idempotency_key, request_digest, region, policy_name,"
            " policy_version, channels, created_at, expires_at, phase, phase_since, due_at)"
            " VALUES (?, ?, 'd', 'default', 'default', 1, 'email', ?, ?, ?, ?, ?)",
            [
                (
                    f"n{i}",
                    f"k{i}",
                    T0,
                    T0 + 600,
                    "accepted" if i % 100 else "queued",
                    T0,
                    None if i % 100 else T0 + i,
                )
                for i in range(20_000)
            ],
        )
    store.conn.execute("ANALYZE")
    plan = " | ".join(store.explain_claim())
    if store.backend == "sqlite":
        assert "USING INDEX notices_due" in plan
        assert "SCAN notices" not in plan
        assert "TEMP B-TREE" not in plan
    else:
        assert "Index Scan using notices_due" in plan
        assert "Seq Scan" not in plan  # (its one Sort orders the claimed batch only)
    claims = store.claim_due("w", T0 + 10_000, 60.0, 50)
    assert len(claims) == 50
    assert [c.notice_id for c in claims] == [f"n{i}" for i in range(0, 5000, 100)]


def test_claim_takes_oldest_due_first_and_each_notice_once(store: Store, clock: FakeClock) -> None:
    """Claims come oldest-due first; a claimed notice is not claimable again while leased."""
    settings = make_settings()
    ids = []
    for _ in range(3):
        ids += [r.notice_id for r in enqueue(store, settings, [reset_request()], clock())]
        clock.advance(1)
    first = store.claim_due("a", clock(), 60.0, 2)
    second = store.claim_due("b", clock(), 60.0, 2)
    assert [c.notice_id for c in first] == ids[:2]
    assert [c.notice_id for c in second] == ids[2:]
    assert store.claim_due("c", clock(), 60.0, 2) == []


def _intent_step(store: Store, notice_id: str, version: int, token: str | None) -> Any:
    decision = Decision(Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0, Reason.RETRY)
    return store.record_step(
        Step(
            notice_id=notice_id,
            version=version,
            lease_token=token,
            old_phase=Phase.QUEUED,
            decision=decision,
            release=False,
            facts=IntentFacts(f"{notice_id}:email:1", "email", "outbox", "v1", None, True),
            kind="intent",
            worker="w",
            now=T0,
        )
    )


def test_a_stale_writer_loses_the_compare_and_set_and_it_is_recorded(
    store: Store, clock: FakeClock
) -> None:
    """Two holders of one version: exactly one wins; the loser writes no intent, only an event."""
    (result,) = enqueue(store, make_settings(), [reset_request()], clock())
    (claim,) = store.claim_due("a", clock(), 60.0, 1)
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert _intent_step(store, result.notice_id, loaded.version, claim.lease_token).won
    lost = _intent_step(store, result.notice_id, loaded.version, claim.lease_token)
    assert not lost.won
    calls = store.conn.execute("SELECT calls FROM attempts").fetchall()
    assert calls == [(1,)]
    kinds = [e["kind"] for e in store.event_rows(result.notice_id)]
    assert kinds == ["intent", "lost_race"]


def test_a_worker_whose_lease_was_taken_over_cannot_write(store: Store, clock: FakeClock) -> None:
    """After another worker claims an expired lease, the first worker's token no longer writes."""
    (result,) = enqueue(store, make_settings(), [reset_request()], clock())
    (old,) = store.claim_due("a", clock(), 60.0, 1)
    clock.advance(61)
    (new,) = store.claim_due("b", clock(), 60.0, 1)
    assert new.recovered
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert not _intent_step(store, result.notice_id, loaded.version, old.lease_token).won
    assert _intent_step(store, result.notice_id, loaded.version, new.lease_token).won


def test_one_attempt_per_channel_is_enforced_by_the_database(
    store: Store, clock: FakeClock
) -> None:
    """A second attempt row for the same notice and channel is refused by a UNIQUE index."""
    (result,) = enqueue(store, make_settings(), [reset_request()], clock())
    (claim,) = store.claim_due("a", clock(), 60.0, 1)
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert _intent_step(store, result.notice_id, loaded.version, claim.lease_token).won
    with pytest.raises(INTEGRITY_ERRORS), store.transaction() as conn:
        conn.execute(
            "INSERT INTO attempts (attempt_key, notice_id, channel, transport, template_version,"
            " state, recoverable, started_at, last_call_at) VALUES"
            " ('other-key', ?, 'email', 'outbox', 'v1', 'intent', 1, 0, 0)",
            (result.notice_id,),
        )


def test_a_version_1_file_is_migrated_forward_without_loss(db_path: Path) -> None:
    """A database from schema version 1 moves to the current version, keeping its rows."""
    conn = sqlite3.connect(db_path)
    conn.executescript((Path(__file__).parent / "data" / "schema_v1.sql").read_text())
    conn.executescript(
        "INSERT INTO notices (id, idempotency_key, request_digest, region, policy_name,"
        " policy_version, channels, created_at, expires_at, phase, phase_since, due_at)"
        " VALUES ('n1', 'k1', 'd', 'default', 'default', 1, 'email', 0, 600, 'primary_pending',"
        " 0, 15);"
        "INSERT INTO attempts (attempt_key, notice_id, channel, transport, template_version,"
        " state, recoverable, started_at, last_call_at) VALUES ('n1:email:1', 'n1', 'email',"
        " 'outbox', 'v1', 'submitted', 1, 0, 0);"
        "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase, attempt_key)"
        " VALUES ('n1', 0, 'w', 'intent', 'queued', 'primary_pending', 'n1:email:1');"
        "PRAGMA user_version = 1;"
    )
    conn.close()
    with Store(db_path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.event_rows("n1")[0]["kind"] == "intent"
        (channel,) = store.conn.execute("SELECT channel FROM events").fetchone()
        assert channel == "email"
        assert store.conn.execute("SELECT COUNT(*) FROM daily_counts").fetchone() == (0,)
        assert store.load_notice("n1") is not None


def _schema(path: Path) -> dict[str, object]:
    """Every table's columns (name, type, not-null, default) and every index's columns."""
    from sqlite_utils import Database

    db = Database(path)
    try:
        return {
            table.name: (
                sorted((c.name, c.type, c.notnull, c.default_value) for c in table.columns),
                sorted((i.name, tuple(i.columns), i.unique) for i in table.indexes),
            )
            for table in db.tables
        }
    finally:
        db.close()


def test_a_migrated_file_has_exactly_the_schema_of_a_new_one(tmp_path: Path) -> None:
    """Migrations from version 1 arrive at schema.sql's tables, columns and indexes."""
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.executescript((Path(__file__).parent / "data" / "schema_v1.sql").read_text())
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with Store(old):
        pass
    with Store(tmp_path / "new.db"):
        pass

    assert _schema(old) == _schema(tmp_path / "new.db")
