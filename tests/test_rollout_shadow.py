"""Shadow mode (issue 26, item 5): a notice enqueued under ``[rollout] mode = "shadow"``
runs claims, decisions, region policy and rendering but reaches no provider (Twilio,
Postmark and an SMTP relay on loopback count every request; the outbox counts its
messages), ends ``cancelled`` (``shadow``) with no attempt, and health counts its
would-send. The mode is the notice's, fixed at enqueue: a switch either way leaves the
notices already enqueued as they were. Both backends."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from conftest import (
    FakeClock,
    database_follows,
    make_settings,
    reset_request,
    resetctl,
    run_sweep,
)
from providers_http import ProviderHandler
from providers_postmark import SENDER as POSTMARK_SENDER
from providers_postmark import TOKEN as POSTMARK_TOKEN
from providers_postmark import FakePostmark
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, FakeTwilio
from providers_twilio import SENDER as TWILIO_SENDER
from test_transport_smtp import ScriptedHandler, serve

from resetctl.config import Settings
from resetctl.enqueue import EnqueueResult, SendReason, enqueue
from resetctl.machine import Phase
from resetctl.ops import health, metric_families, purge
from resetctl.replay.traces import export_timings
from resetctl.report import notice_report
from resetctl.store import Store
from resetctl.telemetry import LOGGER
from resetctl.transports import Transport, build_transports, close_transports

ENVIRON = {
    "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
    "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
    "POSTMARK_SERVER_TOKEN": POSTMARK_TOKEN,
}
SHADOW = {"mode": "shadow"}
#: default sends email first; us texts first.
POLICIES: dict[str, Any] = {
    "default": {"channels": ["email", "sms"]},
    "us": {"channels": ["sms", "email"]},
}


class CountedTwilio(FakeTwilio):
    """Twilio on loopback that counts every request it is sent, of any kind."""

    calls = 0

    def handle_post(self, handler: ProviderHandler) -> None:
        self.calls += 1
        super().handle_post(handler)

    def handle_get(self, handler: ProviderHandler) -> None:
        self.calls += 1
        super().handle_get(handler)


class CountedPostmark(FakePostmark):
    """Postmark on loopback that counts every request it is sent, of any kind."""

    calls = 0

    def handle_post(self, handler: ProviderHandler) -> None:
        self.calls += 1
        super().handle_post(handler)

    def handle_get(self, handler: ProviderHandler) -> None:
        self.calls += 1
        super().handle_get(handler)


@dataclass
class CountedRelay(ScriptedHandler):
    """An SMTP relay that counts the sessions that greet it (smtplib's EHLO)."""

    greetings: int = 0

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        self.greetings += 1
        return await super().handle_EHLO(server, session, envelope, hostname, responses)


@pytest.fixture
def clock() -> FakeClock:
    # Real time, moved by hand: on PostgreSQL the database's clock decides.
    return FakeClock(time.time())


@pytest.fixture
def twilio(clock: FakeClock) -> Iterator[CountedTwilio]:
    server = CountedTwilio(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.fixture
def postmark(clock: FakeClock) -> Iterator[CountedPostmark]:
    server = CountedPostmark(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.problems == []


def providers(twilio: CountedTwilio, postmark: CountedPostmark, **rollout: Any) -> Settings:
    """Postmark for email, Twilio for SMS, on loopback; ``rollout`` as [rollout]."""
    return make_settings(
        transport={"email": "postmark", "sms": "twilio"},
        postmark={"base_url": postmark.base_url, "from": POSTMARK_SENDER},
        twilio={"base_url": twilio.base_url, "from": TWILIO_SENDER},
        policy=POLICIES,
        **({"rollout": rollout} if rollout else {}),
    )


def sweep(store: Store, settings: Settings, clock: FakeClock, rounds: int = 4) -> None:
    """Sweeps a few poll slots apart, with the configured transports."""
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        for _ in range(rounds):
            database_follows(store, clock)
            run_sweep(store, settings, clock, transports)
            clock.advance(30)
    finally:
        close_transports(transports)


def send(
    store: Store, settings: Settings, clock: FakeClock, requests: list[dict[str, Any]]
) -> list[EnqueueResult]:
    """``enqueue --send`` with the configured transports."""
    transports: dict[str, Transport] = build_transports(settings, store, clock, ENVIRON)
    database_follows(store, clock)
    try:
        return enqueue(
            store, settings, requests, clock(), send=True, transports=transports, clock=clock
        )
    finally:
        close_transports(transports)


def phase_and_reason(store: Store, notice_id: str | None) -> tuple[Phase, str | None]:
    assert notice_id is not None
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    return loaded.state.phase, loaded.reason


def test_shadow_makes_no_provider_call_and_health_counts_the_would_sends(
    store: Store, clock: FakeClock, twilio: CountedTwilio, postmark: CountedPostmark
) -> None:
    """Shadow notices sent at enqueue and swept after: Twilio and Postmark see no request,
    each notice ends cancelled (shadow) with no attempt and no secret left, and health
    counts a would-send per policy and first channel. The same config live calls both."""
    settings = providers(twilio, postmark, **SHADOW)
    requests = [reset_request() for _ in range(3)] + [reset_request(region="us") for _ in range(2)]
    results = send(store, settings, clock, requests)
    sweep(store, settings, clock)
    assert (twilio.calls, postmark.calls) == (0, 0)
    for result in results:
        assert result.to_json() == {
            "notice_id": result.notice_id,
            "idempotency_key": result.idempotency_key,
            "created": True,
            "shadow": True,
            "submitted": False,
            "reason": "shadow",
            "phase": "cancelled",
        }
        assert result.reason is SendReason.SHADOW
        assert phase_and_reason(store, result.notice_id) == (Phase.CANCELLED, "shadow")
        assert result.notice_id is not None
        assert store.attempt_rows(result.notice_id) == []
        assert store.load_contact(result.notice_id) is None
    figures = health(store, clock(), 3600)
    assert figures["rollout"] == {
        "would_send": {"default": {"email": 3}, "us": {"sms": 2}},
        "out_of_slice": {},
    }
    assert figures["cancelled"] == {"shadow": 5}
    assert figures["attempts"] == {}
    assert figures["lanes"] == {}  # no transport counts a call

    live = send(store, providers(twilio, postmark), clock, [reset_request(region="us")])
    assert live[0].submitted
    assert twilio.calls == 1
    assert health(store, clock(), 3600)["rollout"]["would_send"]["us"] == {"sms": 2}


def test_shadow_reaches_no_smtp_relay_and_writes_no_outbox_message(
    store: Store, clock: FakeClock
) -> None:
    """Email by SMTP, SMS by the outbox: a shadow notice greets no relay and leaves no
    message in the outbox (the embedded transport is a transport like any); a live one
    does both."""
    handler = CountedRelay()
    with serve(handler) as port:
        smtp = {"host": "127.0.0.1", "port": port, "security": "none", "from": "r@shop.example"}
        table: dict[str, Any] = {"transport": {"email": "smtp", "sms": "outbox"}, "smtp": smtp}
        shadow = make_settings(**table, policy=POLICIES, rollout=SHADOW)
        mail, text = send(store, shadow, clock, [reset_request(), reset_request(region="us")])
        sweep(store, shadow, clock)
        assert (handler.greetings, handler.received, store.outbox_messages()) == (0, [], [])
        assert phase_and_reason(store, mail.notice_id) == (Phase.CANCELLED, "shadow")
        assert phase_and_reason(store, text.notice_id) == (Phase.CANCELLED, "shadow")

        live = make_settings(**table, policy=POLICIES)
        send(store, live, clock, [reset_request(), reset_request(region="us")])
        assert handler.greetings == 1
        assert [m["channel"] for m in store.outbox_messages()] == ["sms"]


def test_shadow_runs_the_limits_the_country_cap_and_the_skip_to_email(
    store: Store, clock: FakeClock, twilio: CountedTwilio, postmark: CountedPostmark
) -> None:
    """Region policy runs in shadow: a recipient over limits.per_recipient is refused at
    enqueue (rate_limited, its line marked shadow), and past sms_per_country_per_hour the
    SMS is skipped (country_cap) so the would-send is the email. No request reaches a
    provider, and the lanes count no call."""
    settings = make_settings(
        transport={"email": "postmark", "sms": "twilio"},
        postmark={"base_url": postmark.base_url, "from": POSTMARK_SENDER},
        twilio={"base_url": twilio.base_url, "from": TWILIO_SENDER},
        policy={
            "us": {
                "channels": ["sms", "email"],
                "limits": {"per_recipient": 1, "sms_per_country_per_hour": 1},
            }
        },
        rollout=SHADOW,
    )
    first, capped, limited = send(
        store,
        settings,
        clock,
        [
            reset_request(region="us", phone="+14155550101"),
            reset_request(region="us", phone="+14155550102"),
            reset_request(region="us", phone="+14155550101", email="other@example.com"),
        ],
    )
    sweep(store, settings, clock)
    assert (twilio.calls, postmark.calls) == (0, 0)
    # Refused in shadow: the line says so, and shadow too (the application's path decides).
    assert (limited.to_json()["refused"], limited.to_json()["shadow"]) == ("rate_limited", True)
    # Which of the two takes the hour's one SMS is the claim's order: either way, one.
    skips = [notice_report(store, str(r.notice_id), clock())["skipped"] for r in (first, capped)]
    assert sorted(skips, key=len) == [{}, {"sms": "country_cap"}]
    figures = health(store, clock(), 3600)
    assert figures["rollout"]["would_send"] == {"us": {"email": 1, "sms": 1}}
    assert figures["skipped"] == {"us": {"country_cap": 1}}
    assert figures["refused"] == {"us": {"rate_limited": 1}}
    assert figures["lanes"] == {}  # a capped SMS is no call either
    for result in (first, capped):
        assert phase_and_reason(store, result.notice_id) == (Phase.CANCELLED, "shadow")


def test_a_shadow_sms_that_cannot_render_fails_its_channel_as_a_live_one_would(
    store: Store, clock: FakeClock, twilio: CountedTwilio, postmark: CountedPostmark
) -> None:
    """An SMS over sms.max_segments is a permanent render failure, recorded as a live one
    is (rejected, no call); the fallback's email is then the would-send."""
    settings = make_settings(
        transport={"email": "postmark", "sms": "twilio"},
        postmark={"base_url": postmark.base_url, "from": POSTMARK_SENDER},
        twilio={"base_url": twilio.base_url, "from": TWILIO_SENDER},
        policy={"us": {"channels": ["sms", "email"], "sms": {"max_segments": 1}}},
        rollout=SHADOW,
    )
    long_link = "https://shop.example/reset/" + "t" * 150
    (result,) = send(store, settings, clock, [reset_request(region="us", reset_url=long_link)])
    sweep(store, settings, clock)
    assert (twilio.calls, postmark.calls) == (0, 0)
    assert phase_and_reason(store, result.notice_id) == (Phase.CANCELLED, "shadow")
    assert result.notice_id is not None
    (sms,) = store.attempt_rows(result.notice_id)
    assert (sms["channel"], sms["state"]) == ("sms", "rejected")
    assert health(store, clock(), 3600)["rollout"]["would_send"] == {"us": {"email": 1}}


def test_switching_shadow_to_live_sends_nothing_enqueued_in_shadow(
    store: Store, clock: FakeClock, twilio: CountedTwilio, postmark: CountedPostmark
) -> None:
    """Notices enqueued in shadow and still queued when the config turns live are ended
    in shadow by the live sweep (the application sent them by its own path): nothing
    fires later. A notice enqueued after the switch is sent."""
    shadow = providers(twilio, postmark, **SHADOW)
    queued = enqueue(store, shadow, [reset_request(region="us") for _ in range(3)], clock())
    live = providers(twilio, postmark)
    sweep(store, live, clock)
    assert (twilio.calls, postmark.calls) == (0, 0)
    for result in queued:
        assert phase_and_reason(store, result.notice_id) == (Phase.CANCELLED, "shadow")
    (after,) = enqueue(store, live, [reset_request(region="us")], clock())
    assert not after.shadow
    sweep(store, live, clock, rounds=1)
    assert len(twilio.requests) == 1


def test_switching_back_to_shadow_finishes_live_notices_live(
    store: Store, clock: FakeClock, twilio: CountedTwilio, postmark: CountedPostmark
) -> None:
    """A notice enqueued live is the only path its reset has: a sweep under a shadow
    config still sends it; only notices enqueued from then on are shadow ones."""
    (live,) = enqueue(store, providers(twilio, postmark), [reset_request(region="us")], clock())
    shadow = providers(twilio, postmark, **SHADOW)
    (later,) = enqueue(store, shadow, [reset_request(region="us")], clock())
    sweep(store, shadow, clock, rounds=1)
    assert len(twilio.requests) == 1
    assert phase_and_reason(store, live.notice_id)[0] is Phase.PRIMARY_PENDING
    assert phase_and_reason(store, later.notice_id) == (Phase.CANCELLED, "shadow")


def test_a_retry_of_a_shadow_key_still_says_shadow_after_the_switch(
    store: Store, clock: FakeClock, twilio: CountedTwilio, postmark: CountedPostmark
) -> None:
    """The same request retried once the config is live answers with its shadow notice
    (created false, "shadow": true), and sends nothing; a live notice's retry says
    nothing of shadow."""
    request = reset_request(region="us")
    (first,) = enqueue(store, providers(twilio, postmark, **SHADOW), [request], clock())
    (again,) = send(store, providers(twilio, postmark), clock, [request])
    assert (again.notice_id, again.created, again.shadow) == (first.notice_id, False, True)
    assert again.to_json()["shadow"] is True
    assert twilio.calls == 0
    live_request = reset_request(region="us")
    enqueue(store, providers(twilio, postmark), [live_request], clock())
    (retried,) = enqueue(store, providers(twilio, postmark, **SHADOW), [live_request], clock())
    assert (retried.created, retried.shadow) == (False, False)
    assert "shadow" not in retried.to_json()


def test_shadow_leaves_no_contact_data_in_logs_events_health_metrics_or_inspect(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A canary: the address, number, name and link of shadow notices appear in no log
    line, event, health figure, metric, inspect report, enqueue line or timing export."""
    settings = make_settings(policy=POLICIES, rollout=SHADOW)
    canary = {
        "email": "canary.shadow@example.org",
        "phone": "+14155550177",
        "display_name": "Canary Shadowname",
        "reset_url": "https://shop.example/reset/canary-token-9f8e7d",
    }
    requests = [reset_request(**canary), reset_request(region="us", **canary | {"email": None})]
    with caplog.at_level(logging.DEBUG, logger=LOGGER.name):
        results = enqueue(store, settings, requests, clock())
        sweep(store, settings, clock)
    seen = [
        caplog.text,
        json.dumps([r.to_json() for r in results]),
        json.dumps(health(store, clock(), 3600)),
        repr(list(metric_families(store, clock()))),
        json.dumps(list(export_timings(store, 0.0, clock() + 1))),
    ]
    for result in results:
        assert result.notice_id is not None
        seen.append(json.dumps(notice_report(store, result.notice_id, clock()), default=str))
        seen.append(json.dumps(store.event_rows(result.notice_id), default=str))
    assert "shadow" in seen[2]
    for secret in canary.values():
        for text in (secret, secret.split("@")[0], secret.split("/")[-1]):
            assert all(text not in output for output in seen), text


def test_inspect_names_a_shadow_notices_end_and_its_would_send_channel(
    store: Store, db: str, clock: FakeClock
) -> None:
    """On-call reads a shadow notice as cancelled (shadow), with no attempt, its history
    naming the channel it would have gone by."""
    settings = make_settings(policy=POLICIES, rollout=SHADOW)
    (result,) = enqueue(store, settings, [reset_request(region="us")], clock())
    sweep(store, settings, clock, rounds=1)
    assert result.notice_id is not None
    done = resetctl("inspect", result.notice_id, db=db)
    assert done.returncode == 0, done.stderr
    assert f"{result.notice_id}  phase cancelled (shadow)" in done.stdout
    (line,) = [line for line in done.stdout.splitlines() if " shadow " in line]
    assert "queued → cancelled  sms (shadow)" in line
    lines = done.stdout.splitlines()
    assert lines[lines.index("attempts:") + 1] == "history:"  # no attempt to show


def test_timing_exports_leave_shadow_notices_out(store: Store, clock: FakeClock) -> None:
    """A shadow notice met no provider: export-timings (what replay fits) skips it and
    keeps the live one."""
    enqueue(store, make_settings(rollout=SHADOW), [reset_request()], clock())
    enqueue(store, make_settings(), [reset_request()], clock())
    sweep(store, make_settings(outbox={"email_status": "delivered"}), clock)
    traces = list(export_timings(store, 0.0, clock() + 1))
    assert len(traces) == 2  # the header, then the live notice
    assert "email" in traces[1]


def test_purge_takes_a_shadow_mark_with_its_notice(store: Store, clock: FakeClock) -> None:
    """A finished shadow notice past retention goes whole, its mark included, and its
    would-send stays in health's count (folded into the daily aggregates)."""
    settings = make_settings(rollout=SHADOW)
    (result,) = enqueue(store, settings, [reset_request()], clock())
    sweep(store, settings, clock, rounds=1)
    assert result.notice_id is not None
    assert store.shadow_among([result.notice_id]) == {result.notice_id}
    before = health(store, clock(), 7 * 86400)["rollout"]
    clock.advance(31 * 86400)
    assert purge(store, 30 * 86400, clock()).deleted == 1
    (marks,) = store.conn.execute("SELECT COUNT(*) FROM shadow_notices").fetchone()
    assert marks == 0
    assert before == {"would_send": {"default": {"email": 1}}, "out_of_slice": {}}
    assert health(store, clock(), 40 * 86400)["rollout"] == before


def test_a_version_7_database_learns_the_rollout_tables(store: Store, db: str) -> None:
    """Migrating 7 → 8 creates the shadow marks and the slice answers as a new database
    has them, and they work."""
    for table in ("shadow_notices", "slice_answers"):
        store.conn.execute(f"DROP TABLE {table}")
    if store.backend == "sqlite":
        store.conn.execute("PRAGMA user_version = 7")
    else:
        store.conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    store.close()
    with Store(db) as migrated:
        settings = make_settings(rollout=SHADOW)
        (result,) = enqueue(migrated, settings, [reset_request()], time.time())
        assert result.shadow
        assert result.notice_id is not None
        assert migrated.shadow_among([result.notice_id]) == {result.notice_id}
        assert migrated.slice_answers(["none"]) == {}


def test_a_shadow_mark_needs_its_notice(store: Store) -> None:
    """The mark references the notice row: a mark for no notice is refused."""
    errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)
    if store.backend == "postgresql":
        import psycopg

        errors = (psycopg.IntegrityError,)
    with pytest.raises(errors), store.transaction():
        store.mark_shadow(["ntc_missing"])
