"""Twilio's status callbacks over real HTTP on loopback: the WSGI endpoint under waitress,
mounted in a Flask application, and `resetctl serve-callbacks` as a process.

Signatures are made with the oracle in test_twilio_signature (Twilio's documented
algorithm, written independently of resetctl's)."""

from __future__ import annotations

import os
import selectors
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
import waitress
from conftest import FakeClock, make_settings, reset_request
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER, FakeTwilio
from test_twilio_signature import reference_signature
from waitress import wasyncore

import resetctl
from resetctl.web import twilio_callbacks

PUBLIC_URL = "https://hooks.acme.example/twilio?site=eu"
ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def handle(db_path: Path, clock: FakeClock, twilio: FakeTwilio) -> Iterator[resetctl.Handle]:
    settings = make_settings(
        transport={"sms": "twilio"},
        twilio={"base_url": twilio.base_url, "from": SENDER, "status_callback": PUBLIC_URL},
        policy={"default": {"channels": ["sms", "email"]}},
    )
    with resetctl.open(
        db_path, settings, clock=clock, sleep=clock.sleep, environ=ENVIRON, busy_timeout=0.2
    ) as opened:
        yield opened


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The WSGI app under waitress on a free loopback port; yields its base URL."""
    # X-Forwarded-* reach the app, which decides itself whether to trust them.
    sockets: dict[int, Any] = {}
    server = waitress.create_server(
        app, map=sockets, host="127.0.0.1", port=0, threads=2, clear_untrusted_proxy_headers=False
    )
    stop = threading.Event()

    def run() -> None:
        # server.run() cannot be stopped from another thread without closing sockets
        # under its poll(); a loop that checks a flag between short polls can.
        while not stop.is_set():
            wasyncore.loop(timeout=0.05, map=sockets, count=1, use_poll=True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        stop.set()
        thread.join(timeout=10)
        server.task_dispatcher.shutdown()
        wasyncore.close_all(sockets)


def sent_sms(handle: resetctl.Handle, twilio: FakeTwilio) -> tuple[str, str, str]:
    """Enqueue one notice and sweep it: (notice id, MessageSid, the StatusCallback URL)."""
    (result,) = handle.enqueue([reset_request()])
    handle.sweep()
    (sid,) = twilio.messages
    return result.notice_id, sid, twilio.requests[-1]["StatusCallback"]


def post(
    base: str,
    callback_url: str,
    form: dict[str, str],
    *,
    path: str = "/twilio",
    signed_url: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """POST a callback as Twilio would, to ``path`` with the callback URL's query."""
    signature = reference_signature(signed_url or callback_url, form, AUTH_TOKEN)
    return httpx.post(
        f"{base}{path}?{urlsplit(callback_url).query}",
        content=urlencode(form),
        headers={"Content-Type": FORM, "X-Twilio-Signature": signature, **(headers or {})},
        timeout=30,
    )


def delivered(sid: str) -> dict[str, str]:
    return {
        "MessageSid": sid,
        "MessageStatus": "delivered",
        "AccountSid": ACCOUNT_SID,
        "To": "+14155550123",
    }


def callbacks(handle: resetctl.Handle, notice_id: str) -> int:
    return sum(1 for h in handle.inspect(notice_id)["history"] if h["kind"] == "callback")


def test_a_signed_callback_is_recorded(handle: resetctl.Handle, twilio: FakeTwilio) -> None:
    """A callback signed for the public URL plus its query is recorded: 204, accepted."""
    notice_id, sid, url = sent_sms(handle, twilio)
    assert url.startswith(PUBLIC_URL + "&attempt=")

    with serving(twilio_callbacks(handle)) as base:
        response = post(base, url, delivered(sid))

    assert response.status_code == 204
    assert response.content == b""
    report = handle.inspect(notice_id)
    assert report["phase"] == "accepted"
    assert report["attempts"][0]["last_observation"]["source"] == "callback"


def test_a_forged_callback_is_403_and_stores_nothing(
    handle: resetctl.Handle, twilio: FakeTwilio, caplog: pytest.LogCaptureFixture
) -> None:
    """A signature made with another token, or for another URL, is refused; nothing stored."""
    notice_id, sid, url = sent_sms(handle, twilio)
    form = delivered(sid)
    forged = reference_signature(url, form, "not-the-token")

    with serving(twilio_callbacks(handle)) as base:
        wrong_token = post(base, url, form, headers={"X-Twilio-Signature": forged})
        wrong_url = post(base, url, form, signed_url="https://evil.example/twilio?site=eu")
        unsigned = httpx.post(
            f"{base}/twilio?{urlsplit(url).query}",
            content=urlencode(form),
            headers={"Content-Type": FORM},
        )

    assert [wrong_token.status_code, wrong_url.status_code, unsigned.status_code] == [403] * 3
    assert callbacks(handle, notice_id) == 0
    assert handle.inspect(notice_id)["phase"] == "primary_pending"
    assert "+14155550123" not in caplog.text + wrong_token.text
    assert AUTH_TOKEN not in caplog.text


