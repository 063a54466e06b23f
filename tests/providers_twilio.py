"""A fake Twilio on loopback that checks every request against Twilio's own OpenAPI
description (a vendored subset in tests/specs): Messages create, list and fetch."""

from __future__ import annotations

import base64
import email.utils
import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jsonschema
from providers_http import FakeProvider, ProviderHandler

SPEC = json.loads((Path(__file__).parent / "specs" / "twilio_messages.json").read_text())
CREATE_PATH = "/2010-04-01/Accounts/{AccountSid}/Messages.json"
FETCH_PATH = "/2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json"

ACCOUNT_SID = "AC" + "0123456789abcdef" * 2
#: Distinctive: no exception, repr or log line may hold it.
AUTH_TOKEN = "twilio-token-canary-7d41e0"
SENDER = "+15005550006"
SERVICE_SID = "MG" + "fedcba9876543210" * 2
CALLBACK_URL = "https://hooks.example/twilio/status"


def _json_schema(node: Any) -> Any:
    """OpenAPI 3.0 schema objects as JSON Schema: ``nullable: true`` admits null."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") and "type" in node:
        converted["type"] = [node["type"], "null"]
    return converted


COMPONENTS = _json_schema(SPEC["components"])


def _phone_number(value: object) -> bool:
    # E.164, a short code, or an alphanumeric sender id (the forms Twilio documents).
    if not isinstance(value, str):
        return True  # formats constrain strings only; nullability is the type's business
    return bool(re.fullmatch(r"\+[1-9]\d{1,14}|\d{3,8}|(?=.*[A-Za-z])[A-Za-z0-9 ]{1,11}", value))


def _uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    parts = urlsplit(value)
    # Twilio: "URL must contain a valid hostname and underscores are not allowed".
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "_" not in parts.netloc


def _uri_reference(value: object) -> bool:
    # Twilio's replies give page URIs relative to https://api.twilio.com.
    return not isinstance(value, str) or value.startswith("/") or _uri(value)


def _rfc_2822(value: object) -> bool:
    if isinstance(value, str):
        email.utils.parsedate_to_datetime(value)  # raises ValueError when it is not one
    return True


def _formats(uri: Callable[[object], bool]) -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    checker.checks("phone-number")(_phone_number)
    checker.checks("uri")(uri)
    checker.checks("date-time-rfc-2822", raises=ValueError)(_rfc_2822)
    return checker


#: What we send: a callback URL must be absolute.
FORMATS = _formats(_uri)
#: What Twilio sends back: page URIs are relative.
REPLY_FORMATS = _formats(_uri_reference)


def _validator(
    schema: Any, formats: jsonschema.FormatChecker = FORMATS
) -> jsonschema.Draft4Validator:
    # The components ride along so the spec's "#/components/schemas/..." refs resolve.
    return jsonschema.Draft4Validator(
        {**_json_schema(schema), "components": COMPONENTS}, format_checker=formats
    )


def _parameter_validators(
    operation: dict[str, Any], where: str
) -> dict[str, jsonschema.Draft4Validator]:
    return {p["name"]: _validator(p["schema"]) for p in operation["parameters"] if p["in"] == where}


def _reply_schema(operation: dict[str, Any], status: str) -> Any:
    return operation["responses"][status]["content"]["application/json"]["schema"]


CREATE = SPEC["paths"][CREATE_PATH]["post"]
LIST = SPEC["paths"][CREATE_PATH]["get"]
FETCH = SPEC["paths"][FETCH_PATH]["get"]
FORM_TYPE = "application/x-www-form-urlencoded"
CREATE_FORM = CREATE["requestBody"]["content"][FORM_TYPE]["schema"]
CREATE_BODY = _validator(CREATE_FORM)
CREATE_PARAMS = _parameter_validators(CREATE, "path")
CREATED = _validator(_reply_schema(CREATE, "201"), REPLY_FORMATS)
LIST_PARAMS = _parameter_validators(LIST, "path")
LIST_QUERY = _parameter_validators(LIST, "query")
LIST_QUERY_TYPES = {p["name"]: p["schema"].get("type") for p in LIST["parameters"]}
LISTED = _validator(_reply_schema(LIST, "200"), REPLY_FORMATS)
FETCH_PARAMS = _parameter_validators(FETCH, "path")
FETCHED = _validator(_reply_schema(FETCH, "200"), REPLY_FORMATS)
DOCUMENTED_STATUSES = frozenset(SPEC["components"]["schemas"]["message_enum_status"]["enum"])
#: Documented in ValidityPeriod's description, not as schema keywords.
VALIDITY_RANGE = range(1, 36_001)


def _typed(kind: str | None, value: str) -> Any:
    """A form or query string as the type the spec declares, so jsonschema can check it."""
    if kind == "integer" and re.fullmatch(r"-?\d+", value):
        return int(value)
    if kind == "number" and re.fullmatch(r"-?\d+(\.\d+)?", value):
        return float(value)
    if kind == "boolean" and value in ("true", "false"):
        return value == "true"
    return value


def _typed_form(raw: dict[str, list[str]], problems: list[str]) -> dict[str, Any]:
    properties = CREATE_FORM["properties"]
    typed: dict[str, Any] = {}
    for key, values in raw.items():
        if key not in properties:
            # Twilio ignores unknown parameters; a misspelt one would silently do nothing.
            problems.append(f"{key}: not a Messages create parameter")
            continue
        kind = properties[key].get("type", "string")
        if kind == "array":
            typed[key] = values
            continue
        if len(values) != 1:
            problems.append(f"{key}: sent {len(values)} times")
        typed[key] = _typed(kind, values[0])
    return typed


def _error(status: int, code: int | None, message: str) -> dict[str, Any]:
    """Twilio's error body shape."""
    more = f"https://www.twilio.com/docs/errors/{code}" if code else None
    return {"code": code, "message": message, "more_info": more, "status": status}


