"""A fake Postmark on loopback: POST /email, the outbound message search and a message's
details, as Postmark documents them; and the webhooks Postmark posts about what it sent.

The webhook records follow Postmark's documented payloads and its way of authenticating
them (basic credentials written into the webhook URL, sent as an Authorization header):

- https://postmarkapp.com/developer/webhooks/webhooks-overview
- https://postmarkapp.com/developer/webhooks/bounce-webhook
- https://postmarkapp.com/developer/webhooks/delivery-webhook
- https://postmarkapp.com/developer/webhooks/spam-complaint-webhook
- https://postmarkapp.com/developer/webhooks/open-tracking-webhook
- https://postmarkapp.com/developer/webhooks/click-webhook
- https://postmarkapp.com/developer/webhooks/subscription-change-webhook
- https://postmarkapp.com/developer/api/bounce-api (the bounce types and TypeCodes)
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import httpx
from providers_http import FakeProvider, ProviderHandler

from resetctl.transports.base import CallbackRequest

TOKEN = "pm-test-server-token-5d1f"
SENDER = "Acme <no-reply@acme.example>"
#: Postmark writes times in US Eastern with seven fractional digits.
EASTERN = timezone(timedelta(hours=-5))
REQUIRED_FIELDS = ("From", "To", "Subject", "MessageStream")
#: Every field POST /email documents: Postmark ignores others, so a misspelt one (a
#: "Reply-To") would silently do nothing.
SEND_FIELDS = frozenset(
    {
        "From",
        "To",
        "Cc",
        "Bcc",
        "Subject",
        "Tag",
        "HtmlBody",
        "TextBody",
        "ReplyTo",
        "Metadata",
        "Headers",
        "TrackOpens",
        "TrackLinks",
        "Attachments",
        "MessageStream",
    }
)
#: The outbound search's documented query parameters (``metadata_<name>`` aside).
SEARCH_PARAMETERS = frozenset(
    {
        "count",
        "offset",
        "recipient",
        "fromemail",
        "tag",
        "status",
        "todate",
        "fromdate",
        "subject",
        "messagestream",
    }
)


def postmark_time(moment: float) -> str:
    """Epoch seconds as Postmark writes them."""
    text = datetime.fromtimestamp(moment, EASTERN).isoformat(timespec="microseconds")
    return text[:26] + "0" + text[26:]


EVENT_DETAILS: dict[str, dict[str, str]] = {
    "Delivered": {
        "DeliveryMessage": "smtp;250 2.0.0 OK",
        "DestinationServer": "mx.example.org",
        "DestinationIP": "192.0.2.25",
    },
    "Transient": {
        "DeliveryMessage": "smtp;451 4.7.1 try again later",
        "DestinationServer": "mx.example.org",
        "DestinationIP": "192.0.2.25",
    },
    "Bounced": {"Summary": "smtp;550 5.1.1 mailbox does not exist", "BounceID": "374814878"},
    "SpamComplaint": {"Summary": "marked as spam"},
    "Opened": {"Summary": "Email opened"},
    "LinkClicked": {"Summary": "Tracked link clicked", "ClickLocation": "HTML"},
    "SubscriptionChanged": {"Origin": "Recipient", "SuppressSending": "True"},
}


class FakePostmark(FakeProvider):
    """Postmark's send, search and details endpoints on 127.0.0.1.

    The next sends end as scripted: "accept", "reject" (422, quoting the address),
    "inactive" (422, 406), "rate-limit" (429, nothing created), "error" (500, nothing
    created), "maintenance" (503 with ErrorCode 100, nothing created), "created-504"
    (accept, then answer 504), "hang-up" (accept, then close without a reply) or "stall"
    (accept, then answer only after the client's read time-out). ``search_outcomes``
    scripts searches: "error" (500), "rate-limit" (429), "hang-up" or "stall". With
    ``filters_metadata`` off, the search ignores ``metadata_*`` filters (a careless
    index), so only a transport that checks what it finds is right. ``search_lag``
    seconds (on ``clock``) pass before a sent message shows in searches, as Postmark's
    search index trails its sends.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.search_lag = 0.0
        self.outcomes: list[str] = []
        self.search_outcomes: list[str] = []
        self.filters_metadata = True
        self.sent: dict[str, dict[str, Any]] = {}
        self.received_at: dict[str, float] = {}
        self.statuses: dict[str, str] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.headers: list[dict[str, str]] = []
        #: every search query, as sent (name -> values)
        self.searches: list[dict[str, list[str]]] = []
        #: request checks that failed: each one is a transport bug
        self.problems: list[str] = []
        super().__init__()

    def script(self, *outcomes: str) -> None:
        with self.lock:
            self.outcomes.extend(outcomes)

    def next_outcome(self) -> str:
        with self.lock:
            return self.outcomes.pop(0) if self.outcomes else "accept"

    def accept(self, payload: dict[str, Any], *, at: float | None = None) -> str:
        """Take a message (as a send would, or one sent earlier); its MessageID."""
        message_id = str(uuid.uuid4())
        with self.lock:
            self.sent[message_id] = payload
            self.received_at[message_id] = self.clock() if at is None else at
            self.statuses[message_id] = "Sent"
            self.events[message_id] = []
        return message_id

    def add_event(self, message_id: str, kind: str, at: float = 0.0) -> None:
        recipient = self.sent[message_id]["To"]
        event = {
            "Recipient": recipient,
            "Type": kind,
            "ReceivedAt": postmark_time(self.received_at[message_id] + at),
            "Details": EVENT_DETAILS.get(kind, {}),
        }
        with self.lock:
            self.events[message_id].append(event)

    def summary(self, message_id: str) -> dict[str, Any]:
        """A message as the search lists it."""
        sent = self.sent[message_id]
        with self.lock:
            status = self.statuses[message_id]
        return {
            "Tag": "",
            "MessageID": message_id,
            "MessageStream": sent["MessageStream"],
            "To": [{"Email": sent["To"], "Name": None}],
            "Cc": [],
            "Bcc": [],
            "Recipients": [sent["To"]],
            "ReceivedAt": postmark_time(self.received_at[message_id]),
            "From": sent["From"],
            "Subject": sent["Subject"],
            "Attachments": [],
            "Status": status,
            "TrackOpens": sent["TrackOpens"],
            "TrackLinks": sent["TrackLinks"],
            "Metadata": sent["Metadata"],
            "Sandboxed": False,
        }

    def details(self, message_id: str) -> dict[str, Any]:
        sent = self.sent[message_id]
        with self.lock:
            events = list(self.events[message_id])
        return {
            **self.summary(message_id),
            "TextBody": sent.get("TextBody", ""),
            "HtmlBody": sent.get("HtmlBody", ""),
            "MessageEvents": events,
        }

    def check(self, headers: dict[str, str], payload: Any) -> str | None:
        """What is wrong with a send request, if anything."""
        if "application/json" not in headers.get("accept", ""):
            return "Accept is not application/json"
        if not headers.get("content-type", "").startswith("application/json"):
            return "Content-Type is not application/json"
        if not isinstance(payload, dict):
            return "body is not a JSON object"
        missing = [f for f in REQUIRED_FIELDS if not isinstance(payload.get(f), str)]
        if missing:
            return f"missing {missing}"
        unknown = sorted(set(payload) - SEND_FIELDS)
        if unknown:
            return f"not send fields: {unknown}"
        if "ReplyTo" in payload and not isinstance(payload["ReplyTo"], str):
            return "ReplyTo is not a string"
        if not (payload.get("TextBody") or payload.get("HtmlBody")):
            return "neither TextBody nor HtmlBody"
        if payload.get("TrackLinks") != "None" or payload.get("TrackOpens") is not False:
            return "tracking is on"
        metadata = payload.get("Metadata")
        if not isinstance(metadata, dict) or not all(
            isinstance(v, str) and len(k) <= 20 and len(v) <= 80 for k, v in metadata.items()
        ):
            return "Metadata is not short string pairs"
        return None

    def _authorized(self, handler: ProviderHandler) -> bool:
        if handler.headers.get("X-Postmark-Server-Token") == TOKEN:
            return True
        handler.reply(401, {"ErrorCode": 10, "Message": "Bad or missing Server API token."})
        return False

    def handle_post(self, handler: ProviderHandler) -> None:
        raw = handler.read_body()
        if handler.path != "/email":
            handler.reply(404, {"ErrorCode": 0, "Message": "Not found."})
            return
        if not self._authorized(handler):
            return
        headers = {k.lower(): v for k, v in handler.headers.items()}
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        problem = self.check(headers, payload)
        if problem is not None:
            self.problems.append(problem)
            handler.reply(422, {"ErrorCode": 300, "Message": f"test server: {problem}"})
            return
        self.headers.append(headers)
        to = payload["To"]
        outcome = self.next_outcome()
        if outcome in ("accept", "created-504", "hang-up", "stall"):
            message_id = self.accept(payload)
            if outcome == "created-504":
                handler.reply(504, "<html><body>504 Gateway Time-out</body></html>")
                return
            if outcome == "hang-up":
                # The message was taken; the reply is lost with the connection.
                handler.drop()
                return
            if outcome == "stall":
                handler.hold()
            handler.reply(
                200,
                {
                    "To": to,
                    "SubmittedAt": postmark_time(self.received_at[message_id]),
                    "MessageID": message_id,
                    "ErrorCode": 0,
                    "Message": "OK",
                },
            )
        elif outcome == "reject":
            # Postmark quotes the address back; the transport must not pass it on.
            handler.reply(422, {"ErrorCode": 300, "Message": f"Invalid 'To' address: '{to}'."})
        elif outcome == "inactive":
            handler.reply(
                422,
                {
                    "ErrorCode": 406,
                    "Message": f"You tried to send to recipient(s) that have been marked as"
                    f" inactive. Found inactive addresses: {to}.",
                },
            )
        elif outcome == "rate-limit":
            handler.reply(429, {"ErrorCode": 429, "Message": "Rate limit exceeded."})
        elif outcome == "error":
            handler.reply(500, "Internal Server Error")
        elif outcome == "maintenance":
            handler.reply(503, {"ErrorCode": 100, "Message": "Maintenance"})
        else:
            raise AssertionError(f"unknown outcome {outcome!r}")

    def handle_get(self, handler: ProviderHandler) -> None:
        if not self._authorized(handler):
            return
        path, _, query = handler.path.partition("?")
        if path == "/messages/outbound":
            self._search(handler, parse_qs(query, keep_blank_values=True))
            return
        details = re.fullmatch(r"/messages/outbound/([^/?]+)/details", handler.path)
        if details is None:
            handler.reply(404, {"ErrorCode": 0, "Message": "Not found."})
            return
        message_id = unquote(details[1])
        if message_id not in self.sent:
            handler.reply(404, {"ErrorCode": 701, "Message": "Message not found."})
            return
        handler.reply(200, self.details(message_id))

    def _search(self, handler: ProviderHandler, query: dict[str, list[str]]) -> None:
        self.searches.append(query)
        problem = _search_problem(query)
        if problem is not None:
            self.problems.append(problem)
            handler.reply(422, {"ErrorCode": 0, "Message": f"test server: {problem}"})
            return
        outcome = self.search_outcomes.pop(0) if self.search_outcomes else "ok"
        if outcome == "error":
            handler.reply(500, "Internal Server Error")
            return
        if outcome == "rate-limit":
            handler.reply(429, {"ErrorCode": 429, "Message": "Rate limit exceeded."})
            return
        if outcome == "hang-up":
            handler.drop()
            return
        if outcome == "stall":
            handler.hold()
        value = {name: values[0] for name, values in query.items()}
        # Without a messagestream, Postmark searches the default transactional stream.
        stream = value.get("messagestream", "outbound")
        with self.lock:
            found = [
                message_id
                for message_id, sent in self.sent.items()
                if sent["MessageStream"] == stream
                and (
                    not self.search_lag
                    or self.received_at[message_id] + self.search_lag <= self.clock()
                )
                and sent["To"].casefold() == value.get("recipient", sent["To"]).casefold()
                and (not self.filters_metadata or _metadata_matches(sent["Metadata"], value))
            ]
        found.sort(key=self.received_at.__getitem__, reverse=True)
        offset, count = int(value["offset"]), int(value["count"])
        page = found[offset : offset + count]
        handler.reply(200, {"TotalCount": len(found), "Messages": [self.summary(m) for m in page]})


def _metadata_matches(metadata: dict[str, str], query: dict[str, str]) -> bool:
    wanted = {k.removeprefix("metadata_"): v for k, v in query.items() if k.startswith("metadata_")}
    return all(metadata.get(key) == value for key, value in wanted.items())


def _search_problem(query: dict[str, list[str]]) -> str | None:
    """What is wrong with a search query, if anything (Postmark's documented rules)."""
    for name, values in query.items():
        if name not in SEARCH_PARAMETERS and not name.startswith("metadata_"):
            return f"{name}: not a search parameter"
        if len(values) != 1:
            return f"{name}: sent {len(values)} times"
    for name in ("count", "offset"):
        if name not in query:
            return f"{name} is required"
        if not re.fullmatch(r"\d+", query[name][0]):
            return f"{name}: not a whole number"
    count, offset = int(query["count"][0]), int(query["offset"][0])
    if not 1 <= count <= 500 or count + offset > 10_000:
        return "count must be 1 to 500, and count + offset at most 10000"
    return None


#: Postmark's bounce types as its Bounce API lists them: TypeCode, Name, Description.
BOUNCE_TYPES: dict[str, tuple[int, str, str]] = {
    "HardBounce": (1, "Hard bounce", "The server was unable to deliver your message."),
    "Transient": (2, "Message delayed", "The server could not temporarily deliver it."),
    "Unsubscribe": (16, "Unsubscribe request", "Unsubscribe or Remove request."),
    "Subscribe": (32, "Subscribe request", "Subscribe request from someone."),
    "AutoResponder": (64, "Auto responder", "Automatic email responder."),
    "AddressChange": (128, "Address change", "The recipient requested an address change."),
    "DnsError": (256, "DNS error", "A temporary DNS error."),
    "SpamNotification": (512, "Spam notification", "Blocked by the user, or classified spam."),
    "OpenRelayTest": (1024, "Open relay test", "A test of whether the server is an open relay."),
    "Unknown": (2048, "Unknown", "Unable to classify the NDR."),
    "SoftBounce": (4096, "Soft bounce", "Unable to temporarily deliver message."),
    "VirusNotification": (8192, "Virus notification", "A virus notification."),
    "ChallengeVerification": (16384, "Spam challenge verification", "A challenge."),
    "BadEmailAddress": (100000, "Invalid email address", "Not a valid email address."),
    "SpamComplaint": (100001, "Spam complaint", "Explicitly marked as spam."),
    "ManuallyDeactivated": (100002, "Manually deactivated", "Manually deactivated."),
    "Unconfirmed": (100003, "Registration not confirmed", "Not confirmed."),
    "Blocked": (100006, "ISP block", "Blocked from this ISP due to content or blacklisting."),
    "SMTPApiError": (100007, "SMTP API error", "An error accepting it through the SMTP API."),
    "InboundError": (100008, "Processing failed", "Unable to deliver inbound message."),
    "DMARCPolicy": (100009, "DMARC Policy", "Email rejected due to DMARC Policy."),
    "TemplateRenderingFailed": (100010, "Template rendering failed", "Rendering failed."),
}

#: Webhook credentials as an operator writes them into the URL Postmark is given.
WEBHOOK_USERNAME = "resetctl-hooks"
WEBHOOK_PASSWORD = "pm-hook-CANARY-7c2e9f1a0b"
#: The webhook URL without credentials (what resetctl's webhook_url option holds).
WEBHOOK_URL = "https://hooks.example.com/postmark/webhook"
#: Postmark's documented server id of its examples.
SERVER_ID = 23


def webhook_time(moment: float) -> str:
    """Epoch seconds as Postmark's webhooks write them: ISO 8601, UTC, seven digits."""
    text = datetime.fromtimestamp(moment, UTC).isoformat(timespec="microseconds")
    return text[:26] + "0Z"


def credentialed(
    url: str = WEBHOOK_URL, user: str = WEBHOOK_USERNAME, pw: str = WEBHOOK_PASSWORD
) -> str:
    """``url`` with basic credentials in it, as the webhooks overview says to set it."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{pw}@{parts.netloc}"))


class PostmarkWebhookSender:
    """Builds the webhook records Postmark posts about the messages a FakePostmark took,
    from what each send carried (its Metadata, stream, sender and subject), and posts
    them as Postmark does: JSON, with the URL's credentials as basic auth."""

    def __init__(self, fake: FakePostmark) -> None:
        self.fake = fake
        self._next_id = 4323372036854775807  # Postmark's example: IDs exceed 2**53

    def _sent(self, message_id: str) -> dict[str, Any]:
        return self.fake.sent[message_id]

    def _base(self, message_id: str) -> dict[str, Any]:
        sent = self._sent(message_id)
        return {
            "MessageStream": sent["MessageStream"],
            "MessageID": message_id,
            "Metadata": dict(sent.get("Metadata", {})),
            "Tag": sent.get("Tag", ""),
        }

    def bounce(self, message_id: str, bounce_type: str = "HardBounce") -> dict[str, Any]:
        """A Bounce webhook record of the documented shape."""
        code, name, description = BOUNCE_TYPES[bounce_type]
        return self._bounce_like("Bounce", message_id, bounce_type, code, name, description)

    def spam_complaint(self, message_id: str) -> dict[str, Any]:
        """A SpamComplaint webhook record (the bounce shape, RecordType SpamComplaint)."""
        code, name, description = BOUNCE_TYPES["SpamComplaint"]
        return self._bounce_like(
            "SpamComplaint", message_id, "SpamComplaint", code, name, description
        )

    def _bounce_like(
        self, kind: str, message_id: str, bounce_type: str, code: int, name: str, text: str
    ) -> dict[str, Any]:
        sent = self._sent(message_id)
        self._next_id -= 1
        return {
            "RecordType": kind,
            "ID": self._next_id,
            "Type": bounce_type,
            "TypeCode": code,
            "Name": name,
            **self._base(message_id),
            "ServerID": SERVER_ID,
            "Description": text,
            "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist",
            "Email": sent["To"],
            "From": sent["From"],
            "BouncedAt": webhook_time(self.fake.clock()),
            "DumpAvailable": True,
            "Inactive": bounce_type in ("HardBounce", "SpamComplaint"),
            "CanActivate": True,
            "Subject": sent["Subject"],
            "Content": f"Return-Path: <>\r\nTo: {sent['To']}\r\n",
        }

    def delivery(self, message_id: str) -> dict[str, Any]:
        """A Delivery webhook record of the documented shape."""
        return {
            "RecordType": "Delivery",
            "ServerID": SERVER_ID,
            **self._base(message_id),
            "Recipient": self._sent(message_id)["To"],
            "DeliveredAt": webhook_time(self.fake.clock()),
            "Details": "smtp;250 2.0.0 OK  1573000000 a1si1234567qkb.100 - gsmtp",
        }

    def open(self, message_id: str) -> dict[str, Any]:
        """An Open webhook record (sent only when open tracking is on)."""
        return {
            "RecordType": "Open",
            **self._base(message_id),
            "FirstOpen": True,
            "Client": {"Name": "Chrome 35.0.1916.153", "Company": "Google", "Family": "Chrome"},
            "OS": {"Name": "OS X 10.7 Lion", "Company": "Apple Computer, Inc.", "Family": "OS X"},
            "Platform": "WebMail",
            "UserAgent": "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_7_5)",
            "ReadSeconds": 5,
            "Geo": {"CountryISOCode": "RS", "Country": "Serbia", "City": "Novi Sad"},
            "ReceivedAt": webhook_time(self.fake.clock()),
            "Recipient": self._sent(message_id)["To"],
        }

    def click(self, message_id: str) -> dict[str, Any]:
        """A Click webhook record (sent only when link tracking is on)."""
        record = self.open(message_id)
        for key in ("FirstOpen", "ReadSeconds"):
            del record[key]
        return {
            **record,
            "RecordType": "Click",
            "ClickLocation": "HTML",
            "OriginalLink": "https://example.com",
        }

    def subscription_change(self, message_id: str) -> dict[str, Any]:
        """A SubscriptionChange webhook record (about the address, not the message)."""
        return {
            "RecordType": "SubscriptionChange",
            **self._base(message_id),
            "ServerID": SERVER_ID,
            "ChangedAt": webhook_time(self.fake.clock()),
            "Recipient": self._sent(message_id)["To"],
            "Origin": "Recipient",
            "SuppressSending": True,
            "SuppressionReason": "HardBounce",
        }


def webhook_request(record: Any, url: str | None = None) -> CallbackRequest:
    """The request Postmark makes for ``record`` to ``url`` (credentials in it, as
    Postmark is given it): the URL without them, basic auth from them, a JSON body."""
    parts = urlsplit(url or credentialed())
    headers = {"content-type": "application/json", "user-agent": "Postmark"}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    body = record if isinstance(record, bytes) else json.dumps(record).encode()
    return CallbackRequest(bare, headers, body)


def post_webhook(url: str, record: dict[str, Any]) -> httpx.Response:
    """POST ``record`` over HTTP to ``url`` (credentials in it), as Postmark does."""
    with httpx.Client(timeout=5.0) as client:
        return client.post(url, json=record, headers={"User-Agent": "Postmark"})
