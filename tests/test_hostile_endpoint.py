"""`resetctl serve-callbacks` under hostile clients, as a real process on loopback, built the
way it broke: waitress once read any body (up to its 1 GiB default, to temp files) before
the app's 64 KiB check; slow-loris connections held every slot with no deadline; and
X-Forwarded-Host was taken, client-most value first, from any peer.

Each test is bounded in connections and seconds."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from conftest import FakeClock, make_settings
from providers_twilio import AUTH_TOKEN, SENDER, FakeTwilio
from test_twilio_signature import reference_signature
from test_web_callbacks import (
    ENVIRON,
    FORM,
    PUBLIC_URL,
    callbacks,
    delivered,
    post,
    sent_sms,
    serve_callbacks_process,
)
from typer.testing import CliRunner

import resetctl
import resetctl.api
from resetctl.cli import app
from resetctl.web import MAX_BODY

#: Seconds within which a refusal must come back: "at once", with room for a loaded machine.
PROMPT = 10.0


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


@pytest.fixture
def config(tmp_path: Path, twilio: FakeTwilio) -> Path:
    path = tmp_path / "resetctl.toml"
    path.write_text(
        f'[transport]\nsms = "twilio"\n[twilio]\nfrom = "{SENDER}"\n'
        f'base_url = "{twilio.base_url}"\nstatus_callback = "{PUBLIC_URL}"\n',
        encoding="utf-8",
    )
    return path


def _address(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def _head(query: str, **headers: str) -> bytes:
    lines = [f"POST /twilio?{query} HTTP/1.1", "Host: hooks.acme.example", f"Content-Type: {FORM}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _reply_head(sock: socket.socket) -> bytes:
    """The status line and headers the server sends, read within PROMPT seconds."""
    sock.settimeout(PROMPT)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(4096)
        if not chunk:
            break
        received += chunk
    return received


@pytest.mark.slow
def test_an_oversized_body_is_refused_before_it_is_sent(
    handle: resetctl.Handle, twilio: FakeTwilio, db_path: Path, config: Path
) -> None:
    """A Content-Length over 64 KiB is answered 413 from the headers alone, with none of
    the body sent; a chunked body, as soon as it passes the limit, unfinished. A body at
    the limit still reaches the application, and real callbacks are answered after."""
    notice_id, sid, url = sent_sms(handle, twilio)
    query = urlsplit(url).query
    with serve_callbacks_process(db_path, config, ENVIRON) as (base, _):
        with socket.create_connection(_address(base), timeout=PROMPT) as sock:
            sock.sendall(_head(query, Content_Length=str(100 * 2**20)))
            declared = _reply_head(sock)

        with socket.create_connection(_address(base), timeout=PROMPT) as sock:
            sock.sendall(_head(query, Transfer_Encoding="chunked"))
            # waitress counts the chunk framing: end exactly on the limit's first byte, so
            # nothing sent is left unread (unread bytes would make the close a reset).
            size_line = f"{MAX_BODY:x}\r\n".encode()
            sock.sendall(size_line + b"a" * (MAX_BODY + 1 - len(size_line)))
            chunked = _reply_head(sock)

        at_limit = httpx.post(
            f"{base}/twilio?{query}",
            content=b"a=" + b"x" * (MAX_BODY - 2),
            headers={"Content-Type": FORM},
            timeout=30,
        )
        signed = post(base, url, delivered(sid))

    assert declared.startswith(b"HTTP/1.1 413 "), declared
    assert chunked.startswith(b"HTTP/1.1 413 "), chunked
    assert at_limit.status_code == 403  # read whole, then refused by its (absent) signature
    assert signed.status_code == 204
    assert callbacks(handle, notice_id) == 1


@pytest.mark.slow
def test_slow_loris_connections_do_not_keep_a_real_callback_out(
    handle: resetctl.Handle, twilio: FakeTwilio, db_path: Path, config: Path
) -> None:
    """Twice the connection limit of clients trickling header lines (each keeps waitress's
    inactivity timer alive) are cut off at the request deadline, and a real callback
    queued behind them is answered; every slow connection ends closed by the server."""
    notice_id, sid, url = sent_sms(handle, twilio)
    limit = 4
    options = ("--max-connections", str(limit), "--request-timeout", "1s")
    with serve_callbacks_process(db_path, config, ENVIRON, *options) as (base, _):
        slow = [socket.create_connection(_address(base), timeout=PROMPT) for _ in range(2 * limit)]
        for sock in slow:
            sock.sendall(b"POST /twilio HTTP/1.1\r\nHost: hooks.acme.example\r\n")
        stop = threading.Event()

        def trickle() -> None:
            line = 0
            while not stop.wait(0.2):
                line += 1
                for sock in slow:
                    with contextlib.suppress(OSError):  # the server closed it
                        sock.sendall(f"X-Pad-{line}: y\r\n".encode())

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        started = time.monotonic()
        try:
            response = post(base, url, delivered(sid))
            waited = time.monotonic() - started
        finally:
            stop.set()
            trickler.join(timeout=10)
        closed = [_closed_by_server(sock) for sock in slow]
        for sock in slow:
            sock.close()

    assert response.status_code == 204
    # Two rounds of the 1 s deadline (plus a second's loop tick each), not waitress's 120 s.
    assert waited < 20, waited
    assert closed == [True] * len(slow)
    assert handle.inspect(notice_id)["phase"] == "accepted"


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (end of stream or a reset), within PROMPT."""
    sock.settimeout(PROMPT)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def _post_as(
    client: httpx.Client,
    base: str,
    callback_url: str,
    form: dict[str, str],
    signed_url: str,
    forwarded_host: str,
) -> httpx.Response:
    signature = reference_signature(signed_url, form, AUTH_TOKEN)
    return client.post(
        f"{base}/twilio?{urlsplit(callback_url).query}",
        content=urlencode(form),
        headers={
            "Content-Type": FORM,
            "X-Twilio-Signature": signature,
            "X-Forwarded-Proto": "https",
            "X-Forwarded-Host": forwarded_host,
        },
        timeout=30,
    )


