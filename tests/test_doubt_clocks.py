"""Issue 20: a crash, a clock step or a deploy never sends a second message. Expiry and
lookup settle times are judged on one clock (the database's, on PostgreSQL) whatever a
host's own clock says, and an SMTP doubt that nothing can resolve escalates at once.

Time moves by database clock offsets, host clock skews and fake clocks, never by sleeping.
"""

from __future__ import annotations

import asyncio
import email
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pgcluster
import psycopg
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from conftest import FakeClock, make_settings, reset_request, run_sweep
from conftest import resetctl as cli
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER, FakeTwilio
from test_transport_smtp import ScriptedHandler, serve

from resetctl import api
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.store import Store, open_store
from resetctl.transports import build_transports, close_transports

HASH_KEY = "doubt-clocks-hash-key-0123456789abcdef"
TWILIO_ENV = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
PHONE = "+14155550123"
SMS_FIRST = '[policy.default]\nchannels = ["sms", "email"]\n'


@pytest.fixture
def pg_db(pg_admin: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A new PostgreSQL database (these tests are about the database's clock)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    uri = pgcluster.create_database(pg_admin, name)
    monkeypatch.setenv("RESETCTL_HASH_KEY", HASH_KEY)
    try:
        yield uri
    finally:
        pgcluster.drop_database(pg_admin, name)


def _database_clock_offset(uri: str, seconds: float) -> None:
    """Set the database's clock ``seconds`` ahead for every session opened from now on."""
    with psycopg.connect(uri, autocommit=True) as conn:
        (name,) = conn.execute("SELECT current_database()").fetchone() or ("",)
        conn.execute(f"ALTER DATABASE \"{name}\" SET resetctl.clock_offset = '{float(seconds)}'")


@dataclass
class MovingClock:
    """Real time plus an offset the test moves: the database's clock as the test sets it
    (the fake Twilio's clock follows it). Not ``time.time`` itself, so a sweep on it keeps
    no monotonic readings beside it."""

    offset: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class HostClock:
    """A host's clock: it moves as the database's does, ``skew`` seconds off it."""

    database: MovingClock
    skew: float

    def __call__(self) -> float:
        return self.database() + self.skew


# 1. Expiry is judged on the database's clock ------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("db_offset", "host_skew", "sent"),
    [
        pytest.param(0.0, "0", True, id="clocks-agree-sent"),
        pytest.param(105.0, "0", False, id="host-105s-slow-expired"),
        pytest.param(105.0, "60", False, id="host-45s-slow-expired"),
    ],
)
def test_a_slow_sweeper_sends_no_sms_for_a_link_dead_on_the_database_clock(
    pg_db: str, tmp_path: Path, db_offset: float, host_skew: str, sent: bool
) -> None:
    """A sweeper whose clock is slow sends no SMS for a link dead on the database's clock."""
    config = tmp_path / "resetctl.toml"
    config.write_text(SMS_FIRST, encoding="utf-8")
    with api.open(pg_db, config) as handle:
        (result,) = handle.enqueue([reset_request(phone=PHONE, ttl="100s")])
    _database_clock_offset(pg_db, db_offset)

    swept = cli(
        "sweep", "--json", "--config", str(config), db=pg_db, env={"RESETCTL_CLOCK_SKEW": host_skew}
    )
    assert swept.returncode == 0, swept.stderr

    shown = cli("inspect", result.notice_id, "--json", db=pg_db)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    with open_store(pg_db) as store:
        messages = store.outbox_messages(result.notice_id)
    if sent:
        assert [m["channel"] for m in messages] == ["sms"]
        assert report["phase"] == "accepted"
        assert [a["channel"] for a in report["attempts"]] == ["sms"]
    else:
        assert messages == []
        assert report["attempts"] == []
        assert (report["phase"], report["reason"]) == ("expired", "link_expired")


# 2. Lookup settle times are measured on the database's clock ----------------------------


def test_an_accurate_host_a_second_after_a_slow_hosts_lookup_sends_no_second_text(
    pg_db: str,
) -> None:
    """A 30 s slow host's lookup and an accurate host's a second later: one text, found."""
    database = MovingClock()  # the fake Twilio's clock too
    twilio = FakeTwilio(database)
    try:
        settings = make_settings(
            transport={"sms": "twilio"},
            twilio={"base_url": twilio.base_url, "from": SENDER},
            policy={"default": {"channels": ["sms", "email"]}},
        )
        environ = {**TWILIO_ENV, "RESETCTL_HASH_KEY": HASH_KEY}
        slow_host, accurate_host = HostClock(database, -30.0), HostClock(database, 0.0)

        def move_database(seconds: float) -> None:
            database.offset += seconds
            _database_clock_offset(pg_db, database.offset)

        def sweep(host: HostClock) -> dict[str, Any]:
            # A new handle is a new session: it sees the database clock as last moved.
            with api.open(pg_db, settings, clock=host, environ=environ) as handle:
                handle.sweep()
                return handle.inspect(notice_id)

        with api.open(pg_db, settings, clock=slow_host, environ=environ) as handle:
            (result,) = handle.enqueue([reset_request(phone=PHONE)])
        notice_id = result.notice_id
        twilio.outcomes = ["created-504"]  # created, then a 504: the reply is lost
        twilio.list_lag = 35.0  # Twilio lists it 35 s after it was created

        report = sweep(slow_host)  # the call, and a lookup at once (too soon to count)
        assert len(twilio.messages) == 1
        assert [a["state"] for a in report["attempts"]] == ["ambiguous"]

        move_database(30.0)
        report = sweep(slow_host)  # the first not-found that counts
        assert len(twilio.list_queries) == 2
        assert report["lease"] is None or not report["lease"]["active"]
        assert report["next_action"]["due_in_seconds"] > 25  # the settle time, not now

        move_database(1.0)
        report = sweep(accurate_host)  # a second after the first lookup
        assert len(twilio.requests) == 1  # no second create
        assert [a["state"] for a in report["attempts"]] == ["ambiguous"]

        move_database(30.0)
        report = sweep(accurate_host)  # the list has caught up: found
        assert len(twilio.requests) == 1
        assert [m["to"] for m in twilio.messages.values()] == [PHONE]
        (attempt,) = report["attempts"]
        assert (attempt["state"], attempt["calls"]) == ("submitted", 1)
        assert attempt["message_id"] == next(iter(twilio.messages))
        assert report["phase"] == "primary_pending"
    finally:
        twilio.close()
    assert twilio.violations == []


# 3. An SMTP doubt escalates at once -----------------------------------------------------


@dataclass
class TakesThenDrops(ScriptedHandler):
    """A relay that takes the whole message, then drops the connection before its reply."""

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert isinstance(envelope.original_content, bytes)
        parsed = email.message_from_bytes(envelope.original_content, policy=default_policy)
        assert isinstance(parsed, EmailMessage)
        self.received.append(parsed)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        assert server.transport is not None
        server.transport.close()
        # connection_lost cancels this handler: until then, say nothing.
        await asyncio.Event().wait()
        return "421 unreachable"


@pytest.fixture
def relay() -> Iterator[tuple[TakesThenDrops, int]]:
    handler = TakesThenDrops()
    with serve(handler) as port:
        yield handler, port


def _smtp_settings(port: int, on_poll_budget_spent: str) -> Settings:
    return make_settings(
        transport={"email": "smtp"},
        smtp={"host": "127.0.0.1", "port": port, "security": "none", "from": "no-reply@x.example"},
        outbox={"sms_status": "pending"},  # the SMS stays live, so later sweeps see the notice
        policy={
            "default": {"channels": ["email", "sms"], "on_poll_budget_spent": on_poll_budget_spent}
        },
    )


def _sweep(store: Store, settings: Settings, clock: FakeClock) -> None:
    transports = build_transports(settings, store, clock, {})
    try:
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)


