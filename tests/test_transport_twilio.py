"""The Twilio transport: the shared contract, and a fake Twilio on loopback that checks
every create request against Twilio's own OpenAPI description (vendored in tests/specs)."""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

import httpx
import jsonschema
import pytest
from conftest import T0, FakeClock
from contract import SECRET_PHONE, SECRET_URL, TransportContract, sms_message

from resetctl.config import settings_from_mapping
from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    TransientError,
    TransportContext,
    TransportPlugin,
    build_transports,
    plugin,
)
from resetctl.transports.twilio import (
    PLUGIN,
    TWILIO_STATUSES,
    VALIDITY_PERIOD_MAX,
    TwilioRefused,
    TwilioTransport,
    callback_status,
    compute_signature,
    normalize,
    verify_signature,
)

SPEC = json.loads((Path(__file__).parent / "specs" / "twilio_messages.json").read_text())
CREATE_PATH = "/2010-04-01/Accounts/{AccountSid}/Messages.json"
FETCH_PATH = "/2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json"

ACCOUNT_SID = "AC" + "0123456789abcdef" * 2
#: Distinctive: no exception, repr or log line may hold it.
AUTH_TOKEN = "twilio-token-canary-7d41e0"
SENDER = "+15005550006"
SERVICE_SID = "MG" + "fedcba9876543210" * 2
CALLBACK_URL = "https://hooks.example/twilio/status"
SECRETS = (SECRET_PHONE, SECRET_PHONE.lstrip("+"), SECRET_URL, AUTH_TOKEN)