@pytest.mark.slow
def test_forwarded_headers_count_only_from_the_trusted_proxy(
    handle: resetctl.Handle, twilio: FakeTwilio, db_path: Path, config: Path
) -> None:
    """With --trusted-proxy 127.0.0.2: from that address only the value the proxy added
    (the last) counts; from any other peer X-Forwarded-* are dropped, so a callback
    signed for a host of the client's choosing is refused."""
    notice_id, sid, url = sent_sms(handle, twilio)
    form = delivered(sid)
    eu = url.replace("https://hooks.acme.example", "https://eu.hooks.acme.example")
    evil = url.replace("https://hooks.acme.example", "https://evil.example")
    options = ("--trusted-proxy", "127.0.0.2")
    with (
        serve_callbacks_process(db_path, config, ENVIRON, *options) as (base, _),
        httpx.Client() as direct,
        httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as proxy,
    ):
        from_client = _post_as(direct, base, url, form, eu, "eu.hooks.acme.example")
        chosen_by_client = _post_as(
            proxy, base, url, form, evil, "evil.example, eu.hooks.acme.example"
        )
        added_by_proxy = _post_as(proxy, base, url, form, eu, "evil.example, eu.hooks.acme.example")
        ignored = _post_as(direct, base, url, form, url, "evil.example")

    assert from_client.status_code == 403
    assert chosen_by_client.status_code == 403
    assert added_by_proxy.status_code == 204
    assert ignored.status_code == 204  # its forwarded host was dropped: the public URL
    assert handle.inspect(notice_id)["phase"] == "accepted"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--trust-forwarded"],
            "error: --trust-forwarded: name the proxy with --trusted-proxy ADDR (forwarded"
            " headers from any other peer are dropped)",
        ),
        (
            ["--trusted-proxy", "*"],
            "error: --trusted-proxy: expected the reverse proxy's IP address, e.g. 127.0.0.1",
        ),
        (
            ["--trusted-proxy", "proxy.internal"],
            "error: --trusted-proxy: expected the reverse proxy's IP address, e.g. 127.0.0.1",
        ),
        (["--request-timeout", "0s"], "error: --request-timeout: must be a positive duration"),
        (["--request-timeout", "5m"], "error: --request-timeout: expected a duration in (0, 60s]"),
    ],
)
def test_proxy_and_deadline_options_are_checked(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str], message: str
) -> None:
    """A forwarded-header trust with no proxy named, a proxy that is not an address, a
    deadline out of range: one line, exit 2, nothing served."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    resetctl.api.init_database(db_path)
    result = CliRunner().invoke(
        app,
        [
            "serve-callbacks",
            "--db",
            str(db_path),
            "--bind",
            "127.0.0.1:0",
            "--public-url",
            PUBLIC_URL,
            *options,
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == message
