"""The store: schema and migration, the claim's plan, compare-and-set, uniqueness."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import time_machine
from conftest import INTEGRITY_ERRORS, T0, FakeClock, make_settings, reset_request

from resetctl.enqueue import enqueue
from resetctl.errors import StoreError
from resetctl.machine import ActionKind, Decision, Phase, Reason
from resetctl.schema_facts import SCHEMA_VERSION
from resetctl.store import (
    IntentFacts,
    Step,
    Store,
    new_notice_id,
    outbox_message_id,
)


def test_new_file_gets_the_schema_in_wal_mode(db_path: Path) -> None:
    """Opening a new file creates schema.sql's tables, in WAL mode, at the current version."""
    with Store(db_path) as store:
        tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master")}
        assert {"notices", "notice_secrets", "attempts", "observations", "events"} <= tables
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with Store(db_path) as again:  # reopening migrates nothing and loses nothing
        assert again.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_threads_opening_a_new_file_at_once_all_get_it(tmp_path: Path) -> None:
    """Eight threads open the same new file at the same moment, forty times over (an
    application's threads, or cron's sweep beside the first enqueue): SQLite answers
    all but one "database is locked" to the switch into WAL mode at once, without
    waiting; each tries again, and every one opens it."""
    for round_ in range(40):
        path = tmp_path / f"new{round_}.db"
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def open_it(
            path: Path = path,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            start.wait(timeout=30)
            try:
                with Store(path) as store:
                    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []


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
        # Both parts of the claim walk a partial index over live notices; the only sort
        # is of their candidates (at most twice the batch), by expiry.
        assert "USING INDEX notices_due" in plan
        assert "USING INDEX notices_queued_expiry" in plan
        scans = [part for part in plan.split(" | ") if part.startswith("SCAN notices")]
        assert all("USING INDEX notices_queued_expiry" in part for part in scans)
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
        "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
        " submitted_at, updated_at, content) VALUES ('obx_1', 'n1:email:1', 'n1', 'email',"
        " 'pending', 0, 0, '{\"subject\": \"Reset\"}');"
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
        # The outbox was rebuilt (version 4) with its messages and their statuses.
        assert store.outbox_status("obx_1") == "pending"
        message = store.outbox_message("obx_1")
        assert message is not None
        assert message["subject"] == "Reset"
        assert store.outbox_messages("n1")[0]["attempt_key"] == "n1:email:1"


def _schema(path: Path) -> dict[str, object]:
    """Every table's columns (name, type, not-null, default), every index's columns, and
    whether the table is WITHOUT ROWID (its storage)."""
    from sqlite_utils import Database

    db = Database(path)
    try:
        return {
            table.name: (
                sorted((c.name, c.type, c.notnull, c.default_value) for c in table.columns),
                sorted((i.name, tuple(i.columns), i.unique) for i in table.indexes),
                "WITHOUT ROWID" in table.schema.upper(),
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


def test_a_takeover_is_counted_on_the_row_and_names_the_previous_holder(
    store: Store, clock: FakeClock
) -> None:
    """A claim of an unreleased lease records who held it; a first claim records nothing."""
    (result,) = enqueue(store, make_settings(), [reset_request()], clock())
    row = "SELECT lease_owner, lease_recoveries, taken_over_from FROM notices WHERE id = ?"
    (first,) = store.claim_due("a", clock(), 60.0, 1)
    assert not first.recovered
    assert tuple(store.conn.execute(row, (result.notice_id,)).fetchone()) == ("a", 0, None)
    clock.advance(61)
    (second,) = store.claim_due("b", clock(), 60.0, 1)
    assert second.recovered
    assert tuple(store.conn.execute(row, (result.notice_id,)).fetchone()) == ("b", 1, "a")


def test_a_claim_makes_every_view_loaded_before_it_stale(store: Store, clock: FakeClock) -> None:
    """A lease-less writer holding a pre-claim version cannot release the new holder's lease."""
    (result,) = enqueue(store, make_settings(), [reset_request()], clock())
    before = store.load_notice(result.notice_id)
    assert before is not None
    (claim,) = store.claim_due("a", clock(), 60.0, 1)
    tick = Decision(Phase.QUEUED, ActionKind.SUBMIT, "email", T0 + 30, Reason.FIRST_SUBMISSION)
    step = Step(
        notice_id=result.notice_id,
        version=before.version,
        lease_token=None,
        old_phase=Phase.QUEUED,
        decision=tick,
        release=True,
        facts=None,
        kind="tick",
        worker="stale",
        now=T0,
    )
    assert not store.record_step(step).won
    after = store.load_notice(result.notice_id)
    assert after is not None
    assert (after.lease_token, after.lease_owner) == (claim.lease_token, "a")


def test_phase_since_is_when_the_phase_was_entered_not_the_latest_write(
    store: Store, clock: FakeClock
) -> None:
    """Writes that keep the phase (a poll, a retry) leave phase_since, which inspect ages."""
    (result,) = enqueue(store, make_settings(), [reset_request()], clock())
    (claim,) = store.claim_due("a", clock(), 60.0, 1)
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert _intent_step(store, result.notice_id, loaded.version, claim.lease_token).won
    moved = store.load_notice(result.notice_id)
    assert moved is not None
    assert (moved.state.phase, moved.phase_since) == (Phase.PRIMARY_PENDING, T0)
    poll = Decision(Phase.PRIMARY_PENDING, ActionKind.POLL, "email", T0 + 45, Reason.POLL_SCHEDULED)
    step = Step(
        notice_id=result.notice_id,
        version=moved.version,
        lease_token=claim.lease_token,
        old_phase=Phase.PRIMARY_PENDING,
        decision=poll,
        release=True,
        facts=None,
        kind="tick",
        worker="a",
        now=T0 + 15,
    )
    assert store.record_step(step).won
    kept = store.load_notice(result.notice_id)
    assert kept is not None
    assert (kept.due_at, kept.phase_since) == (T0 + 45, T0)


def test_claim_notices_leases_the_chosen_notices_to_the_worker(
    store: Store, clock: FakeClock
) -> None:
    """enqueue --send's claim names its worker on the lease, like the sweep's claim."""
    ids = [r.notice_id for r in enqueue(store, make_settings(), [reset_request()], clock())]
    (claim,) = store.claim_notices("sender", ids, clock(), 60.0)
    loaded = store.load_notice(ids[0])
    assert loaded is not None
    assert (loaded.lease_owner, loaded.lease_token, loaded.due_at) == (
        "sender",
        claim.lease_token,
        clock() + 60.0,
    )


def test_the_before_commit_hook_sees_each_kind_of_a_round_once(
    store: Store, clock: FakeClock
) -> None:
    """The pre-commit hook (fault injection's seam) is called once per step kind, in order."""
    settings = make_settings()
    ids = [r.notice_id for r in enqueue(store, settings, [reset_request(), reset_request()], T0)]
    claims = store.claim_due("a", clock(), 60.0, 2)
    seen: list[str] = []
    store.call_before_commit(seen.append)
    steps = []
    for claim, kind in zip(claims, ("intent", "tick"), strict=True):
        loaded = store.load_notice(claim.notice_id)
        assert loaded is not None
        decision = Decision(Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0, Reason.RETRY)
        step = Step(
            notice_id=claim.notice_id,
            version=loaded.version,
            lease_token=claim.lease_token,
            old_phase=Phase.QUEUED,
            decision=decision,
            release=False,
            facts=None,
            kind=kind,
            worker="a",
            now=T0,
        )
        steps += [step, replace(step, kind="intent")]
    with store.transaction():
        store.write_steps(steps)
    assert sorted(c.notice_id for c in claims) == sorted(ids)
    assert seen == ["intent", "tick"]


def test_notice_ids_sort_by_creation_time_and_never_repeat() -> None:
    """Ids made milliseconds apart sort in that order (so a batch's rows share pages);
    ids made within one millisecond still differ."""
    with time_machine.travel(T0, tick=False):
        same_moment = [new_notice_id() for _ in range(1000)]
    with time_machine.travel(T0 + 0.002, tick=False):  # (0.001 rounds down in a float)
        later = new_notice_id()
    assert len(set(same_moment)) == 1000
    assert all(len(i) == 28 and i.startswith("ntc_") for i in [*same_moment, later])
    assert all(int(i[4:], 16) >= 0 for i in same_moment)  # hex digits only
    assert max(same_moment) < later
    assert {i[4:15] for i in same_moment} == {f"{int(T0 * 1000):011x}"}


def test_outbox_message_ids_sort_with_their_notices_and_old_ones_keep_their_form() -> None:
    """A message id begins with its notice id's time digits; a notice made before
    version 4 keeps the message id it always had, so a resubmission across the upgrade
    is the same message."""
    with time_machine.travel(T0, tick=False):
        first = new_notice_id()
    with time_machine.travel(T0 + 1, tick=False):
        second = new_notice_id()
    ids = [outbox_message_id(f"{n}:email:1") for n in (first, second)]
    assert ids[0] < ids[1]
    assert ids[0].startswith("obx_" + first[4:15])
    assert outbox_message_id(f"{first}:sms:1") != ids[0]
    old_key = "ntc_3f2a9c0d1e4b5a67:email:1"
    assert outbox_message_id(old_key) == "obx_" + hashlib.sha256(old_key.encode()).hexdigest()[:16]
