"""Loopback scaffolding for fake HTTP providers (Twilio, Postmark): a threaded server on
127.0.0.1 whose handler can reply, drop the connection without a word, or hold a reply
back until the test ends (past a client's short read time-out)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

#: The longest a held-back reply waits; `FakeProvider.close` lets it go at once.
HOLD_LIMIT = 5.0


class FakeProvider:
    """A provider on 127.0.0.1: subclasses answer in ``handle_post`` and ``handle_get``."""

    def __init__(self) -> None:
        #: set at shutdown: lets every held-back reply go (nothing sleeps on the clock)
        self.released = threading.Event()
        self.lock = threading.Lock()
        self._server = _LoopbackServer(self)
        # A short poll keeps shutdown (once per test) from waiting out the default 0.5 s.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def handle_post(self, handler: ProviderHandler) -> None:
        handler.reply(405, {"message": "method not allowed"})

    def handle_get(self, handler: ProviderHandler) -> None:
        handler.reply(405, {"message": "method not allowed"})


class _LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeProvider) -> None:
        super().__init__(("127.0.0.1", 0), ProviderHandler)
        self.fake = fake

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that gave up on a held-back reply is part of the script."""


class ProviderHandler(BaseHTTPRequestHandler):
    """One request to a fake provider, with the ways a real one answers or fails."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; Nagle would hold the second for an ACK.
    disable_nagle_algorithm = True

    @property
    def fake(self) -> FakeProvider:
        return cast(_LoopbackServer, self.server).fake

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the fake's requests are asserted on, not printed."""

    def do_POST(self) -> None:
        self.fake.handle_post(self)

    def do_GET(self) -> None:
        self.fake.handle_get(self)

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """Answer with a JSON body (a str goes out as it is, e.g. an HTML error page)."""
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # The client gave up first (a read time-out test): nothing to tell it.
            self.close_connection = True

    def drop(self) -> None:
        """Close the connection without a reply, after the request was read."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        """Wait until the test ends (bounded): the client's read time-out fires first."""
        self.fake.released.wait(HOLD_LIMIT)


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
