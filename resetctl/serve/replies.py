"""What ``resetctl serve`` answers: a status, a body and its headers, and the name of the
notice it was about (for the audit line). JSON bodies are one line, as the CLI's
``--json`` lines are; every answer says not to be cached or sniffed (it is behind a token)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

JSON = "application/json"
HTML = "text/html; charset=utf-8"
#: The Prometheus text exposition format, as node_exporter's textfile holds it.
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

#: Headers on every answer: it is for the caller alone, and is what it says it is.
COMMON_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)


class Reply(NamedTuple):
    """One answer, before it is written."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: tuple[tuple[str, str], ...] = ()
    #: the notice the request was about, for the audit line (never a contact or URL)
    notice_id: str | None = None


def json_reply(
    status: int,
    document: Any,
    *,
    headers: tuple[tuple[str, str], ...] = (),
    notice_id: str | None = None,
) -> Reply:
    """``document`` as one line of JSON (what ``json.dumps`` gives, as the CLI prints it)."""
    return Reply(status, (json.dumps(document) + "\n").encode(), JSON, headers, notice_id)


def problem_reply(
    status: int,
    problem: str,
    *,
    field: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Reply:
    """An error: ``{"error": <the status's name>, "problem": …}``, with the ``field`` it is
    about when there is one. The problem never quotes what the request carried."""
    document: dict[str, Any] = {"error": error_name(status), "problem": problem}
    if field is not None:
        document["field"] = field
    return json_reply(status, document, headers=headers)


#: The statuses serve answers, by their RFC 9110 names (not Python's, which change).
PHRASES = {
    200: "OK",
    201: "Created",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def error_name(status: int) -> str:
    """``not_found`` for 404: the status's name as a word a program can match."""
    return PHRASES[status].lower().replace(" ", "_")


def status_line(status: int) -> str:
    """``404 Not Found``."""
    return f"{status} {PHRASES[status]}"