def test_a_replayed_callback_is_stored_once(handle: resetctl.Handle, twilio: FakeTwilio) -> None:
    """The same callback twice, or a retry under one idempotency token, is stored once."""
    notice_id, sid, url = sent_sms(handle, twilio)
    form = delivered(sid)
    form["MessageStatus"] = "sent"
    token = {"I-Twilio-Idempotency-Token": "idem-1"}

    with serving(twilio_callbacks(handle)) as base:
        first, again = post(base, url, form), post(base, url, form)
        form["MessageStatus"] = "delivered"
        retried = [post(base, url, form, headers=token) for _ in range(2)]

    assert [first.status_code, again.status_code] == [204, 204]
    assert [r.status_code for r in retried] == [204, 204]
    assert callbacks(handle, notice_id) == 2
    assert handle.inspect(notice_id)["phase"] == "accepted"


def test_a_callback_for_an_ambiguous_attempt_is_matched_by_its_attempt_key(
    handle: resetctl.Handle, twilio: FakeTwilio
) -> None:
    """A message whose create reply was lost is found by the attempt key in the URL."""
    (result,) = handle.enqueue([reset_request()])
    twilio.outcomes = ["hangup"]
    twilio.list_outcomes = ["error"]  # the lookup cannot tell either
    handle.sweep()
    (sid,) = twilio.messages
    url = twilio.requests[0]["StatusCallback"]
    assert handle.inspect(result.notice_id)["attempts"][0]["state"] == "ambiguous"

    with serving(twilio_callbacks(handle)) as base:
        response = post(base, url, delivered(sid))

    assert response.status_code == 204
    report = handle.inspect(result.notice_id)
    assert (report["phase"], report["attempts"][0]["state"]) == ("accepted", "submitted")
    handle.sweep()
    assert len(twilio.requests) == 1  # no second text


def test_a_malformed_or_oversized_request_is_refused(
    handle: resetctl.Handle, twilio: FakeTwilio
) -> None:
    """A signed body without a status is 400; a GET 405; a JSON body 415; a huge one 413."""
    notice_id, sid, url = sent_sms(handle, twilio)
    query = urlsplit(url).query

    with serving(twilio_callbacks(handle, max_body=1024)) as base:
        no_status = post(base, url, {"MessageSid": sid, "AccountSid": ACCOUNT_SID})
        get = httpx.get(f"{base}/twilio?{query}")
        as_json = httpx.post(f"{base}/twilio?{query}", json=delivered(sid))
        huge = httpx.post(
            f"{base}/twilio?{query}", content="a=" + "x" * 2048, headers={"Content-Type": FORM}
        )

    assert no_status.status_code == 400
    assert (get.status_code, get.headers["Allow"]) == (405, "POST")
    assert as_json.status_code == 415
    assert huge.status_code == 413
    assert callbacks(handle, notice_id) == 0


def test_a_locked_database_is_503_so_twilio_retries(
    handle: resetctl.Handle, twilio: FakeTwilio, db_path: Path
) -> None:
    """While another writer holds the lock the callback gets 503; the retry is recorded."""
    notice_id, sid, url = sent_sms(handle, twilio)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    try:
        with serving(twilio_callbacks(handle)) as base:
            blocker.execute("BEGIN EXCLUSIVE")
            locked = post(base, url, delivered(sid))
            blocker.execute("ROLLBACK")
            retried = post(base, url, delivered(sid))
    finally:
        blocker.close()

    assert (locked.status_code, locked.headers["Retry-After"]) == (503, "5")
    assert retried.status_code == 204
    assert callbacks(handle, notice_id) == 1


def test_forwarded_headers_count_only_when_trusted(
    handle: resetctl.Handle, twilio: FakeTwilio
) -> None:
    """A callback signed for the proxy's host verifies only with trust_forwarded."""
    notice_id, sid, url = sent_sms(handle, twilio)
    proxied = url.replace("https://hooks.acme.example", "https://eu.hooks.acme.example")
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "eu.hooks.acme.example"}

    with serving(twilio_callbacks(handle)) as base:
        untrusted = post(base, url, delivered(sid), signed_url=proxied, headers=forwarded)
    assert untrusted.status_code == 403
    with serving(twilio_callbacks(handle, trust_forwarded=True)) as base:
        trusted = post(base, url, delivered(sid), signed_url=proxied, headers=forwarded)
    assert trusted.status_code == 204
    assert callbacks(handle, notice_id) == 1


