"""A fake Plivo on loopback: Message send, fetch and list, and message status callbacks
signed as Plivo signs them. Every request is checked against Plivo's public
documentation, as strictly as the pages allow:

- Send a message: https://www.plivo.com/docs/messaging/api/message/send-a-message/
  (src or powerpack_uuid, never both; dst; text; type; url and method; the 202 reply
  with a ``message_uuid`` list) and the message expiry article,
  https://support.plivo.com/hc/en-us/articles/14814454609561-Message-Expiry
  (``message_expiry``, 5 to 10,799 seconds).
- The Message object and its retrieval: https://www.plivo.com/docs/messaging/api/messages
  (message_uuid, message_time, message_direction, message_state, from_number,
  to_number, error_code, ...: no text).
- List all messages: https://www.plivo.com/docs/messaging/api/message/list-all-messages/
  (the filters, times in UTC ``YYYY-MM-DD HH:MM[:ss[.uuuuuu]]``, ``to_number`` and
  ``from_number`` in E.164, ``limit`` at most 20, ``offset``, newest first, ``meta``).
- API responses: https://docs.plivo.com/docs/messaging/api/response (``api_id``, the
  ``error`` text, 401, 404, 429).
- Message status callbacks:
  https://docs.plivo.com/docs/messaging/api/message/message-status-callbacks (the form
  fields) and request validation, https://docs.plivo.com/docs/voice/xml/request/validation
  (X-Plivo-Signature-V3 and its nonce; what is signed follows Plivo's server SDKs, e.g.
  plivo-python's ``plivo/utils/signature_v3.py``, re-written here on its own).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
from providers_http import FakeProvider, ProviderHandler

from resetctl.transports.base import CallbackRequest, TransportContext
from resetctl.transports.plivo import PlivoTransport

AUTH_ID = "MAODU4NZNHYJM2MTU2MZ"
#: Distinctive: no exception, repr or log line may hold it.
AUTH_TOKEN = "plivo-token-canary-5f20b1"
SENDER = "+15005550006"
POWERPACK = "0fcb9b4e-7a4f-4e55-9b8e-4b0c6a3b1f2d"
CALLBACK_URL = "https://hooks.example/plivo/status"

SEND_FIELDS = frozenset(
    {
        "src",
        "powerpack_uuid",
        "dst",
        "text",
        "type",
        "url",
        "method",
        "log",
        "trackable",
        "media_urls",
        "media_ids",
        "message_expiry",
        "dlt_entity_id",
        "dlt_template_id",
        "dlt_template_category",
    }
)
LIST_FILTERS = frozenset(
    {
        "subaccount",
        "message_direction",
        "message_time",
        "message_time__gt",
        "message_time__gte",
        "message_time__lt",
        "message_time__lte",
        "message_state",
        "message_type",
        "error_code",
        "powerpack_id",
        "from_number",
        "to_number",
        "limit",
        "offset",
        "destination_country_iso2",
        "tendlc_registration_status",
        "tendlc_campaign_id",
        "conversation_id",
        "conversation_origin",
    }
)
#: Every message_state the Message object documents (and ``rejected``, which the status
#: callbacks and the SDKs know).
DOCUMENTED_STATES = frozenset(
    {"queued", "sent", "failed", "delivered", "undelivered", "read", "rejected", "received"}
)
EXPIRY_RANGE = range(5, 10_800)
_UUID = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")
_E164 = re.compile(r"\+[1-9]\d{6,14}")
_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d(\.\d{1,6})?)?")
_SANITIZE = re.compile(r"[^A-Za-z0-9]")


def plivo_context(table: dict[str, Any], store: Any, clock: Any, **secrets: str) -> Any:
    """A [plivo] instance's context with this fake's credentials (a secret given as ""
    is left unset)."""
    given = {"PLIVO_AUTH_ID": AUTH_ID, "PLIVO_AUTH_TOKEN": AUTH_TOKEN, **secrets}
    given = {name: value for name, value in given.items() if value}
    return TransportContext("plivo", "sms", table, given.get, store, clock)


def mock_transport(clock: Any, reply: Callable[[httpx.Request], httpx.Response]) -> PlivoTransport:
    """A transport whose every request gets ``reply`` (no socket at all)."""
    return PlivoTransport(
        AUTH_ID, AUTH_TOKEN, sender=SENDER, clock=clock, transport=httpx.MockTransport(reply)
    )


def sanitized(value: str) -> str:
    """A number or sender id as Plivo stores it: letters and digits only."""
    return _SANITIZE.sub("", value)


def _error(message: str) -> dict[str, Any]:
    """Plivo's error body: an api_id and free text."""
    return {"api_id": str(uuid.uuid4()), "error": message}


