"""What the HTTP transports (Postmark, Twilio) share about httpx: how long one call can
take, keeping a lookup's query string (an address or a number) out of httpx's log, and
reading a throttled reply's Retry-After."""

from __future__ import annotations

import email.utils
import logging
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import httpx


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
