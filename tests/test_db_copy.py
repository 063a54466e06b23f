"""`resetctl db copy`: a populated SQLite file into an empty PostgreSQL database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, resetctl, run_sweep

from resetctl.controls import cancel
from resetctl.enqueue import enqueue
from resetctl.errors import StoreError
from resetctl.machine import Phase, Reason
from resetctl.store import Store, copy_database

DAY = 86400.0


def _sorted(rows: list[dict[str, object]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def _populate(path: Path) -> dict[str, str]:
    """A file with a notice in every phase (one of them leased), purged history folded
    into daily_counts, outbox messages and two policies. Returns a notice id per phase."""
    ids: dict[str, str] = {}
    with Store(path) as store:
        old = FakeClock(T0 - 40 * DAY)
        enqueue(store, make_settings(), [reset_request()], old())
        run_sweep(store, make_settings(), old)
        assert store.purge_batch(T0 - 30 * DAY, 100) == 1

        def one(label: str, settings_kw: dict[str, object], at: float, **fields: object) -> None:
            settings = make_settings(**settings_kw)
            (result,) = enqueue(store, settings, [reset_request(**fields)], at)
            ids[label] = result.notice_id
            run_sweep(store, settings, FakeClock(at))

        one("accepted", {}, T0)
        one("primary_pending", {"outbox": {"email_status": "pending"}}, T0)
        fallback = {"outbox": {"email_status": "failed", "sms_status": "pending"}}
        one("fallback_pending", fallback, T0)
        one("failed", {"outbox": {"email_status": "failed", "sms_status": "failed"}}, T0)
        (expiring,) = enqueue(store, make_settings(), [reset_request(ttl="2m")], T0 - 300)
        ids["expired"] = expiring.notice_id
        run_sweep(store, make_settings(), FakeClock(T0))
        (queued,) = enqueue(store, make_settings(), [reset_request()], T0 + 1)
        ids["queued"] = queued.notice_id
        (withdrawn,) = enqueue(store, make_settings(), [reset_request()], T0 + 1)
        ids["cancelled"] = withdrawn.notice_id
        cancel(store, [withdrawn.notice_id], Reason.WITHDRAWN, T0 + 1)
        # An abuse limit's count and a refusal: a move to PostgreSQL keeps both (a limit
        # that restarted from zero would let a bot through right after it).
        limited = make_settings(policy={"eu": {"version": 1, "limits": {"per_recipient": 1}}})
        twice = [reset_request(region="eu", email="ada@example.com") for _ in range(2)]
        assert [r.refused for r in enqueue(store, limited, twice, T0)][1] is not None
        (leased,) = enqueue(store, make_settings(), [reset_request()], T0 + 1)
        ids["leased"] = leased.notice_id
        claims = store.claim_notices("gone-worker", [leased.notice_id], T0 + 1, 60.0)
        assert [c.notice_id for c in claims] == [leased.notice_id]
        phases = store.phase_counts()
    assert set(phases) == {p.value for p in Phase}, phases
    return ids


def test_db_copy_moves_every_phase_and_verifies_counts(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every table arrives whole; live notices lose their leases and stay live; terminal
    ones read the same; a sweep on the copy carries on; ids continue after the copy."""
    source = tmp_path / "old.db"
    monkeypatch.delenv("RESETCTL_HASH_KEY")  # the SQLite file's default key (the user's)
    ids = _populate(source)
    done = resetctl("db", "copy", "--to", db, "--json", db=source)
    assert done.returncode == 0, done.stderr
    copied = json.loads(done.stdout)["copied"]
    with Store(source, must_exist=True) as old, Store(db) as new:
        assert copied == {**old.row_counts(), **copied}
        assert new.row_counts() == old.row_counts()
        assert new.phase_counts() == old.phase_counts()
        assert new.salt() == old.salt()
        assert new.known_policies() == old.known_policies()
        assert _sorted(new.event_counts(0)) == _sorted(old.event_counts(0))
        assert new.outbox_messages() == old.outbox_messages()
        assert new.refusal_counts(0) == old.refusal_counts(0) != []
        limits = "SELECT rule, policy, subject, counts, last_at FROM limit_counts"
        assert new.conn.execute(limits).fetchall() == old.conn.execute(limits).fetchall() != []
        for label, notice_id in ids.items():
            before, after = old.load_notice(notice_id), new.load_notice(notice_id)
            assert before is not None
            assert after is not None
            assert after.state == before.state, label
            assert after.lease_owner is None
            assert after.lease_token is None
            assert new.event_rows(notice_id) == old.event_rows(notice_id)
            assert new.attempt_rows(notice_id) == old.attempt_rows(notice_id)
        leased = new.load_notice(ids["leased"])
        assert leased is not None
        assert leased.due_at is not None
        assert leased.due_at <= T0 + 61
        # The copy carries on: the leased and queued notices are sent, ids continue.
        summary = run_sweep(new, make_settings(), FakeClock(T0 + 62), worker="after-copy")
        assert summary.claimed >= 2
        for label in ("leased", "queued"):
            moved = new.load_notice(ids[label])
            assert moved is not None
            assert moved.state.phase is Phase.ACCEPTED, label


def test_db_copy_refuses_a_target_that_holds_anything(db: str, tmp_path: Path) -> None:
    """A target with notices is refused and left as it was."""
    source = tmp_path / "old.db"
    with Store(source) as old:
        enqueue(old, make_settings(), [reset_request()], T0)
    with Store(db) as target:
        enqueue(target, make_settings(), [reset_request(), reset_request()], T0)
    with Store(source, must_exist=True) as old, pytest.raises(StoreError, match="not empty"):
        copy_database(old, db, T0)
    with Store(db) as target:
        assert target.row_counts()["notices"] == 2
    done = resetctl("db", "copy", "--to", db, db=source)
    assert done.returncode != 0
    assert "not empty" in done.stderr
