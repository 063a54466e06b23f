"""A fake Mailgun on loopback: the Messages API, the Events API (filters, time range,
paging) and webhooks signed as Mailgun signs them, built from Mailgun's public docs:

- https://documentation.mailgun.com/docs/mailgun/api-reference/send/mailgun/messages
  (POST /v3/{domain_name}/messages: multipart/form-data, the documented fields and their
  enums, from/to/subject required, one of text/html, o:/h:/v:/t: options at most 16 KB,
  the 200 reply ``{"id": "<...>", "message": "Queued. Thank you."}``, 400/401/429/500)
- https://documentation.mailgun.com/docs/mailgun/user-manual/sending-messages/send-http
  (basic auth ``api`` and the API key; the US and EU base URLs)
- https://documentation.mailgun.com/docs/mailgun/user-manual/sending-messages/send-attachments
  ("Attaching Metadata": ``v:`` variables come back as ``user-variables`` in events and
  webhooks)
- https://documentation.mailgun.com/docs/mailgun/api-reference/send/mailgun/events/get-v3-domain_name-events
  (GET /v3/{domain_name}/events: its query parameters, limit at most 300, items and paging)
- https://documentation.mailgun.com/docs/mailgun/user-manual/events/ (time range: a begin
  and either an end or a direction; next and previous page URLs always returned; event
  types; event structure) and .../events/event-polling (events become retrievable late
  and out of order: ``events_lag``)
- https://documentation.mailgun.com/docs/mailgun/user-manual/webhooks/securing-webhooks
  (``signature`` {timestamp, token, signature}: hex HMAC-SHA256 of timestamp + token
  under the webhook signing key, beside ``event-data``)
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import httpx
from providers_http import FakeProvider, ProviderHandler

from resetctl.transports.base import CallbackRequest

#: Distinctive: no exception, repr or log line may hold either key.
API_KEY = "key-mailgun-canary-3e9a77c1d05b"
SIGNING_KEY = "signing-canary-51c0aa7e94f2b6d3"
DOMAIN = "mg.acme.example"
SENDER = "Acme <no-reply@mg.acme.example>"
WEBHOOK_URL = "https://hooks.acme.example/mailgun"
#: The documented POST /messages fields (``h:`` and ``v:`` prefixes aside). Mailgun
#: ignores unknown ones, so a misspelt option would silently do nothing.
SEND_FIELDS = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "subject",
        "text",
        "html",
        "amp-html",
        "attachment",
        "inline",
        "template",
        "t:version",
        "t:text",
        "t:variables",
        "o:tag",
        "o:dkim",
        "o:secondary-dkim",
        "o:secondary-dkim-public",
        "o:deliverytime",
        "o:deliver-within",
        "o:deliverytime-optimize-period",
        "o:time-zone-localize",
        "o:testmode",
        "o:tracking",
        "o:tracking-clicks",
        "o:tracking-opens",
        "o:require-tls",
        "o:skip-verification",
        "o:sending-ip",
        "o:sending-ip-pool",
        "o:tracking-pixel-location-top",
        "o:archive-to",
        "o:suppress-headers",
        "recipient-variables",
    }
)
#: Fields the reference types as arrays: only these may repeat.
ARRAY_FIELDS = frozenset({"to", "cc", "bcc", "attachment", "inline", "o:tag"})
ENUMS = {
    "o:tracking": {"yes", "no", "true", "false", "htmlonly"},
    "o:tracking-clicks": {"yes", "no", "true", "false", "htmlonly"},
    "o:tracking-opens": {"yes", "no", "true", "false"},
}
OPTIONS_LIMIT = 16 * 1024
#: The Events API's documented query parameters.
EVENT_PARAMETERS = frozenset(
    {
        "begin",
        "end",
        "ascending",
        "limit",
        "event",
        "list",
        "attachment",
        "from",
        "message-id",
        "subject",
        "to",
        "size",
        "recipient",
        "recipients",
        "tags",
        "severity",
    }
)
#: The filters this fake applies; another documented one would be silently ignored here.
APPLIED_FILTERS = frozenset({"event", "message-id", "recipient"})


def reference_signature(timestamp: str, token: str, key: str) -> str:
    """Mailgun's documented webhook signature, written here without the code under test."""
    mac = hmac.new(key.encode("utf-8"), (timestamp + token).encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()


def _form_fields(content_type: str, body: bytes) -> list[tuple[str, str, bool]] | None:
    """(name, value, has a filename) of each part of a multipart/form-data body."""
    parsed = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not parsed.is_multipart():
        return None
    fields = []
    for part in parsed.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if not isinstance(name, str) or not isinstance(payload, bytes):
            return None
        fields.append((name, payload.decode("utf-8"), part.get_filename() is not None))
    return fields


class FakeMailgun(FakeProvider):
    """Mailgun's send and events endpoints on 127.0.0.1, and its webhooks.

    ``script`` sets how the next sends end: "accept", "reject" (400 quoting the address),
    "forbidden" (403), "rate-limit" (429 with ``retry_after``, nothing created), "error"
    (500, nothing created), "created-503" (queue it, then answer 503), "hang-up" (queue
    it, then close without a reply), "stall" (queue it, reply only after the client's
    read time-out) or "no-id" (queue it, answer 200 without an id). ``events_outcomes``
    scripts events reads: "error" (500), "rate-limit" (429), "hang-up" or "stall". An
    event becomes retrievable ``events_lag`` seconds (on ``clock``) after it happened.
    With ``filters_events`` off, the events read ignores its filters (a careless index),
    so only a transport that checks what it finds is right.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.events_lag = 0.0
        self.retry_after: str | None = "7"
        self.outcomes: list[str] = []
        self.events_outcomes: list[str] = []
        self.filters_events = True
        #: every queued message by id (no brackets): its form fields (name -> value)
        self.sent: dict[str, dict[str, str]] = {}
        #: every event, in the order it happened
        self.events: list[dict[str, Any]] = []
        #: every events query, as sent (name -> values)
        self.queries: list[dict[str, list[str]]] = []
        #: request checks that failed: each one is a transport bug
        self.problems: list[str] = []
        self._serial = 0
        super().__init__()

    def script(self, *outcomes: str) -> None:
        with self.lock:
            self.outcomes.extend(outcomes)

    def _next_outcome(self) -> str:
        with self.lock:
            return self.outcomes.pop(0) if self.outcomes else "accept"

    def queue(self, fields: dict[str, str], *, at: float | None = None) -> str:
        """Take a message (as a send would); its id without brackets."""
        when = self.clock() if at is None else at
        with self.lock:
            self._serial += 1
            stamp = datetime.fromtimestamp(when, UTC).strftime("%Y%m%d%H%M%S")
            message_id = f"{stamp}.{self._serial}.{secrets.token_hex(8).upper()}@{DOMAIN}"
            self.sent[message_id] = fields
        self.add_event(message_id, "accepted", at=when)
        return message_id

    def event_data(
        self, message_id: str, kind: str, severity: str | None = None, at: float | None = None
    ) -> dict[str, Any]:
        """One event about a queued message, shaped as the Events API and webhooks give it."""
        fields = self.sent[message_id]
        variables = {k[2:]: v for k, v in fields.items() if k.startswith("v:")}
        event: dict[str, Any] = {
            "id": uuid.uuid4().hex[:22],
            "event": kind,
            "timestamp": self.clock() if at is None else at,
            "log-level": "info" if kind != "failed" else "error",
            "recipient": fields["to"],
            "recipient-domain": fields["to"].rpartition("@")[2],
            "envelope": {"sender": f"bounce@{DOMAIN}", "transport": "smtp"},
            "flags": {"is-authenticated": True, "is-test-mode": False},
            "message": {
                "headers": {
                    "to": fields["to"],
                    "message-id": message_id,
                    "from": fields["from"],
                    "subject": fields.get("subject", ""),
                },
                "attachments": [],
                "size": len(fields.get("text", "")),
            },
            "tags": [],
            "campaigns": [],
            "user-variables": variables,
        }
        if severity is not None:
            event["severity"] = severity
            # Mailgun quotes the recipient's server, which names the address.
            code = 550 if severity == "permanent" else 451
            event["reason"] = "bounce" if severity == "permanent" else "generic"
            event["delivery-status"] = {
                "code": code,
                "message": f"{code} mailbox {fields['to']} unavailable",
                "attempt-no": 1,
            }
        return event

    def add_event(
        self, message_id: str, kind: str, severity: str | None = None, at: float | None = None
    ) -> dict[str, Any]:
        event = self.event_data(message_id, kind, severity, at)
        with self.lock:
            event["_visible_at"] = self.clock() + self.events_lag
            self.events.append(event)
        return event

    def webhook(
        self,
        event: dict[str, Any],
        *,
        timestamp: str | None = None,
        token: str | None = None,
        key: str = SIGNING_KEY,
    ) -> CallbackRequest:
        """A webhook request carrying ``event``, signed as Mailgun signs one."""
        timestamp = timestamp or str(int(self.clock()))
        token = token or secrets.token_hex(25)
        data = {k: v for k, v in event.items() if not k.startswith("_")}
        body = {
            "signature": {
                "timestamp": timestamp,
                "token": token,
                "signature": reference_signature(timestamp, token, key),
            },
            "event-data": data,
        }
        return CallbackRequest(
            WEBHOOK_URL,
            {"content-type": "application/json", "user-agent": "mailgun/treq-16.12.0"},
            json.dumps(body).encode("utf-8"),
        )

    def _authorized(self, handler: ProviderHandler) -> bool:
        expected = "Basic " + base64.b64encode(f"api:{API_KEY}".encode()).decode()
        if handler.headers.get("Authorization") == expected:
            return True
        handler.reply(401, "Forbidden")
        return False

    def check_send(self, content_type: str, raw: bytes) -> tuple[dict[str, str], str | None]:
        """The send's fields, and what is wrong with it, if anything."""
        if not content_type.startswith("multipart/form-data"):
            return {}, "Content-Type is not multipart/form-data"
        parts = _form_fields(content_type, raw)
        if parts is None:
            return {}, "body is not multipart form fields"
        fields: dict[str, str] = {}
        for name, value, has_filename in parts:
            if has_filename:
                return fields, f"{name}: sent as a file"
            if name not in SEND_FIELDS and not name.startswith(("h:", "v:")):
                return fields, f"{name}: not a send field"
            if name in fields and name not in ARRAY_FIELDS:
                return fields, f"{name}: sent twice"
            if name in ENUMS and value not in ENUMS[name]:
                return fields, f"{name}: {value!r} is not one of its values"
            fields[name] = value
        missing = [f for f in ("from", "to", "subject") if not fields.get(f)]
        if missing:
            return fields, f"missing {missing}"
        if not (fields.get("text") or fields.get("html")):
            return fields, "neither text nor html"
        options = sum(len(k) + len(v) for k, v in fields.items() if k[:2] in ("o:", "h:", "v:"))
        if options > OPTIONS_LIMIT:
            return fields, "send options over 16 KB"
        if any(fields.get(f"o:tracking{kind}") != "no" for kind in ("", "-clicks", "-opens")):
            return fields, "tracking is on"
        return fields, None

    def handle_post(self, handler: ProviderHandler) -> None:
        raw = handler.read_body()
        if handler.path != f"/v3/{DOMAIN}/messages":
            handler.reply(404, {"message": "Domain not found"})
            return
        if not self._authorized(handler):
            return
        fields, problem = self.check_send(handler.headers.get("Content-Type", ""), raw)
        if problem is not None:
            self.problems.append(problem)
            handler.reply(400, {"message": f"test server: {problem}"})
            return
        outcome = self._next_outcome()
        if outcome in ("accept", "created-503", "hang-up", "stall", "no-id"):
            message_id = self.queue(fields)
            if outcome == "created-503":
                handler.reply(503, "<html><body>503 Service Unavailable</body></html>")
            elif outcome == "hang-up":
                handler.drop()  # queued; the reply is lost with the connection
            elif outcome == "no-id":
                handler.reply(200, {"message": "Queued. Thank you."})
            else:
                if outcome == "stall":
                    handler.hold()
                handler.reply(200, {"id": f"<{message_id}>", "message": "Queued. Thank you."})
        elif outcome == "reject":
            to = fields["to"]
            handler.reply(400, {"message": f"'to' parameter is not a valid address: {to}"})
        elif outcome == "forbidden":
            handler.reply(403, {"message": f"Domain {DOMAIN} is not allowed to send"})
        elif outcome == "rate-limit":
            headers = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            message = f"Domain {DOMAIN} is not allowed to send: rate limit exceeded"
            handler.reply(429, {"message": message}, headers)
        elif outcome == "error":
            handler.reply(500, {"message": "Internal Server Error"})
        else:
            raise AssertionError(f"unknown outcome {outcome!r}")

    def handle_get(self, handler: ProviderHandler) -> None:
        if not self._authorized(handler):
            return
        path, _, query = handler.path.partition("?")
        events_path = f"/v3/{DOMAIN}/events"
        if path == events_path:
            self._events(handler, parse_qs(query, keep_blank_values=True), 0)
        elif path.startswith(events_path + "/") and not query:
            # A next or previous page URL: the query and offset it stands for.
            try:
                page = json.loads(base64.urlsafe_b64decode(path[len(events_path) + 1 :]))
            except ValueError:
                handler.reply(400, {"message": "invalid page token"})
                return
            self._events(handler, page["query"], page["offset"])
        else:
            handler.reply(404, {"message": "not found"})

    def _events(self, handler: ProviderHandler, query: dict[str, list[str]], offset: int) -> None:
        self.queries.append(query)
        problem = _events_problem(query)
        if problem is not None:
            self.problems.append(problem)
            handler.reply(400, {"message": f"test server: {problem}"})
            return
        with self.lock:
            outcome = self.events_outcomes.pop(0) if self.events_outcomes else "ok"
        if outcome == "error":
            handler.reply(500, {"message": "Internal Server Error"})
            return
        if outcome == "rate-limit":
            handler.reply(429, {"message": "Too many requests"}, {"Retry-After": "3"})
            return
        if outcome == "hang-up":
            handler.drop()
            return
        if outcome == "stall":
            handler.hold()
        value = {name: values[0] for name, values in query.items()}
        begin = float(value["begin"])
        ascending = value.get(
            "ascending", "yes" if float(value.get("end", "inf")) > begin else "no"
        )
        end = float(value.get("end", "inf" if ascending == "yes" else "-inf"))
        low, high = min(begin, end), max(begin, end)
        now = self.clock()
        with self.lock:
            listed = [
                e
                for e in self.events
                if e["_visible_at"] <= now
                and low <= e["timestamp"] <= high
                and (not self.filters_events or _matches(e, value))
            ]
        listed.sort(key=lambda e: e["timestamp"], reverse=ascending == "no")
        limit = int(value.get("limit", "300"))
        page = [{k: v for k, v in e.items() if not k.startswith("_")} for e in listed]
        base = f"{self.base_url}/v3/{DOMAIN}/events/"

        def page_url(at: int) -> str:
            token = json.dumps({"query": query, "offset": max(0, at)}).encode()
            return base + base64.urlsafe_b64encode(token).decode()

        handler.reply(
            200,
            {
                "items": page[offset : offset + limit],
                "paging": {"next": page_url(offset + limit), "previous": page_url(offset - limit)},
            },
        )

    def page(self, url: str) -> dict[str, Any]:
        """Follow a paging URL as a client would (for tests of the fake's paging)."""
        response = httpx.get(url, auth=("api", API_KEY))
        body: dict[str, Any] = response.json()
        return body


def _matches(event: dict[str, Any], value: dict[str, str]) -> bool:
    headers = event["message"]["headers"]
    return (
        ("event" not in value or event["event"] == value["event"])
        and ("message-id" not in value or headers["message-id"] == value["message-id"])
        and (
            "recipient" not in value
            or event["recipient"].casefold() == value["recipient"].casefold()
        )
    )


def _events_problem(query: dict[str, list[str]]) -> str | None:
    """What is wrong with an events query, if anything (Mailgun's documented rules)."""
    for name, values in query.items():
        if name not in EVENT_PARAMETERS:
            return f"{name}: not an events query parameter"
        if len(values) != 1:
            return f"{name}: sent {len(values)} times"
        if name not in ("begin", "end", "ascending", "limit") and name not in APPLIED_FILTERS:
            return f"{name}: a filter this fake does not apply"
    value = {name: values[0] for name, values in query.items()}
    for name in ("begin", "end"):
        if name in value:
            try:
                float(value[name])
            except ValueError:
                return f"{name}: not epoch seconds"
    if "begin" not in value:
        return "begin is required (a time range starts at a timestamp)"
    if "end" not in value and "ascending" not in value:
        return "give an end or a direction (ascending)"
    if value.get("ascending", "yes") not in ("yes", "no"):
        return "ascending: must be yes or no"
    if "end" in value and "ascending" in value:
        forward = float(value["end"]) >= float(value["begin"])
        if forward != (value["ascending"] == "yes"):
            return "ascending disagrees with begin and end"
    limit = value.get("limit", "300")
    if not limit.isdigit() or not 1 <= int(limit) <= 300:
        return "limit: must be 1 to 300"
    return None