def reference_signed_base(url: str, params: list[tuple[str, str]]) -> str:
    """What Plivo signs of a POST, written from its SDKs' description, independently of
    resetctl: scheme://host/path, ``?`` and the sorted decoded query, ``.`` when a body
    follows a query, then sorted name+value pairs of the body."""
    parts = urlsplit(url)
    signed = parts.scheme + "://" + parts.netloc + parts.path
    query = parse_qs(parts.query, keep_blank_values=True)
    pairs = [f"{k}={v}" for k in sorted(query) for v in sorted(query[k])]
    body: dict[str, list[str]] = {}
    for name, value in params:
        body.setdefault(name, []).append(value)
    if pairs or body:
        signed += "?" + "&".join(pairs)
    if pairs and body:
        signed += "."
    for name in sorted(body):
        for value in sorted(body[name]):
            signed += name + value
    return signed


def reference_signature(url: str, params: list[tuple[str, str]], nonce: str, token: str) -> str:
    """X-Plivo-Signature-V3 as Plivo computes it (see :func:`reference_signed_base`)."""
    message = (reference_signed_base(url, params) + "." + nonce).encode("utf-8")
    return base64.b64encode(
        hmac.new(token.encode("utf-8"), message, hashlib.sha256).digest()
    ).decode()


class FakePlivo(FakeProvider):
    """Plivo's Message send, fetch and list on 127.0.0.1.

    ``outcomes`` scripts the next sends (default accept): "reject" (400, its text quoting
    the dst as Plivo's may), "throttle" (429, nothing created), "error" (500, nothing
    created), "created-503" (create, then answer 503), "hangup" (create, then close
    without a reply) or "stall" (create, then reply after the client's read time-out).
    ``fetch_outcomes`` and ``list_outcomes`` script reads: "error" (503), "throttle",
    "hangup" or "stall". Anything off the documentation lands in ``violations``.
    ``clock`` stamps message_time (shown at ``utc_offset``); a message shows in lists
    only ``list_lag`` seconds after it was created.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.list_lag = 0.0
        self.utc_offset = timedelta(0)
        #: the Retry-After a throttled request answers with (None: no header)
        self.retry_after: str | None = None
        self.outcomes: list[str] = []
        self.fetch_outcomes: list[str] = []
        self.list_outcomes: list[str] = []
        #: every send body, as parsed JSON
        self.requests: list[dict[str, Any]] = []
        #: every list query, as sent (name -> values)
        self.list_queries: list[dict[str, list[str]]] = []
        self.messages: dict[str, dict[str, Any]] = {}
        #: what each message was sent with (text, url): Plivo keeps it, never shows it
        self.sent: dict[str, dict[str, Any]] = {}
        self.created_at: dict[str, float] = {}
        self.violations: list[str] = []
        self.hits = 0
        super().__init__()

    def set_status(self, message_uuid: str, state: str, error_code: str | None = None) -> None:
        self.messages[message_uuid]["message_state"] = state
        self.messages[message_uuid]["error_code"] = error_code

    def add_message(
        self,
        to: str,
        *,
        created: float,
        sender: str | None = SENDER,
        powerpack: str | None = None,
        **fields: Any,
    ) -> str:
        """A message Plivo already holds (sent earlier, or by someone else); its uuid."""
        send = {"dst": to, "text": "Acme: something else"}
        send.update({"src": sender} if powerpack is None else {"powerpack_uuid": powerpack})
        record = self._create(send, created)
        record.update(fields)
        return str(record["message_uuid"])

    def _violate(self, where: str, problems: list[str]) -> None:
        with self.lock:
            self.violations.extend(f"{where}: {p}" for p in problems)

    def _authorized(self, handler: ProviderHandler, account: str) -> bool:
        expected = base64.b64encode(f"{AUTH_ID}:{AUTH_TOKEN}".encode()).decode()
        if handler.headers.get("Authorization") == f"Basic {expected}" and account == AUTH_ID:
            return True
        handler.reply(401, _error("authentication failed"))
        return False

    def _stamp(self, moment: float) -> str:
        zone = timezone(self.utc_offset)
        return datetime.fromtimestamp(moment, zone).isoformat(sep=" ", timespec="microseconds")

    def handle_post(self, handler: ProviderHandler) -> None:
        self.hits += 1
        raw = handler.read_body()
        match = re.fullmatch(r"/v1/Account/([^/]+)/Message/", handler.path)
        if match is None:
            self._violate("POST", [f"unexpected path {handler.path}"])
            handler.reply(404, _error("not found"))
            return
        if not self._authorized(handler, match[1]):
            return
        problems: list[str] = []
        content_type = handler.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type != "application/json":
            problems.append(f"Content-Type {content_type!r}, not application/json")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {}
            problems.append("body is not a JSON object")
        problems += _send_problems(body)
        self.requests.append(body)
        if problems:
            self._violate("POST Message", problems)
            handler.reply(400, _error("; ".join(problems)))
            return
        outcome = self.outcomes.pop(0) if self.outcomes else "accept"
        if outcome == "reject":
            handler.reply(400, _error(f"{body['dst']} is not a valid destination number"))
        elif outcome == "throttle":
            wait = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            handler.reply(429, _error("too many requests"), wait)
        elif outcome == "error":
            handler.reply(500, _error("server error"))
        else:
            record = self._create(body, self.clock())
            if outcome == "created-503":
                handler.reply(503, "<html><body>503 Service Unavailable</body></html>")
                return
            if outcome == "hangup":
                handler.drop()
                return
            if outcome == "stall":
                handler.hold()
            reply = {
                "api_id": str(uuid.uuid4()),
                "message": "message(s) queued",
                "message_uuid": [record["message_uuid"]],
            }
            handler.reply(202, reply)

    def _create(self, body: dict[str, Any], created: float) -> dict[str, Any]:
        message_uuid = str(uuid.uuid4())
        powerpack = body.get("powerpack_uuid")
        # A Powerpack picks the number from its pool: the record shows that one.
        sender = "14155550100" if powerpack else sanitized(str(body["src"]))
        record = {
            "error_code": None,
            "from_number": sender,
            "message_direction": "outbound",
            "message_state": "queued",
            "message_time": self._stamp(created),
            "message_type": body.get("type", "sms"),
            "message_uuid": message_uuid,
            "resource_uri": f"/v1/Account/{AUTH_ID}/Message/{message_uuid}/",
            "to_number": sanitized(str(body["dst"])),
            "total_amount": "0.00000",
            "total_rate": "0.00500",
            "units": 1,
            "powerpack_id": powerpack,
            "requester_ip": "127.0.0.1",
            "is_domestic": False,
            "replaced_sender": "",
            "error_message": "",
        }
        with self.lock:
            self.messages[message_uuid] = record
            self.sent[message_uuid] = {"text": body.get("text"), "url": body.get("url")}
            self.created_at[message_uuid] = created
        return record

    def handle_get(self, handler: ProviderHandler) -> None:
        self.hits += 1
        handler.read_body()
        path, _, query = handler.path.partition("?")
        listed = re.fullmatch(r"/v1/Account/([^/]+)/Message/", path)
        if listed is not None:
            self._list(handler, listed[1], parse_qs(query, keep_blank_values=True))
            return
        match = re.fullmatch(r"/v1/Account/([^/]+)/Message/([^/]+)/", path)
        if match is None or query:
            self._violate("GET", [f"unexpected path {handler.path}"])
            handler.reply(404, _error("not found"))
            return
        if not self._authorized(handler, match[1]):
            return
        outcome = self.fetch_outcomes.pop(0) if self.fetch_outcomes else "ok"
        if self._failed_read(handler, outcome):
            return
        record = self.messages.get(match[2])
        if record is None:
            handler.reply(404, _error("not found"))
        else:
            handler.reply(200, {"api_id": str(uuid.uuid4()), **record})

    def _failed_read(self, handler: ProviderHandler, outcome: str) -> bool:
        if outcome == "hangup":
            handler.drop()
        elif outcome == "error":
            handler.reply(503, _error("service unavailable"))
        elif outcome == "throttle":
            wait = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            handler.reply(429, _error("too many requests"), wait)
        elif outcome == "stall":
            handler.hold()
            handler.reply(200, {})
        else:
            return False
        return True

    def _list(self, handler: ProviderHandler, account: str, query: dict[str, list[str]]) -> None:
        if not self._authorized(handler, account):
            return
        self.list_queries.append(query)
        problems, filters = _list_problems(query)
        if problems:
            self._violate("GET Message list", problems)
            handler.reply(400, _error("; ".join(problems)))
            return
        outcome = self.list_outcomes.pop(0) if self.list_outcomes else "ok"
        if self._failed_read(handler, outcome):
            return
        now = self.clock()
        # Without a time filter Plivo lists the last 24 hours.
        earliest = filters.get("message_time__gte", now - 86_400)
        with self.lock:
            found = [
                (self.created_at[m["message_uuid"]], m)
                for m in self.messages.values()
                if self.created_at[m["message_uuid"]] + self.list_lag <= now
                and self.created_at[m["message_uuid"]] >= earliest
                and _matches(m, filters)
            ]
        found.sort(key=lambda pair: pair[0], reverse=True)  # newest first
        limit, offset = filters.get("limit", 20), filters.get("offset", 0)
        page = [m for _, m in found[offset : offset + limit]]
        flat = [(k, v) for k, vs in query.items() for v in vs if k != "offset"]
        after = offset + limit
        following = urlencode([*flat, ("offset", str(after))]) if after < len(found) else None
        meta = {
            "limit": limit,
            "next": None if following is None else f"/v1/Account/{AUTH_ID}/Message/?{following}",
            "offset": offset,
            "previous": None,
            "total_count": len(found),
        }
        handler.reply(200, {"api_id": str(uuid.uuid4()), "meta": meta, "objects": page})

    def callback(
        self,
        message_uuid: str,
        status: str | None = None,
        *,
        nonce: str = "26341902867340612281",
        error_code: str = "",
    ) -> CallbackRequest:
        """The status callback Plivo posts for a message to the ``url`` it was sent
        with, in Plivo's field order, signed with X-Plivo-Signature-V3."""
        record, sent = self.messages[message_uuid], self.sent[message_uuid]
        url = sent["url"]
        assert isinstance(url, str), "the message was sent without a callback url"
        stamp = record["message_time"][:26]
        fields = [
            ("ErrorCode", error_code),
            ("From", record["from_number"]),
            ("MCC", "505"),
            ("MNC", "01"),
            ("MessageTime", stamp),
            ("MessageUUID", message_uuid),
            ("ParentMessageUUID", message_uuid),
            ("PartInfo", "1 of 1"),
            ("PowerpackUUID", record["powerpack_id"] or ""),
            ("QueuedTime", stamp),
            ("Sequence", str(len(status or record["message_state"]))),
            ("Status", status or record["message_state"]),
            ("To", record["to_number"]),
            ("TotalAmount", record["total_amount"]),
            ("TotalRate", record["total_rate"]),
            ("Type", "sms"),
            ("Units", str(record["units"])),
        ]
        body = urlencode(fields).encode()
        headers = {
            "content-type": "application/x-www-form-urlencoded",
            "x-plivo-signature-v3": reference_signature(url, fields, nonce, AUTH_TOKEN),
            "x-plivo-signature-v3-nonce": nonce,
            # V2 signs only the URL's path and the nonce: sent, but proves nothing.
            "x-plivo-signature-v2-nonce": nonce,
        }
        return CallbackRequest(url, headers, body)