def test_an_smtp_doubt_escalates_to_the_sms_at_once_and_never_resends_the_email(
    store: Store, clock: FakeClock, relay: tuple[TakesThenDrops, int]
) -> None:
    """A connection dropped after DATA: the SMS goes out in that sweep, the email never again."""
    handler, port = relay
    settings = _smtp_settings(port, "escalate")
    (result,) = enqueue(store, settings, [reset_request()], clock())

    _sweep(store, settings, clock)

    assert len(handler.received) == 1
    assert [m["channel"] for m in store.outbox_messages(result.notice_id)] == ["sms"]
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase == "fallback_pending"
    states = {a["channel"]: a["state"] for a in store.attempt_rows(result.notice_id)}
    assert states == {"email": "ambiguous", "sms": "submitted"}

    phases: list[str] = []
    for step in (15, 30, 61, 60):  # past the email's 105 s poll budget, and on
        clock.advance(step)
        _sweep(store, settings, clock)
        assert len(handler.received) == 1
        assert len(store.outbox_messages(result.notice_id)) == 1
        later = store.load_notice(result.notice_id)
        assert later is not None
        phases.append(later.state.phase)
    assert phases[:2] == ["fallback_pending", "fallback_pending"]  # swept while still live
    (email_attempt,) = [a for a in store.attempt_rows(result.notice_id) if a["channel"] == "email"]
    assert (email_attempt["state"], email_attempt["calls"]) == ("ambiguous", 1)


def test_an_smtp_doubt_under_an_expire_policy_expires_at_once(
    store: Store, clock: FakeClock, relay: tuple[TakesThenDrops, int]
) -> None:
    """With on_poll_budget_spent = "expire", an SMTP doubt expires the notice in that sweep."""
    handler, port = relay
    settings = _smtp_settings(port, "expire")
    (result,) = enqueue(store, settings, [reset_request()], clock())

    _sweep(store, settings, clock)

    assert len(handler.received) == 1
    assert store.outbox_messages(result.notice_id) == []
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert (loaded.state.phase, loaded.reason) == ("expired", "budget_spent_expire")
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["channel"], attempt["state"], attempt["calls"]) == ("email", "ambiguous", 1)

    clock.advance(120)
    _sweep(store, settings, clock)
    assert len(handler.received) == 1