def _no_secrets(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


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
FORMATS = jsonschema.FormatChecker(formats=())


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


def _rfc_2822(value: object) -> bool:
    if isinstance(value, str):
        email.utils.parsedate_to_datetime(value)  # raises ValueError when it is not one
    return True


FORMATS.checks("phone-number")(_phone_number)
FORMATS.checks("uri")(_uri)
FORMATS.checks("date-time-rfc-2822", raises=ValueError)(_rfc_2822)


def _validator(schema: Any) -> jsonschema.Draft4Validator:
    # The components ride along so the spec's "#/components/schemas/..." refs resolve.
    return jsonschema.Draft4Validator(
        {**_json_schema(schema), "components": COMPONENTS}, format_checker=FORMATS
    )


def _parameter_validators(operation: dict[str, Any]) -> dict[str, jsonschema.Draft4Validator]:
    return {
        p["name"]: _validator(p["schema"]) for p in operation["parameters"] if p["in"] == "path"
    }


CREATE = SPEC["paths"][CREATE_PATH]["post"]
FETCH = SPEC["paths"][FETCH_PATH]["get"]
FORM_TYPE = "application/x-www-form-urlencoded"
CREATE_FORM = CREATE["requestBody"]["content"][FORM_TYPE]["schema"]
CREATE_BODY = _validator(CREATE_FORM)
CREATE_PARAMS = _parameter_validators(CREATE)
CREATED = _validator(CREATE["responses"]["201"]["content"]["application/json"]["schema"])
FETCH_PARAMS = _parameter_validators(FETCH)
FETCHED = _validator(FETCH["responses"]["200"]["content"]["application/json"]["schema"])
DOCUMENTED_STATUSES = frozenset(SPEC["components"]["schemas"]["message_enum_status"]["enum"])
#: Documented in ValidityPeriod's description, not as schema keywords.
VALIDITY_RANGE = range(1, 36_001)


def _typed_form(raw: dict[str, list[str]], problems: list[str]) -> dict[str, Any]:
    """Form strings as the types the spec declares, so jsonschema can check them."""
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
        value = values[0]
        if kind == "integer" and re.fullmatch(r"-?\d+", value):
            typed[key] = int(value)
        elif kind == "number" and re.fullmatch(r"-?\d+(\.\d+)?", value):
            typed[key] = float(value)
        elif kind == "boolean" and value in ("true", "false"):
            typed[key] = value == "true"
        else:
            typed[key] = value
    return typed


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeTwilio


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; Nagle would hold the second for an ACK.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the fake's requests are asserted on, not printed."""

    def do_POST(self) -> None:
        self.server.fake.handle_create(self)

    def do_GET(self) -> None:
        self.server.fake.handle_fetch(self)

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # The client gave up first (a read time-out test); nothing to tell it.
            self.close_connection = True

    def hang_up(self) -> None:
        self.close_connection = True


def _error(status: int, code: int | None, message: str) -> dict[str, Any]:
    """Twilio's error body shape."""
    more = f"https://www.twilio.com/docs/errors/{code}" if code else None
    return {"code": code, "message": message, "more_info": more, "status": status}


class FakeTwilio:
    """Twilio's Messages create and fetch endpoints on 127.0.0.1.

    ``outcomes`` scripts the next creates (default accept): "accept", "reject" (400,
    21211, echoing the To number as Twilio does), "throttle" (429), "error" (500),
    "hangup" (create the message, then close without a reply) or "stall" (create it,
    then reply only after the client's read time-out). ``fetch_outcomes`` scripts
    fetches: "error" or "hangup". Anything off-spec lands in ``violations``.
    """

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.fetch_outcomes: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.messages: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self.hits = 0
        self.released = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        # A short poll keeps shutdown (once per test) from waiting out the default 0.5 s.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def set_status(self, sid: str, raw: str) -> None:
        self.messages[sid]["status"] = raw

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _violate(self, where: str, problems: list[str]) -> None:
        with self._lock:
            self.violations.extend(f"{where}: {p}" for p in problems)

    def _authorized(self, handler: _Handler, account: str) -> bool:
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

    def handle_create(self, handler: _Handler) -> None:
        self.hits += 1
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
            handler.reply(429, _error(429, 20429, "Too Many Requests"))
        elif outcome == "error":
            handler.reply(500, _error(500, 20500, "Internal Server Error"))
        else:
            resource = self._create(form)
            if outcome == "hangup":
                handler.hang_up()
                return
            if outcome == "stall":
                self.released.wait(10)
            self._check(CREATED, resource, "201 reply")
            handler.reply(201, resource)

    def _create(self, form: dict[str, Any]) -> dict[str, Any]:
        sid = "SM" + uuid.uuid4().hex
        now = email.utils.format_datetime(datetime.now(UTC))
        resource = {
            "account_sid": ACCOUNT_SID,
            "api_version": "2010-04-01",
            "body": form["Body"],
            "date_created": now,
            "date_sent": None,
            "date_updated": now,
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
        self.messages[sid] = resource
        return resource

    def _check(self, validator: Any, resource: dict[str, Any], where: str) -> None:
        self._violate(where, [e.message for e in validator.iter_errors(resource)])

    def handle_fetch(self, handler: _Handler) -> None:
        self.hits += 1
        handler.read_body()
        match = re.fullmatch(r"/2010-04-01/Accounts/([^/]+)/Messages/([^/]+)\.json", handler.path)
        if match is None:
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
        if outcome == "hangup":
            handler.hang_up()
        elif outcome == "error":
            handler.reply(503, _error(503, None, "Service Unavailable"))
        elif sid not in self.messages:
            handler.reply(404, not_found)
        else:
            self._check(FETCHED, self.messages[sid], "200 reply")
            handler.reply(200, self.messages[sid])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def fake() -> Iterator[FakeTwilio]:
    server = FakeTwilio()
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


MakeTransport = Callable[..., TwilioTransport]


@pytest.fixture
def make_transport(
    fake: FakeTwilio, store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> Iterator[MakeTransport]:
    """Build a transport through the plugin factory, as a sweep would."""
    built: list[TwilioTransport] = []

    def make(**options: Any) -> TwilioTransport:
        table: dict[str, Any] = {"base_url": fake.base_url, "from": SENDER}
        table.update(options)
        table = {key: value for key, value in table.items() if value is not None}
        secrets = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
        context = TransportContext("twilio", "sms", table, secrets.get, store, clock)
        transport = PLUGIN.create(context)
        assert isinstance(transport, TwilioTransport)
        built.append(transport)
        return transport

    yield make
    for transport in built:
        transport.close()


@dataclass
class TwilioHarness:
    transport: TwilioTransport
    plugin: TransportPlugin
    fake: FakeTwilio
    caplog: pytest.LogCaptureFixture
    channel: str = "sms"
    reports_later_statuses: bool = True

    def message(self) -> Message:
        return sms_message()

    def script(self, outcome: str) -> None:
        scripted = {
            "accept": "accept",
            "reject": "reject",
            "transient": "error",
            "ambiguous": "hangup",
        }
        self.fake.outcomes.append(scripted[outcome])

    def report(self, message_id: str, outcome: str) -> None:
        self.fake.set_status(
            message_id, {"delivered": "delivered", "failed": "undelivered"}[outcome]
        )

    def logs(self) -> str:
        return self.caplog.text


class TestTwilioContract(TransportContract):
    @pytest.fixture
    def harness(
        self, fake: FakeTwilio, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
    ) -> TwilioHarness:
        return TwilioHarness(make_transport(), PLUGIN, fake, logs)


def _expiring_in(seconds: float) -> Message:
    return sms_message(expires_at=T0 + seconds)


@pytest.mark.parametrize(
    ("options", "sender", "initial"),
    [
        ({}, {"From": SENDER}, "queued"),
        (
            {"from": None, "messaging_service_sid": SERVICE_SID, "status_callback": CALLBACK_URL},
            {"MessagingServiceSid": SERVICE_SID, "StatusCallback": CALLBACK_URL},
            "accepted",
        ),
    ],
    ids=["from", "messaging-service"],
)
def test_create_request_is_the_documented_form(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    options: dict[str, Any],
    sender: dict[str, str],
    initial: str,
) -> None:
    """The create is a spec-valid form with To, the sender, Body and ValidityPeriod."""
    message = _expiring_in(600)
    assert message.sms is not None
    reply = make_transport(**options).submit(message, "ntc_1:sms:1")
    expected = {"To": SECRET_PHONE, "Body": message.sms.body, "ValidityPeriod": 600, **sender}
    assert fake.requests == [expected]
    assert reply.message_id in fake.messages
    # Twilio's documented initial status: queued, or accepted through a messaging service.
    assert (reply.raw_status, reply.status) == (initial, Status.PENDING)


@pytest.mark.parametrize(
    ("lifetime", "validity"),
    [
        (600.7, 600),
        (1.0, 1),
        (1.99, 1),
        (36_000.0, 36_000),
        (36_000.9, 36_000),
        (86_400.0, VALIDITY_PERIOD_MAX),
    ],
)
def test_validity_period_is_the_remaining_lifetime_clamped(
    fake: FakeTwilio, make_transport: MakeTransport, lifetime: float, validity: int
) -> None:
    """ValidityPeriod is the link's whole seconds left, within Twilio's 1 to 36000."""
    make_transport().submit(_expiring_in(lifetime), "ntc_1:sms:1")
    assert fake.requests[-1]["ValidityPeriod"] == validity


def test_validity_period_reads_the_clock_at_submission(
    fake: FakeTwilio, make_transport: MakeTransport, clock: FakeClock
) -> None:
    """Time spent before the submission is taken off the ValidityPeriod."""
    transport = make_transport()
    clock.advance(100)
    transport.submit(_expiring_in(600), "ntc_1:sms:1")
    assert fake.requests[-1]["ValidityPeriod"] == 500


@pytest.mark.parametrize("lifetime", [0.99, 0.0, -30.0])
def test_dead_link_is_refused_without_a_request(
    fake: FakeTwilio, make_transport: MakeTransport, lifetime: float
) -> None:
    """A link with under a second to live is a permanent refusal and never reaches Twilio."""
    with pytest.raises(PermanentError) as raised:
        make_transport().submit(_expiring_in(lifetime), "ntc_1:sms:1")
    assert fake.hits == 0
    _no_secrets(f"{raised.value!s} {raised.value!r}")


STATUS_TABLE = [
    ("queued", Status.PENDING),
    ("accepted", Status.PENDING),
    ("scheduled", Status.PENDING),
    ("sending", Status.PENDING),
    ("sent", Status.ACCEPTED),
    ("delivered", Status.DELIVERED),
    ("read", Status.DELIVERED),
    ("failed", Status.FAILED),
    ("undelivered", Status.FAILED),
    ("canceled", Status.FAILED),
    ("receiving", Status.UNKNOWN),
    ("received", Status.UNKNOWN),
    ("partially_delivered", Status.UNKNOWN),
]


def test_status_table_covers_every_documented_status() -> None:
    """The transport knows exactly the statuses Twilio's spec lists; the table covers them."""
    assert frozenset(raw for raw, _ in STATUS_TABLE) == DOCUMENTED_STATUSES == TWILIO_STATUSES
    assert plugin("twilio") is PLUGIN
    assert PLUGIN.vocabulary.known == TWILIO_STATUSES
    assert normalize("some_status_twilio_adds_later") is Status.UNKNOWN


@pytest.mark.parametrize(("raw", "expected"), STATUS_TABLE)
def test_status_read_maps_each_documented_status(
    fake: FakeTwilio, make_transport: MakeTransport, raw: str, expected: Status
) -> None:
    """A fetched Message's status normalizes as the table says."""
    transport = make_transport()
    sid = transport.submit(sms_message(), "ntc_1:sms:1").message_id
    fake.set_status(sid, raw)
    reply = transport.status(sid)
    assert (reply.message_id, reply.raw_status, reply.status) == (sid, raw, expected)
    assert PLUGIN.vocabulary.normalize(raw) is expected


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        ("throttle", TransientError),
        ("error", TransientError),
        ("hangup", AmbiguousError),
        ("stall", AmbiguousError),
    ],
)
def test_submit_failures_are_classified(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    logs: pytest.LogCaptureFixture,
    outcome: str,
    error: type[Exception],
) -> None:
    """429 and 5xx are transient; a lost reply or read time-out is ambiguous, sent once."""
    transport = make_transport(read_timeout=0.05)
    fake.outcomes.append(outcome)
    with pytest.raises(error) as raised:
        transport.submit(sms_message(), "ntc_1:sms:1")
    assert len(fake.requests) == 1
    # Ambiguity is real: Twilio created the message whose reply was lost.
    assert len(fake.messages) == (1 if error is AmbiguousError else 0)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


def test_refused_connection_is_transient(
    make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """Nothing listening means nothing reached Twilio: transient, for a status read too."""
    transport = make_transport(base_url=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(TransientError) as raised:
        transport.submit(sms_message(), "ntc_1:sms:1")
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")
    with pytest.raises(TransientError):
        transport.status("SM" + "0" * 32)


def test_rejection_carries_the_code_but_not_twilios_message(
    fake: FakeTwilio, make_transport: MakeTransport, logs: pytest.LogCaptureFixture
) -> None:
    """A 400 is permanent with Twilio's code; its text, which quotes the number, is dropped."""
    fake.outcomes.append("reject")
    with pytest.raises(TwilioRefused) as raised:
        make_transport().submit(sms_message(), "ntc_1:sms:1")
    assert raised.value.code == 21211
    assert raised.value.http_status == 400
    assert "21211" in str(raised.value)
    assert "To number" in str(raised.value)
    _no_secrets(f"{raised.value!s} {raised.value!r} {logs.text}")


def test_wrong_credentials_are_refused_without_echoing_the_token(
    fake: FakeTwilio, store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    """A 401 is permanent with code 20003, and neither token appears anywhere."""
    wrong = "wrong-token-canary-0c55"
    transport = TwilioTransport(
        ACCOUNT_SID, wrong, sender=SENDER, base_url=fake.base_url, clock=clock
    )
    try:
        with pytest.raises(TwilioRefused) as raised:
            transport.submit(sms_message(), "ntc_1:sms:1")
        assert raised.value.code == 20003
        text = f"{raised.value!s} {raised.value!r} {transport!r} {logs.text}"
        _no_secrets(text)
        assert wrong not in text
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("outcome", "error", "code"),
    [
        ("error", TransientError, None),
        ("hangup", TransientError, None),
        ("unknown", TwilioRefused, 20404),
    ],
)
def test_status_read_failures_are_classified(
    fake: FakeTwilio,
    make_transport: MakeTransport,
    outcome: str,
    error: type[Exception],
    code: int | None,
) -> None:
    """A failed read is transient (reads are safe to repeat); an unknown sid is permanent."""
    transport = make_transport()
    sid = transport.submit(sms_message(), "ntc_1:sms:1").message_id
    if outcome == "unknown":
        sid = "SM" + "9" * 32
    else:
        fake.fetch_outcomes.append(outcome)
    with pytest.raises(error) as raised:
        transport.status(sid)
    assert getattr(raised.value, "code", None) == code


@pytest.mark.parametrize(
    ("failure", "on_submit"),
    [
        (httpx.ConnectError, TransientError),
        (httpx.ConnectTimeout, TransientError),
        (httpx.PoolTimeout, TransientError),
        (httpx.WriteTimeout, AmbiguousError),
        (httpx.WriteError, AmbiguousError),
        (httpx.ReadTimeout, AmbiguousError),
        (httpx.ReadError, AmbiguousError),
        (httpx.RemoteProtocolError, AmbiguousError),
    ],
)
def test_every_httpx_failure_is_classified(
    clock: FakeClock, failure: type[httpx.TransportError], on_submit: type[Exception]
) -> None:
    """Only failures before the request left are transient on submit; all are on a read."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise failure(f"simulated, for {SECRET_PHONE}", request=request)

    transport = TwilioTransport(
        ACCOUNT_SID,
        AUTH_TOKEN,
        sender=SENDER,
        clock=clock,
        transport=httpx.MockTransport(fail),
    )
    try:
        with pytest.raises(on_submit) as raised:
            transport.submit(sms_message(), "ntc_1:sms:1")
        _no_secrets(f"{raised.value!s} {raised.value!r}")
        with pytest.raises(TransientError):
            transport.status("SM" + "0" * 32)
    finally:
        transport.close()


def test_created_reply_without_a_sid_is_ambiguous(clock: FakeClock) -> None:
    """A 2xx that cannot be read still means Twilio has the message: ambiguous, not resent."""
    transport = TwilioTransport(
        ACCOUNT_SID,
        AUTH_TOKEN,
        sender=SENDER,
        clock=clock,
        transport=httpx.MockTransport(lambda request: httpx.Response(201, text="<html>")),
    )
    try:
        with pytest.raises(AmbiguousError):
            transport.submit(sms_message(), "ntc_1:sms:1")
    finally:
        transport.close()


def _build(twilio: dict[str, Any], environ: dict[str, str], store: Store) -> TwilioTransport:
    settings = settings_from_mapping({"transport": {"sms": "twilio"}, "twilio": twilio})
    transport = build_transports(settings, store, FakeClock(), environ)["sms"]
    assert isinstance(transport, TwilioTransport)
    return transport


def test_missing_auth_token_is_a_config_error_naming_it(store: Store) -> None:
    """No TWILIO_AUTH_TOKEN fails the build, naming the variable and no value."""
    with pytest.raises(ConfigError) as raised:
        _build({"from": SENDER}, {"TWILIO_ACCOUNT_SID": ACCOUNT_SID}, store)
    assert "TWILIO_AUTH_TOKEN" in str(raised.value)
    assert ACCOUNT_SID not in str(raised.value)


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({}, "twilio.from"),
        ({"from": SENDER, "messaging_service_sid": SERVICE_SID}, "twilio.from"),
        ({"messaging_service_sid": "MG123"}, "twilio.messaging_service_sid"),
        ({"from": SENDER, "read_timeout": 0}, "twilio.read_timeout"),
        ({"from": SENDER, "connect_timeout": "5"}, "twilio.connect_timeout"),
        ({"from": SENDER, "status_callback": "hooks.example/x"}, "twilio.status_callback"),
        ({"from": SENDER, "base_url": "ftp://api.twilio.com"}, "twilio.base_url"),
        ({"from": SENDER, "sender": SENDER}, "twilio.sender"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(
    store: Store, table: dict[str, Any], names: str
) -> None:
    """Each invalid [twilio] option fails the build with its dotted name."""
    secrets = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
    with pytest.raises(ConfigError, match=re.escape(names)) as raised:
        _build(table, secrets, store)
    _no_secrets(str(raised.value))


def test_credentials_file_supplies_the_secrets(
    fake: FakeTwilio, store: Store, tmp_path: Path
) -> None:
    """Secrets from the TOML credentials_file authenticate against Twilio."""
    credentials = tmp_path / "twilio.toml"
    credentials.write_text(
        f'TWILIO_ACCOUNT_SID = "{ACCOUNT_SID}"\nTWILIO_AUTH_TOKEN = "{AUTH_TOKEN}"\n'
    )
    credentials.chmod(0o600)  # resetctl refuses a credentials file others can read
    table = {"from": SENDER, "base_url": fake.base_url, "credentials_file": str(credentials)}
    transport = _build(table, {}, store)
    try:
        reply = transport.submit(sms_message(), "ntc_1:sms:1")
        assert reply.message_id in fake.messages
        _no_secrets(repr(transport))
    finally:
        transport.close()


#: Twilio's published signature example: auth token 12345 and this URL and these
#: params. The vector with +14158675309 is the one in twilio-python's validator tests;
#: the one with +12349013030 is in Twilio's webhooks-security documentation.
VECTOR_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"


def _vector_params(caller: str) -> dict[str, str]:
    return {
        "CallSid": "CA1234567890ABCDE",
        "Caller": caller,
        "Digits": "1234",
        "From": caller,
        "To": "+18005551212",
    }


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ("+14158675309", "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
        ("+12349013030", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="),
    ],
)
def test_twilios_published_signature_verifies(caller: str, expected: str) -> None:
    """Twilio's own example request and signature verify."""
    params = _vector_params(caller)
    assert compute_signature(VECTOR_URL, params, "12345") == expected
    assert verify_signature(VECTOR_URL, params, expected, "12345")


def _altered(params: dict[str, str], **changes: str) -> dict[str, str]:
    return {**params, **changes}


@pytest.mark.parametrize(
    ("url", "params", "signature", "token"),
    [
        (VECTOR_URL, _vector_params("+14158675309"), "RSOYDt4T1cUTdK1PDd93/VVr8B8x", "12345"),
        (VECTOR_URL, _vector_params("+14158675309"), "", "12345"),
        (VECTOR_URL, _altered(_vector_params("+14158675309"), Digits="1235"), None, "12345"),
        (VECTOR_URL, _altered(_vector_params("+14158675309"), Extra="1"), None, "12345"),
        (VECTOR_URL.replace("foo=1", "foo=2"), _vector_params("+14158675309"), None, "12345"),
        (VECTOR_URL.replace("https", "http"), _vector_params("+14158675309"), None, "12345"),
        (VECTOR_URL, _vector_params("+14158675309"), None, "12346"),
        (VECTOR_URL, _vector_params("+14158675309"), "RSOYDt4T1cUTdK1PDd93/VVr8B8=é", "12345"),
    ],
    ids=[
        "forged",
        "empty",
        "param-changed",
        "param-added",
        "url-changed",
        "scheme-changed",
        "wrong-token",
        "non-ascii",
    ],
)
def test_forged_or_altered_signatures_are_refused(
    url: str, params: dict[str, str], signature: str | None, token: str
) -> None:
    """Any change to the URL, a param, the token or the signature fails verification."""
    published = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    assert not verify_signature(url, params, published if signature is None else signature, token)


#: A status callback as Twilio posts it (form-encoded), for an SMS through a number.
CALLBACK_BODY = (
    "ApiVersion=2010-04-01&AccountSid=AC0123456789abcdef0123456789abcdef"
    "&SmsSid=SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801&SmsStatus=delivered"
    "&MessageSid=SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801&MessageStatus=delivered"
    "&From=%2B15005550006&To=%2B61491570157&RawDlrDoneDate=2601011200"
)


def test_callback_status_reads_a_signed_callback_body() -> None:
    """A real-shaped callback body gives (MessageSid, MessageStatus) and its signature checks."""
    params = dict(parse_qsl(CALLBACK_BODY, keep_blank_values=True))
    assert callback_status(params) == ("SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801", "delivered")
    signed = compute_signature(CALLBACK_URL, params, AUTH_TOKEN)
    assert verify_signature(CALLBACK_URL, params, signed, AUTH_TOKEN)
    assert not verify_signature(
        CALLBACK_URL, {**params, "MessageStatus": "failed"}, signed, AUTH_TOKEN
    )


@pytest.mark.parametrize("missing", ["MessageSid", "MessageStatus"])
def test_callback_status_names_a_missing_field(missing: str) -> None:
    """A callback body without MessageSid or MessageStatus is a ValueError naming it."""
    params = dict(parse_qsl(CALLBACK_BODY))
    del params[missing]
    with pytest.raises(ValueError, match=missing):
        callback_status(params)


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"From": SENDER, "Body": "x"}, "'To' is a required property"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "ValidityPeriod": "ten"}, "integer"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "ValidityPeriod": "0"}, "36000"),
        ({"To": SECRET_PHONE, "MessagingServiceSid": "MG1", "Body": "x"}, "MessagingServiceSid"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "Validity": "60"}, "Validity:"),
        ({"To": SECRET_PHONE, "From": SENDER, "Body": "x", "StatusCallback": "a_b"}, "uri"),
    ],
)
def test_fake_twilio_refuses_off_spec_requests(
    fake: FakeTwilio, form: dict[str, str], problem: str
) -> None:
    """The fake's spec check has teeth: an off-spec create is a 400 and a recorded violation."""
    url = f"{fake.base_url}/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    with httpx.Client(auth=(ACCOUNT_SID, AUTH_TOKEN)) as client:
        assert client.post(url, data=form).status_code == 400
    assert any(problem in violation for violation in fake.violations), fake.violations
    fake.violations.clear()