def _send_problems(body: dict[str, Any]) -> list[str]:
    """What the Send a Message page rules out in a body."""
    problems = [f"{key}: not a Send a Message argument" for key in body if key not in SEND_FIELDS]
    src, pack, dst = body.get("src"), body.get("powerpack_uuid"), body.get("dst")
    if (src is None) == (pack is None):
        problems.append("either src or powerpack_uuid, and not both")
    if src is not None and not (isinstance(src, str) and 0 < len(sanitized(src)) <= 14):
        problems.append("src: not a sender id")
    if pack is not None and not (isinstance(pack, str) and _UUID.fullmatch(pack)):
        problems.append("powerpack_uuid: not a uuid")
    if not isinstance(dst, str) or not re.fullmatch(r"[1-9]\d{6,13}", sanitized(dst)):
        problems.append("dst: not a number with its country code")
    elif isinstance(src, str) and sanitized(src) == sanitized(dst):
        problems.append("src and dst cannot be same")
    text = body.get("text")
    if not isinstance(text, str) or not text or len(text) > 1600:
        problems.append("text: required, at most 1600 characters")
    if body.get("type", "sms") not in ("sms", "mms", "whatsapp"):
        problems.append("type: sms, mms or whatsapp")
    expiry = body.get("message_expiry")
    if expiry is not None and (type(expiry) is not int or expiry not in EXPIRY_RANGE):
        problems.append("message_expiry: an integer from 5 to 10799")
    url = body.get("url")
    if url is not None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append("url: not a fully qualified URL")
    if body.get("method", "POST") not in ("GET", "POST"):
        problems.append("method: GET or POST")
    if "method" in body and url is None:
        problems.append("method without url")
    return problems


