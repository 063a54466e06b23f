"""End to end over real transports on loopback: email through SMTP fails permanently, the
SMS goes through Twilio, and its delivery arrives by polling or by a signed callback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import FakeClock, database_follows, make_settings, reset_request, resetctl, run_sweep
from fakes import ScriptedTransport
from test_transport_smtp import ScriptedHandler, serve
from test_transport_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER, FakeTwilio

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.observe import record_callback
from resetctl.store import Store
from resetctl.transports import build_transports, close_transports
from resetctl.transports.twilio import compute_signature, normalize

ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
CALLBACK_URL = "https://hooks.acme.example/twilio/status"


@pytest.fixture
def twilio() -> Iterator[FakeTwilio]:
    server = FakeTwilio()
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.fixture
def refusing_smtp() -> Iterator[int]:
    with serve(ScriptedHandler(outcome="reject")) as port:
        yield port


def real_settings(smtp_port: int, twilio: FakeTwilio) -> dict[str, Any]:
    return {
        "transport": {"email": "smtp", "sms": "twilio"},
        "smtp": {
            "host": "127.0.0.1",
            "port": smtp_port,
            "security": "none",
            "from": "no-reply@acme.example",
        },
        "twilio": {"base_url": twilio.base_url, "from": SENDER},
    }


def _sweep(store: Store, settings: Settings, clock: FakeClock, **kw: Any) -> Any:
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        return run_sweep(store, settings, clock, transports, **kw)
    finally:
        close_transports(transports)


def _sent_sms(store: Store, notice_id: str) -> dict[str, Any]:
    (sms,) = [a for a in store.attempt_rows(notice_id) if a["channel"] == "sms"]
    return sms


def test_smtp_refusal_falls_back_to_twilio_and_polling_finds_delivery(
    store: Store, refusing_smtp: int, twilio: FakeTwilio
) -> None:
    """A refused recipient fails the email for good; one SMS goes out; a poll sees delivery."""
    settings = make_settings(**real_settings(refusing_smtp, twilio))
    clock = FakeClock(time.time())
    (result,) = enqueue(store, settings, [reset_request(ttl="10m")], clock())
    summary = _sweep(store, settings, clock)
    assert (summary.escalated, summary.errors) == (1, 1)
    email = next(a for a in store.attempt_rows(result.notice_id) if a["channel"] == "email")
    assert email["state"] == "rejected"
    assert email["last_error"].startswith("permanent:")
    sms = _sent_sms(store, result.notice_id)
    assert sms["state"] == "submitted"
    (create,) = twilio.requests
    assert 590 <= int(create["ValidityPeriod"]) <= 600
    twilio.set_status(sms["message_id"], "delivered")
    clock.advance(15)
    database_follows(store, clock)
    _sweep(store, settings, clock)
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"
    assert len(twilio.requests) == 1


def test_smtp_refusal_falls_back_to_twilio_and_a_signed_callback_ends_it(
    db: str, store: Store, refusing_smtp: int, twilio: FakeTwilio, tmp_path: Path
) -> None:
    """The same flow, ended by Twilio's status callback through `resetctl observe twilio`."""
    data = real_settings(refusing_smtp, twilio)
    settings = make_settings(**data)
    clock = FakeClock(time.time())
    (result,) = enqueue(store, settings, [reset_request(ttl="10m")], clock())
    _sweep(store, settings, clock)
    sms = _sent_sms(store, result.notice_id)
    params = {
        "MessageSid": sms["message_id"],
        "MessageStatus": "delivered",
        "AccountSid": ACCOUNT_SID,
        "To": "+14155550123",
    }
    body = urlencode(params)
    config = tmp_path / "resetctl.toml"
    config.write_text(
        '[transport]\nemail = "smtp"\nsms = "twilio"\n'
        f'[twilio]\nbase_url = "{twilio.base_url}"\nfrom = "{SENDER}"\n',
        encoding="utf-8",
    )
    env = {"RESETCTL_CONFIG": str(config), **ENVIRON}
    forged = resetctl(
        "observe",
        "twilio",
        "--url",
        CALLBACK_URL,
        "--signature",
        "bm90LWEtc2lnbmF0dXJl",
        db=db,
        input=body,
        env=env,
    )
    assert forged.returncode == 2
    assert "signature" in forged.stderr
    assert store.load_notice(result.notice_id).state.phase.value == "fallback_pending"  # type: ignore[union-attr]
    signature = compute_signature(CALLBACK_URL, params, AUTH_TOKEN)
    accepted = resetctl(
        "observe",
        "twilio",
        "--url",
        CALLBACK_URL,
        "--signature",
        signature,
        "--json",
        db=db,
        input=body,
        env=env,
    )
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["new_phase"] == "accepted"
    assert AUTH_TOKEN not in accepted.stdout + accepted.stderr + forged.stderr
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"
    kinds = [e["kind"] for e in store.event_rows(result.notice_id)]
    assert kinds[-1] == "callback"
    assert store.load_contact(result.notice_id) is None


def test_callback_racing_a_poll_is_absorbed_by_the_compare_and_set(
    db: str, store: Store, refusing_smtp: int, twilio: FakeTwilio
) -> None:
    """A callback landing during a poll wins; the poll's answer is kept as evidence."""
    settings = make_settings(**real_settings(refusing_smtp, twilio))
    clock = FakeClock(time.time())
    (result,) = enqueue(store, settings, [reset_request(ttl="10m")], clock())
    _sweep(store, settings, clock)
    sms = _sent_sms(store, result.notice_id)
    transports: dict[str, Any] = dict(build_transports(settings, store, clock, ENVIRON))
    racing = ScriptedTransport(transports["sms"], recovers_by_key=False)
    original_status = racing.status

    def status_with_a_callback_landing(message_id: str) -> Any:
        with Store(db) as other:
            record_callback(
                other, "twilio", message_id, "delivered", normalize("delivered"), clock()
            )
        return original_status(message_id)

    racing.status = status_with_a_callback_landing  # type: ignore[method-assign]
    transports["sms"] = racing
    clock.advance(15)
    database_follows(store, clock)
    try:
        summary = run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)
    assert summary.lost_races == 1
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"
    sources = [
        r[0]
        for r in store.conn.execute(
            "SELECT source FROM observations WHERE attempt_key = ? ORDER BY id",
            (sms["attempt_key"],),
        )
    ]
    assert sources == ["submit", "callback", "poll"]
    assert len(twilio.requests) == 1


def test_missing_credentials_stop_a_sweep_before_it_claims(
    db: str, tmp_path: Path, twilio: FakeTwilio
) -> None:
    """A sweep whose SMS transport has no credentials exits 2 and leaves every notice alone."""
    with Store(db) as store:
        (result,) = enqueue(store, make_settings(), [reset_request()], time.time())
    config = tmp_path / "resetctl.toml"
    config.write_text(
        f'[transport]\nsms = "twilio"\n[twilio]\nbase_url = "{twilio.base_url}"\n'
        f'from = "{SENDER}"\n',
        encoding="utf-8",
    )
    run = resetctl("sweep", "--config", str(config), db=db)
    assert run.returncode == 2
    assert "TWILIO_ACCOUNT_SID" in run.stderr or "TWILIO_AUTH_TOKEN" in run.stderr
    with Store(db) as store:
        loaded = store.load_notice(result.notice_id)
        assert loaded is not None
        assert (loaded.state.phase.value, loaded.lease_owner) == ("queued", None)