#: What Twilio's edge answers when its back end took too long (not Twilio's JSON shape).
GATEWAY_TIMEOUT = "<html><body><h1>504 Gateway Time-out</h1></body></html>"


class FakeTwilio(FakeProvider):
    """Twilio's Messages create, list and fetch endpoints on 127.0.0.1.

    ``outcomes`` scripts the next creates (default accept): "accept", "reject" (400,
    21211, echoing the To number as Twilio does), "throttle" (429, nothing created),
    "error" (500, nothing created), "created-504" (create the message, then answer 504),
    "hangup" (create it, then close without a reply) or "stall" (create it, then reply
    only after the client's read time-out). ``list_outcomes`` scripts list reads and
    ``fetch_outcomes`` fetches: "error" (503), "throttle" (429), "hangup" or "stall".
    Anything off-spec lands in ``violations``. ``clock`` stamps date_created; a message
    shows in lists only ``list_lag`` seconds (on ``clock``) after it was created, as
    Twilio's list trails its creates.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.list_lag = 0.0
        #: the Retry-After a throttled create answers with (None: no header)
        self.retry_after: str | None = None
        #: when each request arrived (time.monotonic), for rate checks
        self.arrivals: list[float] = []
        #: when each message was created, on ``clock`` (date_created keeps whole seconds)
        self.created_at: dict[str, float] = {}
        self.outcomes: list[str] = []
        self.fetch_outcomes: list[str] = []
        self.list_outcomes: list[str] = []
        #: every create form, as typed for the spec check
        self.requests: list[dict[str, Any]] = []
        #: every list query, as sent (name -> values)
        self.list_queries: list[dict[str, list[str]]] = []
        self.messages: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.hits = 0
        super().__init__()

    def set_status(self, sid: str, raw: str) -> None:
        self.messages[sid]["status"] = raw

    def add_message(self, to: str, body: str, *, created: float, sender: str = SENDER) -> str:
        """A message Twilio already holds (sent earlier, or by someone else); its sid."""
        return self._create({"To": to, "Body": body, "From": sender}, created)["sid"]

    def _violate(self, where: str, problems: list[str]) -> None:
        with self.lock:
            self.violations.extend(f"{where}: {p}" for p in problems)

    def _authorized(self, handler: ProviderHandler, account: str) -> bool:
        expected = base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()
        if handler.headers.get("Authorization") == f"Basic {expected}" and account == ACCOUNT_SID:
            return True
        handler.reply(401, _error(401, 20003, "Authenticate"))
        return False

    def _path_ok(self, values: dict[str, str], validators: dict[str, Any]) -> bool:
        problems = [
            f"path {name}: {error.message}"
            for name, validator in validators.items()
            for error in validator.iter_errors(values[name])
        ]
        self._violate("path", problems)
        return not problems

    def handle_post(self, handler: ProviderHandler) -> None:
        self.hits += 1
        self.arrivals.append(time.monotonic())
        body = handler.read_body()
        match = re.fullmatch(r"/2010-04-01/Accounts/([^/]+)/Messages\.json", handler.path)
        if match is None:
            self._violate("POST", [f"unexpected path {handler.path}"])
            handler.reply(404, _error(404, 20404, "The requested resource was not found"))
            return
        account = match[1]
        if not self._path_ok({"AccountSid": account}, CREATE_PARAMS):
            handler.reply(404, _error(404, 20404, "The requested resource was not found"))
            return
        if not self._authorized(handler, account):
            return
        problems: list[str] = []
        content_type = handler.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type != FORM_TYPE:
            problems.append(f"Content-Type {content_type!r}, the spec takes {FORM_TYPE}")
        form = _typed_form(parse_qs(body.decode(), keep_blank_values=True), problems)
        problems += [
            f"{'/'.join(map(str, e.path)) or 'body'}: {e.message}"
            for e in CREATE_BODY.iter_errors(form)
        ]
        if "ValidityPeriod" in form and form["ValidityPeriod"] not in VALIDITY_RANGE:
            problems.append("ValidityPeriod: outside Twilio's documented 1 to 36000")
        if not form.get("From") and not form.get("MessagingServiceSid"):
            problems.append("neither From nor MessagingServiceSid")
        if not form.get("Body"):
            problems.append("no Body")
        self.requests.append(form)
        if problems:
            self._violate("POST Messages.json", problems)
            handler.reply(400, _error(400, None, "; ".join(problems)))
            return
        outcome = self.outcomes.pop(0) if self.outcomes else "accept"
        if outcome == "reject":
            # As Twilio does: its message quotes the number it refused.
            message = f"The 'To' number {form['To']} is not a valid phone number."
            handler.reply(400, _error(400, 21211, message))
        elif outcome == "throttle":
            wait = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            handler.reply(429, _error(429, 20429, "Too Many Requests"), wait)
        elif outcome == "error":
            handler.reply(500, _error(500, 20500, "Internal Server Error"))
        else:
            resource = self._create(form, self.clock())
            if outcome == "created-504":
                handler.reply(504, GATEWAY_TIMEOUT)
                return
            if outcome == "hangup":
                handler.drop()
                return
            if outcome == "stall":
                handler.hold()
            self._check(CREATED, resource, "201 reply")
            handler.reply(201, resource)

    def _create(self, form: dict[str, Any], created: float) -> dict[str, Any]:
        sid = "SM" + uuid.uuid4().hex
        stamp = email.utils.format_datetime(datetime.fromtimestamp(int(created), UTC))
        resource = {
            "account_sid": ACCOUNT_SID,
            "api_version": "2010-04-01",
            "body": form["Body"],
            "date_created": stamp,
            # A queued message has not been sent: Twilio leaves date_sent null until then.
            "date_sent": None,
            "date_updated": stamp,
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "from": form.get("From"),
            "messaging_service_sid": form.get("MessagingServiceSid"),
            "num_media": "0",
            "num_segments": "1",
            "price": None,
            "price_unit": None,
            "sid": sid,
            # Twilio's documented initial status: accepted through a messaging service.
            "status": "accepted" if form.get("MessagingServiceSid") else "queued",
            "subresource_uris": {
                "media": f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/{sid}/Media.json"
            },
            "to": form["To"],
            "uri": f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/{sid}.json",
        }
        with self.lock:
            self.messages[sid] = resource
            self.created_at[sid] = created
        return resource

    def _check(self, validator: Any, resource: dict[str, Any], where: str) -> None:
        self._violate(where, [e.message for e in validator.iter_errors(resource)])

    def handle_get(self, handler: ProviderHandler) -> None:
        self.hits += 1
        self.arrivals.append(time.monotonic())
        handler.read_body()
        path, _, query = handler.path.partition("?")
        listed = re.fullmatch(r"/2010-04-01/Accounts/([^/]+)/Messages\.json", path)
        if listed is not None:
            self._list(handler, listed[1], parse_qs(query, keep_blank_values=True))
            return
        match = re.fullmatch(r"/2010-04-01/Accounts/([^/]+)/Messages/([^/]+)\.json", path)
        if match is None or query:
            self._violate("GET", [f"unexpected path {handler.path}"])
            handler.reply(404, _error(404, 20404, "The requested resource was not found"))
            return
        account, sid = match[1], match[2]
        not_found = _error(404, 20404, f"The requested resource {handler.path} was not found")
        if not self._path_ok({"AccountSid": account, "Sid": sid}, FETCH_PARAMS):
            handler.reply(404, not_found)
            return
        if not self._authorized(handler, account):
            return
        outcome = self.fetch_outcomes.pop(0) if self.fetch_outcomes else "ok"
        if self._failed_read(handler, outcome):
            return
        if sid not in self.messages:
            handler.reply(404, not_found)
        else:
            self._check(FETCHED, self.messages[sid], "200 reply")
            handler.reply(200, self.messages[sid])

    def _failed_read(self, handler: ProviderHandler, outcome: str) -> bool:
        if outcome == "hangup":
            handler.drop()
        elif outcome == "error":
            handler.reply(503, _error(503, None, "Service Unavailable"))
        elif outcome == "throttle":
            handler.reply(429, _error(429, 20429, "Too Many Requests"))
        elif outcome == "stall":
            handler.hold()
            handler.reply(200, {})
        else:
            return False
        return True

    def _list(self, handler: ProviderHandler, account: str, query: dict[str, list[str]]) -> None:
        if not self._path_ok({"AccountSid": account}, LIST_PARAMS):
            handler.reply(404, _error(404, 20404, "The requested resource was not found"))
            return
        if not self._authorized(handler, account):
            return
        self.list_queries.append(query)
        problems: list[str] = []
        typed: dict[str, Any] = {}
        for name, values in query.items():
            if name not in LIST_QUERY:
                problems.append(f"{name}: not a Messages list parameter")
                continue
            if len(values) != 1:
                problems.append(f"{name}: sent {len(values)} times")
            typed[name] = _typed(LIST_QUERY_TYPES[name], values[0])
            problems += [f"{name}: {e.message}" for e in LIST_QUERY[name].iter_errors(typed[name])]
        if problems:
            self._violate("GET Messages.json", problems)
            handler.reply(400, _error(400, None, "; ".join(problems)))
            return
        outcome = self.list_outcomes.pop(0) if self.list_outcomes else "ok"
        if self._failed_read(handler, outcome):
            return
        with self.lock:
            found = [
                m
                for m in self.messages.values()
                if m["to"] == typed.get("To", m["to"])
                and m["from"] == typed.get("From", m["from"])
                and (not self.list_lag or self.created_at[m["sid"]] + self.list_lag <= self.clock())
            ]
        # Newest first, as Twilio lists them.
        found.sort(key=lambda m: email.utils.parsedate_to_datetime(m["date_created"]), reverse=True)
        size = typed.get("PageSize", 50)
        page = found[:size]
        base = path_for_list(query)
        reply = {
            "end": max(len(page) - 1, 0),
            "first_page_uri": base,
            "next_page_uri": f"{base}&Page=1" if len(found) > size else None,
            "page": 0,
            "page_size": size,
            "previous_page_uri": None,
            "start": 0,
            "uri": base,
            "messages": page,
        }
        self._check(LISTED, reply, "list reply")
        handler.reply(200, reply)


def path_for_list(query: dict[str, list[str]]) -> str:
    """The list URI Twilio reports back for a query."""
    flat = [(name, value) for name, values in query.items() for value in values]
    return f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json?{urlencode(flat)}"