def test_no_public_url_or_token_fails_when_the_app_is_built(
    db_path: Path, clock: FakeClock
) -> None:
    """Without a public URL or an auth token the endpoint refuses to exist."""
    with (
        resetctl.open(db_path, make_settings(), environ=ENVIRON) as opened,
        pytest.raises(resetctl.ConfigError, match="public URL"),
    ):
        twilio_callbacks(opened)
    with (
        resetctl.open(db_path, make_settings(), environ={}) as opened,
        pytest.raises(resetctl.ConfigError, match="TWILIO_AUTH_TOKEN"),
    ):
        twilio_callbacks(opened, PUBLIC_URL)


def test_the_endpoint_mounts_in_a_flask_application(
    handle: resetctl.Handle, twilio: FakeTwilio
) -> None:
    """Mounted under /hooks in a Flask app whose own route enqueues: both work over HTTP."""
    from flask import Flask, jsonify, request
    from werkzeug.middleware.dispatcher import DispatcherMiddleware
    from werkzeug.serving import make_server

    marketplace = Flask("marketplace")

    @marketplace.post("/forgot-password")
    def forgot_password() -> Any:
        email = request.form["email"]
        (result,) = handle.enqueue(
            [
                {
                    "idempotency_key": f"forgot-{email}",
                    "email": email,
                    "phone": "+14155550123",
                    "reset_url": "https://shop.example/r/abc",
                }
            ]
        )
        return jsonify(notice_id=result.notice_id), 202

    marketplace.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        marketplace.wsgi_app, {"/hooks/twilio": twilio_callbacks(handle)}
    )
    server = make_server("127.0.0.1", 0, marketplace, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        enqueued = httpx.post(f"{base}/forgot-password", data={"email": "ada@example.com"})
        assert enqueued.status_code == 202
        notice_id = enqueued.json()["notice_id"]
        handle.sweep()
        (sid,) = twilio.messages
        url = twilio.requests[-1]["StatusCallback"]
        response = post(base, url, delivered(sid), path="/hooks/twilio")
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()

    assert response.status_code == 204
    assert handle.inspect(notice_id)["phase"] == "accepted"


@contextmanager
def serve_callbacks_process(
    db: Path, config: Path, env: dict[str, str], *options: str
) -> Iterator[tuple[str, Callable[[], subprocess.Popen[str]]]]:
    """`resetctl serve-callbacks --bind 127.0.0.1:0` with ``options``; yields its base URL
    once it listens."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    full_env.update(env, RESETCTL_DB=str(db), RESETCTL_CONFIG=str(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "resetctl", "serve-callbacks", "--bind", "127.0.0.1:0", *options],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    try:
        assert process.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            assert selector.select(timeout=60), "serve-callbacks did not start"
        line = process.stderr.readline()
        assert "serving Twilio callbacks on http://127.0.0.1:" in line, line
        yield line.split()[-1], lambda: process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


@pytest.mark.slow
def test_serve_callbacks_records_a_signed_callback_and_refuses_a_forged_one(
    handle: resetctl.Handle, twilio: FakeTwilio, db_path: Path, tmp_path: Path
) -> None:
    """The standalone server (waitress) answers 204 and 403, and SIGTERM stops it cleanly."""
    notice_id, sid, url = sent_sms(handle, twilio)
    config = tmp_path / "resetctl.toml"
    config.write_text(
        f'[transport]\nsms = "twilio"\n[twilio]\nfrom = "{SENDER}"\n'
        f'base_url = "{twilio.base_url}"\nstatus_callback = "{PUBLIC_URL}"\n',
        encoding="utf-8",
    )
    with serve_callbacks_process(db_path, config, ENVIRON) as (base, process):
        forged = post(base, url, delivered(sid), signed_url=url + "&x=1")
        signed = post(base, url, delivered(sid))
        process().send_signal(signal.SIGTERM)
        assert process().wait(timeout=30) == 0

    assert (forged.status_code, signed.status_code) == (403, 204)
    assert handle.inspect(notice_id)["phase"] == "accepted"


def test_serve_callbacks_without_waitress_says_what_to_install(
    db_path: Path, tmp_path: Path
) -> None:
    """Without the web extra: one line naming the extra, exit 2."""
    blocker = tmp_path / "no-waitress"
    (blocker / "waitress").mkdir(parents=True)
    (blocker / "waitress" / "__init__.py").write_text("raise ImportError('absent')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env["PYTHONPATH"] = str(blocker)
    done = subprocess.run(
        [sys.executable, "-m", "resetctl", "serve-callbacks", "--db", str(db_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: serve-callbacks needs waitress: pip install 'resetctl[web]'"
    ]
