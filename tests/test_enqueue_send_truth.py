"""`enqueue --send` tells the truth: once notices are committed, each gets its line (exit
0) saying whether its first submission was made and recorded, else why, and its phase;
what can stop the submission fails before the commit (exit 2, nothing written).

Built the way it broke: Twilio on loopback (providers_twilio.py) creates the SMS, and a
second connection takes the database's write lock as it does, so the first outcome
cannot be recorded; a sweep afterwards finds that SMS by lookup instead of sending
another. Twilio's create call carries the attempt key in its status callback URL, so
calls are counted per attempt key where the provider sees them.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, later, make_settings, reset_request, resetctl, run_sweep
from providers_http import closed_port_url
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, CALLBACK_URL, SENDER, FakeTwilio
from typer.testing import CliRunner, Result

import resetctl as api
from resetctl.cli import app
from resetctl.config import Settings, load_settings
from resetctl.enqueue import SendReason
from resetctl.machine import Phase, attempt_key
from resetctl.store import Store, is_postgres
from resetctl.transports import build_transports, close_transports
from resetctl.transports.twilio import attempt_from_callback_url

ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
#: The keys every `enqueue --send` line has.
SEND_LINE_KEYS = {
    "notice_id",
    "idempotency_key",
    "created",
    "submitted",
    "reason",
    "phase",
}


class LockingTwilio(FakeTwilio):
    """Twilio whose next create, once armed, has another connection take the
    database's write lock (a busy writer) before it replies, and hold it until
    released: the SMS exists, and its outcome cannot be recorded."""

    def __init__(self, db: str) -> None:
        super().__init__()
        self.db = db
        self.armed = False
        self.release: Callable[[], None] | None = None

    def _create(self, form: dict[str, Any], created: float) -> dict[str, Any]:
        resource = super()._create(form, created)
        if self.armed:
            self.armed = False
            self.release = _take_write_lock(self.db)
        return resource


def _take_write_lock(db: str) -> Callable[[], None]:
    """Another connection takes the database's write lock; returns what releases it."""
    if is_postgres(db):
        import psycopg

        held = psycopg.connect(db)  # not autocommit: the lock lasts until the rollback
        held.execute("LOCK TABLE notices IN EXCLUSIVE MODE")  # reads go on, writes wait

        def release_postgres() -> None:
            held.rollback()
            held.close()

        return release_postgres
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")  # WAL: readers go on, writers wait

    def release_sqlite() -> None:
        blocker.execute("ROLLBACK")
        blocker.close()

    return release_sqlite


def _calls_per_key(twilio: FakeTwilio) -> Counter[str | None]:
    """Create calls per attempt key, as Twilio received them."""
    return Counter(attempt_from_callback_url(form["StatusCallback"]) for form in twilio.requests)


def _config(tmp_path: Path, base_url: str, concurrency: int = 16) -> Path:
    """An SMS-only config on Twilio (its status callbacks carry the attempt key)."""
    path = tmp_path / "resetctl.toml"
    path.write_text(
        '[transport]\nsms = "twilio"\n'
        f'[twilio]\nbase_url = "{base_url}"\nfrom = "{SENDER}"\n'
        f'status_callback = "{CALLBACK_URL}"\n'
        '[policy.default]\nchannels = ["sms"]\n'
        f"[sweep]\nconcurrency = {concurrency}\n",
        encoding="utf-8",
    )
    return path


def _settings(twilio: FakeTwilio, **policy: Any) -> Settings:
    return make_settings(
        transport={"sms": "twilio"},
        twilio={"base_url": twilio.base_url, "from": SENDER, "status_callback": CALLBACK_URL},
        policy={"default": {"channels": ["sms"], **policy}},
    )


def _environ() -> dict[str, str]:
    """The API's environment: this process's (a PostgreSQL test's hash key), with Twilio's
    credentials."""
    return {**os.environ, **ENVIRON}


def _lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def _notice_count(db: str | Path) -> int:
    with Store(db) as store:
        (count,) = store.conn.execute("SELECT count(*) FROM notices").fetchone()
    return int(count)


# -- the database is locked while the first outcome is recorded ----------------------


def _recover(db: str, config: str, runner: CliRunner) -> int:
    """A sweep after the enqueue's lease (60 s) has lapsed; the messages it submitted.

    SQLite reads leases on the host's clock: `resetctl sweep` with its clock skewed.
    PostgreSQL reads them on its own, which only a session can move: an in-process sweep.
    """
    if not is_postgres(db):
        swept = runner.invoke(
            app,
            ["sweep", "--db", db, "--config", config, "--json"],
            env={**ENVIRON, "RESETCTL_CLOCK_SKEW": "120"},
        )
        assert swept.exit_code == 0, swept.output
        return int(json.loads(swept.stdout)["submitted"])
    settings = load_settings(Path(config))
    with Store(db) as store:
        clock = later(store, 120)
        transports = build_transports(settings, store, clock, _environ())
        try:
            return run_sweep(store, settings, clock, transports).submitted
        finally:
            close_transports(transports)


