"""What the HTTP transports (Postmark, Twilio, Plivo, Mailgun) share about httpx: one way
to build their client, which failures prove nothing was sent, how long one call can take,
keeping a lookup's query string (an address or a number) out of httpx's log, and reading
a throttled reply's Retry-After."""

from __future__ import annotations

import email.utils
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

import httpx

from resetctl.transports.base import AmbiguousError, TransientError

#: Failures raised before the request could leave this host: nothing reached the
#: provider, so a create that met one is safe to send again under the same key.
NOT_SENT: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
)


def json_client(
    base_url: str,
    *,
    auth: httpx.Auth | None,
    connect_timeout: float,
    read_timeout: float,
    transport: httpx.BaseTransport | None = None,
    headers: Mapping[str, str] | None = None,
) -> httpx.Client:
    """A pooled client for a provider's JSON API, alike for every adapter.

    Every wait is bounded (a sweep works inside a cron minute, and ``call_timeout``
    adds these up), redirects are not followed (a credential or a recipient must not
    travel to another host), and ``headers`` (a provider's token) go before the shared
    Accept and User-Agent, which they cannot replace.
    """
    return httpx.Client(
        base_url=base_url,
        auth=auth,
        timeout=httpx.Timeout(
            connect=connect_timeout,
            read=read_timeout,
            write=read_timeout,
            pool=connect_timeout,
        ),
        headers={**(headers or {}), "Accept": "application/json", "User-Agent": "resetctl"},
        follow_redirects=False,
        transport=transport,
    )


def raise_call_failure(
    provider: str, logger: logging.Logger, exc: httpx.HTTPError, what: str, *, ambiguous: bool
) -> NoReturn:
    """Raise AmbiguousError (the provider may have acted on the request) or TransientError
    for a call httpx could not finish, as ``<provider>: <what> (<exception class>)``.

    Only the exception's class is kept: its text and request may quote the recipient,
    and the class is all a caller needs to act on it.
    """
    error = AmbiguousError if ambiguous else TransientError
    logger.debug("%s: %s (%s)", provider, what, type(exc).__name__)
    raise error(f"{provider}: {what} ({type(exc).__name__})") from None


@dataclass(frozen=True, slots=True)
class ProviderCalls:
    """How one adapter's calls fail: every error and log line is ``<provider>: …``, and
    whether a failure is transient or ambiguous is decided here, once for every adapter."""

    #: the message prefix, the adapter's own name (``twilio``)
    provider: str
    #: the adapter's logger, which gets a debug line for each failure
    logger: logging.Logger

    def create(self, send: Callable[[], httpx.Response], *, unreachable: str) -> httpx.Response:
        """The reply to ``send``, a request that creates something at the provider.

        A failure before the request left this host (NOT_SENT) is TransientError
        ``<provider>: <unreachable> (…)``; any other is AmbiguousError, as the request may
        have been read and acted on before the reply was lost.
        """
        try:
            return send()
        except NOT_SENT as exc:
            raise_call_failure(self.provider, self.logger, exc, unreachable, ambiguous=False)
        except httpx.HTTPError as exc:
            raise_call_failure(
                self.provider, self.logger, exc, "no reply after sending", ambiguous=True
            )

    def read(self, send: Callable[[], httpx.Response], *, what: str) -> httpx.Response:
        """The reply to ``send``, a request that only reads; any failure is TransientError
        ``<provider>: <what> (…)``: a read changes nothing, so trying again is safe."""
        try:
            return send()
        except httpx.HTTPError as exc:
            raise_call_failure(self.provider, self.logger, exc, what, ambiguous=False)


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    """The reply's body when it is a JSON object; None when it is not JSON or not an
    object (a provider's error page, a gateway's HTML)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def int_field(body: Mapping[str, Any] | None, key: str) -> int | None:
    """``body[key]`` when it is an integer (a JSON true is not one), else None: how a
    provider's numeric error code is read without trusting the reply's shape."""
    value = None if body is None else body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def bounded_waits(base_url: str) -> int:
    """How many waits of one request httpx bounds: the TCP connect and, over https, the
    TLS handshake (each under the connect time-out), then writing the request and reading
    the reply (each under the read time-out)."""
    return (2 if urlsplit(base_url).scheme == "https" else 1) + 2


def http_call_timeout(base_url: str, connect_timeout: float, read_timeout: float) -> float:
    """The longest one call through an httpx client with these time-outs can take.

    httpx bounds each wait, not the call (see :func:`bounded_waits`). A pool wait cannot
    happen: one thread uses the client, and every reply is read in full. Outside these
    bounds: the DNS lookup, a connect per address a name resolves to, and a reply
    trickled over many reads, none of which a provider that answers normally makes last.
    """
    handshakes = bounded_waits(base_url) - 2
    return handshakes * connect_timeout + 2 * read_timeout


class _QueryRedaction(logging.Filter):
    """Drops the query string from httpx's request log line (httpx logs every request
    URL at INFO) for the paths whose queries hold a recipient."""

    def __init__(self, secret_path: Callable[[str], bool]) -> None:
        super().__init__()
        self._secret_path = secret_path

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self._redacted(arg) for arg in record.args)
        return True

    def _redacted(self, arg: object) -> object:
        if isinstance(arg, httpx.URL) and arg.query and self._secret_path(arg.path):
            return f"{arg.copy_with(query=None)}?<redacted>"
        return arg


def redact_queries(secret_path: Callable[[str], bool]) -> None:
    """Keep the query strings of requests to ``secret_path`` paths out of httpx's log."""
    logging.getLogger("httpx").addFilter(_QueryRedaction(secret_path))


#: The longest Retry-After honoured: a provider asking for more is down, not busy.
MAX_RETRY_AFTER = 300.0


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delay-seconds or an HTTP date, RFC 9110
    10.2.3), within 0 and MAX_RETRY_AFTER; None when absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    seconds: float | None = None
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if moment.tzinfo is None:
            return None
        seconds = moment.timestamp() - now
    return min(MAX_RETRY_AFTER, max(0.0, seconds))