def _list_problems(query: dict[str, list[str]]) -> tuple[list[str], dict[str, Any]]:
    """What the List all messages page rules out in a query, and the filters it holds."""
    problems: list[str] = []
    filters: dict[str, Any] = {}
    for name, values in query.items():
        if name not in LIST_FILTERS:
            problems.append(f"{name}: not a List all messages filter")
            continue
        if len(values) != 1:
            problems.append(f"{name}: sent {len(values)} times")
        value = values[0]
        if name in ("limit", "offset"):
            low = 1 if name == "limit" else 0
            if not value.isdigit() or int(value) < low or (name == "limit" and int(value) > 20):
                problems.append(f"{name}: out of range")
                continue
            filters[name] = int(value)
        elif name.startswith("message_time"):
            if not _TIME.fullmatch(value):
                problems.append(f"{name}: not YYYY-MM-DD HH:MM[:ss[.uuuuuu]]")
                continue
            moment = datetime.fromisoformat(value).replace(tzinfo=UTC)
            filters[name] = moment.timestamp()
        elif name in ("to_number", "from_number") and not (
            _E164.fullmatch(value) or (name == "from_number" and value.isalnum())
        ):
            problems.append(f"{name}: not an E.164 number")
        elif name == "message_direction" and value not in ("inbound", "outbound"):
            problems.append(f"{name}: inbound or outbound")
        elif name == "message_type" and value not in ("sms", "mms", "whatsapp"):
            problems.append(f"{name}: sms, mms or whatsapp")
        else:
            filters[name] = value
    unsupported = {"message_time", "message_time__gt", "message_time__lt", "message_time__lte"}
    if unsupported & set(filters):
        problems.append("the fake filters by message_time__gte only")
    return problems, filters


def _matches(record: dict[str, Any], filters: dict[str, Any]) -> bool:
    for name, field in (
        ("message_direction", "message_direction"),
        ("message_type", "message_type"),
        ("message_state", "message_state"),
        ("powerpack_id", "powerpack_id"),
    ):
        if name in filters and record.get(field) != filters[name]:
            return False
    for name in ("to_number", "from_number"):
        if name in filters and record[name] != sanitized(filters[name]):
            return False
    return True