@pytest.mark.parametrize("concurrency", [1, 16])
def test_a_locked_database_after_the_call_still_reports_every_committed_notice(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    """The SMS went out but its outcome could not be recorded (SQLite busy past
    busy_timeout, PostgreSQL past lock_timeout): exit 0, one line per notice (in_doubt
    for a call made, store_error for those never called), and the sweep that follows
    finds what was sent by lookup: one create per attempt key. One at a time, the run
    stops after the first call; concurrently, every call already made is in doubt."""
    monkeypatch.setattr("resetctl.store.store.BUSY_TIMEOUT_SECONDS", 0.01)
    monkeypatch.setattr("resetctl.store.postgres.connection.LOCK_TIMEOUT_MS", 50)
    twilio = LockingTwilio(db)
    try:
        config = str(_config(tmp_path, twilio.base_url, concurrency))
        requests = [reset_request() for _ in range(3)]
        twilio.armed = True
        runner = CliRunner()
        try:
            enqueued = runner.invoke(
                app,
                ["enqueue", "--send", "--db", db, "--config", config],
                input="".join(json.dumps(r) + "\n" for r in requests),
                env=ENVIRON,
            )
        finally:
            release = twilio.release
            if release is not None:
                release()  # after the command gave up
        assert release is not None  # the lock was taken inside the call

        assert enqueued.exit_code == 0, enqueued.output
        lines = _lines(enqueued)
        assert [line["idempotency_key"] for line in lines] == [
            r["idempotency_key"] for r in requests
        ]
        assert all(set(line) == SEND_LINE_KEYS for line in lines)
        assert all(line["created"] for line in lines)
        if concurrency == 1:
            assert not any(line["submitted"] for line in lines)
        # Concurrent calls may have had their outcome recorded before the lock: those
        # say so; none says anything but the truth.
        assert {line["reason"] for line in lines if not line["submitted"]} <= {
            "in_doubt",
            "store_error",
        }
        assert "the notices are committed" in enqueued.stderr
        assert _notice_count(db) == 3
        doubted = [line for line in lines if line["reason"] == "in_doubt"]
        assert all(line["phase"] == "primary_pending" for line in doubted)
        called = [line for line in lines if line["submitted"] or line["reason"] == "in_doubt"]
        assert {attempt_key(line["notice_id"], "sms") for line in called} == set(
            _calls_per_key(twilio)
        )  # in doubt exactly where a call was made and its outcome not recorded
        assert set(_calls_per_key(twilio).values()) == {1}
        if concurrency == 1:
            # The first one called (claims go in due order, not input order) is in doubt;
            # the run stopped before the others' calls.
            (first,) = doubted
            rest = [line for line in lines if line is not first]
            assert [(line["reason"], line["phase"]) for line in rest] == [
                ("store_error", "queued")
            ] * 2
            (sid,) = twilio.messages
            with Store(db) as store:
                ids = [line["notice_id"] for line in lines]
                assert store.load_notices(ids).keys() == set(ids)  # each line names its notice
                (attempt,) = store.attempt_rows(first["notice_id"])
                assert (attempt["state"], attempt["message_id"]) == ("intent", None)
        else:
            first, sid = doubted[0], None

        recorded = sum(1 for line in lines if line["submitted"])
        assert _recover(db, config, runner) == 3 - len(doubted) - recorded

        assert _calls_per_key(twilio) == {
            attempt_key(line["notice_id"], "sms"): 1 for line in lines
        }
        assert len(twilio.messages) == 3  # one text each: the one in doubt was found
        with Store(db) as store:
            (attempt,) = store.attempt_rows(first["notice_id"])
            assert (attempt["state"], attempt["calls"]) == ("submitted", 1)
            assert attempt["message_id"] == sid if sid else attempt["message_id"] in twilio.messages
        assert twilio.violations == []
    finally:
        twilio.close()


# -- what can stop the submission fails before the commit ----------------------------


def test_a_missing_twilio_token_exits_2_and_writes_nothing(db: str, tmp_path: Path) -> None:
    """No TWILIO_AUTH_TOKEN: exit 2 naming it, no line, no notice; once it is set, the
    same key is a new notice (the first try wrote nothing)."""
    config = str(_config(tmp_path, closed_port_url()))
    request = json.dumps(reset_request()) + "\n"
    missing = {**ENVIRON, "TWILIO_AUTH_TOKEN": ""}

    failed = resetctl("enqueue", "--send", "--config", config, db=db, input=request, env=missing)

    assert failed.returncode == 2, failed.stderr
    assert failed.stdout == ""
    assert "TWILIO_AUTH_TOKEN is not set" in failed.stderr
    assert "nothing was written" in failed.stderr
    assert _notice_count(db) == 0
    again = resetctl("enqueue", "--config", config, db=db, input=request, env=ENVIRON)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["created"] is True


def test_a_lease_too_short_for_one_call_raises_before_the_commit(
    db: str, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """A lease that cannot cover Twilio's time-outs: ConfigError from the API, nothing
    written, nothing called."""
    settings = _settings(twilio, lease="5s")
    with (
        api.open(db, settings, clock=clock, environ=_environ()) as handle,
        pytest.raises(api.ConfigError, match="lease: 5s cannot cover one sms call"),
    ):
        handle.enqueue([reset_request()], send=True)
    assert _notice_count(db) == 0
    assert twilio.requests == []


# -- each reason, from the Python API (the CLI prints the same facts) ----------------


@pytest.mark.parametrize(
    ("outcome", "reason", "phase"),
    [
        ("throttle", SendReason.THROTTLED, Phase.PRIMARY_PENDING),
        ("error", SendReason.AMBIGUOUS, Phase.PRIMARY_PENDING),
        ("reject", SendReason.PERMANENT, Phase.FAILED),
    ],
)
def test_a_failed_call_reports_the_transport_error_kind(
    db: str,
    clock: FakeClock,
    twilio: FakeTwilio,
    outcome: str,
    reason: SendReason,
    phase: Phase,
) -> None:
    """429 → transient, 500 → ambiguous, 400 → permanent: committed, not submitted, the
    notice's phase as recorded."""
    twilio.outcomes = [outcome]
    with api.open(db, _settings(twilio), clock=clock, environ=_environ()) as handle:
        [result] = handle.enqueue([reset_request()], send=True)
        assert (result.created, result.submitted, result.reason, result.phase) == (
            True,
            False,
            reason,
            phase,
        )
        assert handle.inspect(result.notice_id)["phase"] == phase
    assert result.to_json()["reason"] == reason.value
    assert len(twilio.requests) == 1


def test_a_link_too_short_lived_to_send_is_expired_not_sent(
    db: str, clock: FakeClock, twilio: FakeTwilio
) -> None:
    """A ttl under the send reserve (30 s): reason expired, phase expired, no call."""
    with api.open(db, _settings(twilio), clock=clock, environ=_environ()) as handle:
        [result] = handle.enqueue([reset_request(ttl="20s")], send=True)
    assert (result.created, result.submitted, result.reason, result.phase) == (
        True,
        False,
        SendReason.EXPIRED,
        Phase.EXPIRED,
    )
    assert twilio.requests == []


def test_a_key_whose_notice_is_terminal_is_already_terminal(db: str, clock: FakeClock) -> None:
    """Sending a key again once its notice was accepted: the existing id, not created,
    already_terminal, phase accepted; the outbox holds one message."""
    request = reset_request()
    with api.open(db, make_settings(), clock=clock) as handle:
        [first] = handle.enqueue([request], send=True)
        [again] = handle.enqueue([request], send=True)
    assert (first.submitted, first.reason, first.phase) == (True, None, Phase.ACCEPTED)
    assert (again.notice_id, again.created, again.submitted) == (first.notice_id, False, False)
    assert (again.reason, again.phase) == (SendReason.ALREADY_TERMINAL, Phase.ACCEPTED)
    assert again.to_json() == {
        "notice_id": first.notice_id,
        "idempotency_key": request["idempotency_key"],
        "created": False,
        "submitted": False,
        "reason": "already_terminal",
        "phase": "accepted",
    }
    with Store(db) as store:
        assert len(store.outbox_messages(first.notice_id)) == 1


def test_a_key_whose_notice_is_already_submitted_is_in_progress(db: str, clock: FakeClock) -> None:
    """Sending a key again while its email awaits its first poll: in_progress, and no
    second message."""
    request = reset_request()
    settings = make_settings(outbox={"email_status": "pending"})
    with api.open(db, settings, clock=clock) as handle:
        [first] = handle.enqueue([request], send=True)
        [again] = handle.enqueue([request], send=True)
    assert (first.submitted, first.phase) == (True, Phase.PRIMARY_PENDING)
    assert (again.notice_id, again.created, again.submitted) == (first.notice_id, False, False)
    assert (again.reason, again.phase) == (SendReason.IN_PROGRESS, Phase.PRIMARY_PENDING)
    with Store(db) as store:
        assert len(store.outbox_messages(first.notice_id)) == 1
