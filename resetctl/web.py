"""Provider callbacks and webhooks over HTTP: a WSGI application (PEP 3333) per instance.

Mount :func:`provider_callbacks` (:func:`twilio_callbacks` for ``[twilio]``) in any WSGI
application (Flask, Django) or serve it on its own (``resetctl serve-callbacks``:
:func:`callback_server`, waitress behind a reverse proxy, refusing oversized bodies, slow
clients and forwarded headers from anyone but the proxy before they cost anything). Each
request goes through :meth:`resetctl.Handle.observe`, the same code as ``resetctl observe
<instance>``: the instance's transport kind verifies and reads it, so this layer knows
no provider's fields or signature scheme.

Answers: 204 recorded (or a replay of the same signed request, stored once, whatever
unsigned headers such as Twilio's I-Twilio-Idempotency-Token say; or a verified request
that reports nothing resetctl reads); 403 a signature that does not match; 400 a body
that is not a report; 404 a message resetctl does not know; 413 a body over the limit;
415 a media type the provider does not send; 503 the database is unavailable (the
provider tries again). No answer, and no log line, carries the body, a phone number or the
signature.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from resetctl.config import loopback_host
from resetctl.errors import (
    ConfigError,
    MalformedCallback,
    NoticeNotFound,
    ResetctlError,
    SignatureMismatch,
    StoreError,
)

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from resetctl.api import Handle

LOGGER = logging.getLogger("resetctl.web")

#: Largest callback body accepted (Twilio's status callbacks are well under 2 KiB).
MAX_BODY = 64 * 1024
#: Seconds Twilio is asked to wait before retrying a callback the database could not take.
RETRY_AFTER = 5
#: Seconds a client has to send a whole request, headers and body, from its first byte
#: (or from connecting); also how long a kept-alive connection may sit idle. Twilio
#: sends a callback at once and gives up on an answer after 15 s.
REQUEST_TIMEOUT = 10.0
#: Client connections served at once; more wait in the kernel's listen backlog.
CONNECTION_LIMIT = 100
#: The longest request timeout: past Twilio's own 15 s a slow client is not Twilio.
MAX_REQUEST_TIMEOUT = 60.0
#: Largest request line and headers accepted (Twilio's are well under 4 KiB).
MAX_HEADERS = 16 * 1024

_REASONS = {
    204: "204 No Content",
    400: "400 Bad Request",
    403: "403 Forbidden",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    413: "413 Content Too Large",
    415: "415 Unsupported Media Type",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


def twilio_callbacks(
    handle: Handle,
    public_url: str | None = None,
    *,
    trust_forwarded: bool = False,
    max_body: int = MAX_BODY,
) -> WSGIApplication:
    """:func:`provider_callbacks` for the instance called ``twilio`` (``[twilio]``)."""
    return provider_callbacks(
        handle, "twilio", public_url, trust_forwarded=trust_forwarded, max_body=max_body
    )


def provider_callbacks(
    handle: Handle,
    instance: str,
    public_url: str | None = None,
    *,
    trust_forwarded: bool = False,
    max_body: int = MAX_BODY,
) -> WSGIApplication:
    """A WSGI application that verifies and records one provider instance's callbacks
    and webhooks (its kind reads them; this layer knows no provider's fields).

    ``public_url`` is the URL the provider was given (default: the instance's own, such
    as ``[twilio] status_callback``): a signature may cover its scheme, host and path,
    followed by the query string of the request as sent (which carries
    ``attempt=…``), whatever path the application is mounted at behind a proxy. With
    ``trust_forwarded`` the scheme and host come from X-Forwarded-Proto and
    X-Forwarded-Host instead, the value the nearest proxy added (the last): only where
    the server passes those headers from that proxy alone (:func:`callback_server`'s
    ``trusted_proxy``). Raises ConfigError at once when there is no public URL, an
    http:// one off this machine, or a key the instance verifies requests with is
    missing.
    """
    reader = handle.callback_reader(instance)
    reader.check()  # fail now, not on the first callback
    url = public_url or reader.public_url
    if not isinstance(url, str) or not url:
        raise ConfigError(
            f"{instance} callbacks: give a public URL or set the instance's callback URL"
        )
    public = urlsplit(url)
    if public.scheme not in ("http", "https") or not public.netloc:
        raise ConfigError(f"{instance} callbacks: the public URL must be an absolute http(s) URL")
    if public.scheme != "https" and not loopback_host(public.hostname or ""):
        # The provider would post each message's status, and the recipient, in clear.
        key = "public_url" if public_url else f"{instance} callback URL"
        raise ConfigError(f"{key}: must be https://; http:// only for a loopback host")
    media_types = reader.media_types

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        code = _answer(handle, instance, media_types, public, trust_forwarded, max_body, environ)
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if code == 405:
            headers.append(("Allow", "POST"))
        if code == 503:
            headers.append(("Retry-After", str(RETRY_AFTER)))
        if code == 204:
            start_response(_REASONS[code], [])
            return []
        body = (_REASONS[code].partition(" ")[2].lower() + "\n").encode()
        headers.append(("Content-Length", str(len(body))))
        start_response(_REASONS[code], headers)
        return [body]

    return application


def _headers(environ: WSGIEnvironment) -> dict[str, str]:
    """The request's headers, names in lower case with dashes (as a provider signs)."""
    found = {
        key[5:].replace("_", "-").lower(): str(value)
        for key, value in environ.items()
        if key.startswith("HTTP_")
    }
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            found[key.replace("_", "-").lower()] = str(environ[key])
    return found


def _answer(
    handle: Handle,
    instance: str,
    media_types: frozenset[str],
    public: SplitResult,
    trust_forwarded: bool,
    max_body: int,
    environ: WSGIEnvironment,
) -> int:
    """The status code for one request, after recording it if it is a good callback."""
    if environ.get("REQUEST_METHOD") != "POST":
        return 405
    media_type = str(environ.get("CONTENT_TYPE", "")).partition(";")[0].strip().lower()
    if media_type not in media_types:
        return 415
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 400
    if length < 0:
        return 400
    if length > max_body:
        return 413
    body = environ["wsgi.input"].read(length) if length else b""
    if len(body) != length:
        return 400
    url = signed_url(public, environ, trust_forwarded)
    try:
        result = handle.observe(instance, body=body, url=url, headers=_headers(environ))
    except SignatureMismatch:
        LOGGER.warning("%s callback refused: the signature does not match (403)", instance)
        return 403
    except MalformedCallback:
        LOGGER.warning("%s callback refused: not a status report (400)", instance)
        return 400
    except NoticeNotFound:
        LOGGER.warning("%s callback for a message resetctl does not know (404)", instance)
        return 404
    except StoreError as exc:
        LOGGER.error("%s callback not recorded, the provider will retry (503): %s", instance, exc)
        return 503
    except ResetctlError as exc:
        LOGGER.error("%s callback not recorded (500): %s", instance, exc)
        return 500
    except Exception as exc:  # a callback never takes the server down, nor leaks a payload
        LOGGER.error("%s callback not recorded (500): %s", instance, type(exc).__name__)
        return 500
    if result is None:
        LOGGER.info("%s callback verified: nothing in it to record", instance)
        return 204
    LOGGER.info(
        "%s callback %s %s: %s → %s%s",
        instance,
        result.notice_id,
        result.channel,
        result.old_phase,
        result.new_phase,
        " (replay)" if result.duplicate else "",
    )
    return 204


def signed_url(public: SplitResult, environ: WSGIEnvironment, trust_forwarded: bool) -> str:
    """The URL Twilio signed: the public scheme, host and path, and the request's query
    string exactly as sent."""
    scheme, host = public.scheme, public.netloc
    if trust_forwarded:
        proto = _nearest(environ.get("HTTP_X_FORWARDED_PROTO")).lower()
        forwarded_host = _nearest(environ.get("HTTP_X_FORWARDED_HOST"))
        scheme = proto if proto in ("http", "https") else scheme
        host = forwarded_host or host
    return urlunsplit((scheme, host, public.path, str(environ.get("QUERY_STRING", "")), ""))


def _nearest(header: object) -> str:
    """The last value of a comma-separated forwarded header: the one the nearest proxy
    added. Any before it came with the request, from whoever sent it."""
    return str(header or "").split(",")[-1].strip()


def callback_server(
    application: WSGIApplication,
    host: str,
    port: int,
    *,
    threads: int = 4,
    max_body: int = MAX_BODY,
    connection_limit: int = CONNECTION_LIMIT,
    request_timeout: float = REQUEST_TIMEOUT,
    trusted_proxy: str | None = None,
) -> Any:
    """A waitress server for ``application`` (its ``run()`` serves until SystemExit) that
    refuses hostile clients before they cost anything:

    - a body over ``max_body`` is answered 413 from its Content-Length (a chunked one as
      soon as it passes the limit), before any of it is read or buffered to disk;
    - each request must arrive whole within ``request_timeout`` seconds of its first byte
      (the first within that of connecting), however it trickles in, and an idle kept-alive
      connection is closed after as long, so slow clients cannot hold every slot;
    - at most ``connection_limit`` client connections at once;
    - X-Forwarded-Proto and -Host are kept only on requests from ``trusted_proxy`` (an IP
      address), and only the values it added; from any other peer they are dropped.

    ConfigError for a ``trusted_proxy`` that is not an IP address; OSError when it cannot
    listen. Needs waitress (the web extra).
    """
    import waitress
    from waitress.channel import HTTPChannel
    from waitress.server import BaseWSGIServer

    proxy = _proxy_address(trusted_proxy) if trusted_proxy is not None else None

    class DeadlineChannel(HTTPChannel):  # type: ignore[misc]  # waitress ships no types
        """A connection that must deliver each request within ``request_timeout``."""

        #: when the request now arriving began (monotonic), None between requests
        request_began: float | None
        #: the partly received request that request_began times (waitress's parser)
        timed: object

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The first request is timed from connecting: a silent client is slow too.
            self.request_began, self.timed = time.monotonic(), _CONNECTED

        def received(self, data: bytes) -> bool:
            result: bool = super().received(data)
            if self.request is None:
                self.request_began, self.timed = None, None  # idle until the next one
            elif self.request is not self.timed:
                if self.timed is not _CONNECTED:
                    self.request_began = time.monotonic()
                self.timed = self.request
            return result

        def readable(self) -> bool:
            # Asked on every turn of the server's loop (at least once a second).
            began = self.request_began
            late = began is not None and time.monotonic() - began > request_timeout
            if late and not self.requests:
                self.will_close = True
            return bool(super().readable())

    forwarded: dict[str, Any] = {}
    if proxy is not None:
        forwarded = {
            "trusted_proxy": proxy,
            "trusted_proxy_count": 1,
            "trusted_proxy_headers": {"x-forwarded-proto", "x-forwarded-host"},
        }
    sockets: dict[int, Any] = {}
    server = waitress.create_server(
        application,
        map=sockets,
        host=host,
        port=port,
        threads=threads,
        # waitress refuses a body of this many bytes or more; the app, one over max_body.
        max_request_body_size=max_body + 1,
        max_request_header_size=MAX_HEADERS,
        channel_timeout=max(1, math.ceil(request_timeout)),
        cleanup_interval=1,
        connection_limit=connection_limit,
        clear_untrusted_proxy_headers=True,
        **forwarded,
    )
    listeners = [d for d in sockets.values() if isinstance(d, BaseWSGIServer)]
    for listener in listeners:
        listener.channel_class = DeadlineChannel
    # waitress counts its own listening sockets and wake-up pipes against the limit.
    listeners[0].adj.connection_limit = connection_limit + len(sockets)
    return server


def bind_address(bind: str) -> tuple[str, int]:
    """``--bind HOST:PORT`` (an IPv6 host in brackets) as (host, port); ConfigError
    otherwise."""
    host, _, port_text = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError("--bind: expected host:port, e.g. 127.0.0.1:8080")
    return host, int(port_text)


def request_timeout_seconds(text: str) -> float:
    """``--request-timeout``: a duration above 0 and at most MAX_REQUEST_TIMEOUT."""
    from resetctl.durations import parse_duration

    timeout = parse_duration(text, "--request-timeout")
    if not 0 < timeout <= MAX_REQUEST_TIMEOUT:
        raise ConfigError(
            f"--request-timeout: expected a duration in (0, {MAX_REQUEST_TIMEOUT:g}s]"
        )
    return timeout


#: What a new connection's first request is timed from (its connection, not a byte).
_CONNECTED = object()


def _proxy_address(text: str) -> str:
    """A trusted proxy's address as waitress compares it with a peer's (compressed)."""
    try:
        return ipaddress.ip_address(text.strip()).compressed
    except ValueError:
        raise ConfigError(
            "--trusted-proxy: expected the reverse proxy's IP address, e.g. 127.0.0.1"
        ) from None
