"""Amazon SES through its SMTP interface, as an smtp instance: a real aiosmtpd server on
loopback that speaks STARTTLS, takes SMTP credentials by AUTH and answers with the exact
replies SES documents, each classified as the kind it is.

It follows these AWS pages:

- https://docs.aws.amazon.com/ses/latest/dg/smtp-connect.html (STARTTLS on 25, 587 or
  2587; TLS Wrapper on 465 or 2465; every connection encrypted)
- https://docs.aws.amazon.com/ses/latest/dg/smtp-response-codes.html (and
  troubleshoot-smtp.html: the reply codes and texts the SMTP interface returns)
- https://docs.aws.amazon.com/ses/latest/dg/manage-sending-quotas-errors.html (the 454
  throttles: SES drops the message and does not attempt to redeliver it)
- https://docs.aws.amazon.com/ses/latest/dg/header-fields.html (SES replaces Message-ID)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from conftest import FakeClock
from contract import SECRET_EMAIL, SECRET_URL, email_message
from smtp_relay import free_port

from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports import (
    AmbiguousError,
    PermanentError,
    ThrottledError,
    TransientError,
    TransportContext,
    TransportError,
)
from resetctl.transports.smtp import DAILY_QUOTA_PAUSE, PLUGIN, SmtpTransport

#: SMTP credentials as SES issues them: an IAM access key id as the user name and a
#: password derived from the secret key (not the AWS secret key itself).
SMTP_USERNAME = "AKIAIOSFODNN7EXAMPLE"
SMTP_PASSWORD = "BH5sUCCgC4cZsCANARYgLtaCu3Ux0c7aMiQjEXAMPLE"
SENDER = "no-reply@shop.example"
REGION = "eu-west-1"

# SES's reply texts, exactly as its SMTP response code table gives them.
RATE = "454 Throttling failure: Maximum sending rate exceeded"
QUOTA = "454 Throttling failure: Daily message quota exceeded"
SERVICE_454 = "454 Temporary service failure"
SERVICE_451 = "451 Temporary service failure"
AUTH_454 = "454 Temporary authentication failure"
AUTH_535 = "535 Authentication Credentials Invalid"
NOT_SUBSCRIBED = "535 Account not subscribed to SES"
BUSY = "421 Too many concurrent SMTP connections"
ACCESS_DENIED = (
    "554 Access denied: User arn:aws:iam::123456789012:user/ses-smtp-user is not"
    " authorized to perform ses:SendRawEmail on resource"
    f" arn:aws:ses:{REGION}:123456789012:identity/shop.example"
)


def not_verified(*identities: str) -> str:
    """SES's refusal of an unverified identity: it lists them (the recipient too, in
    the sandbox)."""
    return (
        "554 Message rejected: Email address is not verified. The following identities"
        f" failed the check in region {REGION.upper()}: {', '.join(identities)}"
    )


@dataclass
class SesHandler:
    """Answers as SES does; ``at`` says which step gives ``reply`` (else it accepts)."""

    reply: str = ""
    at: str = ""
    received: list[EmailMessage] = field(default_factory=list)

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.at == "MAIL":
            return self.reply
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 Ok"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.at == "RCPT":
            return self.reply
        envelope.rcpt_tos.append(address)
        return "250 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.at == "content":
            return self.reply
        if self.at == "drop":
            # The content has arrived; the connection dies before the final reply.
            assert server.transport is not None
            server.transport.close()
            return "250 Ok"
        assert isinstance(envelope.original_content, bytes)
        parsed = BytesParser(policy=default_policy).parsebytes(envelope.original_content)
        assert isinstance(parsed, EmailMessage)
        self.received.append(parsed)
        return "250 Ok 0102018d2f7a6b1c-4d1e0f2a-9b8c-4a7d-8e6f-5c4b3a2d1e0f-000000"


@dataclass
class SesAuth:
    """SES's check of SMTP credentials: the right pair passes; ``refusal`` answers all."""

    refusal: str = ""

    def __call__(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if self.refusal:
            return AuthResult(success=False, handled=False, message=self.refusal)
        good = (
            isinstance(data, LoginPassword)
            and data.login == SMTP_USERNAME.encode()
            and data.password == SMTP_PASSWORD.encode()
        )
        return AuthResult(success=good, handled=False, message=None if good else AUTH_535)


class BusySMTP(SMTP):
    """SES with too many connections open: it greets with 421 and hangs up."""

    async def _handle_client(self) -> None:
        await self.push(BUSY)
        assert self.transport is not None
        self.transport.close()


class BusyController(Controller):
    def factory(self) -> SMTP:
        return BusySMTP(self.handler, **self.SMTP_kwargs)


@dataclass(frozen=True)
class Tls:
    ca_file: str
    server: Any


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    import ssl

    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    return Tls(str(ca_file), server)


@contextmanager
def ses_endpoint(
    handler: SesHandler, tls: Tls, auth: SesAuth | None = None, *, busy: bool = False
) -> Iterator[int]:
    """An SES-like endpoint on loopback: STARTTLS required, AUTH required over TLS."""
    port = free_port()
    kind = BusyController if busy else Controller
    controller = kind(
        handler,
        hostname="127.0.0.1",
        port=port,
        server_hostname="localhost",
        tls_context=tls.server,
        require_starttls=True,
        authenticator=auth or SesAuth(),
        auth_required=True,
        auth_require_tls=True,
    )
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


MakeTransport = Callable[..., SmtpTransport]


def ses_instance(
    store: Store, clock: FakeClock, table: Mapping[str, Any], environ: Mapping[str, str]
) -> SmtpTransport:
    """The smtp kind built for an instance named ses_eu, as [providers.ses_eu] builds it."""
    context = TransportContext(
        "ses_eu", "email", table, environ.get, store, clock, where="providers.ses_eu"
    )
    built = PLUGIN.create(context)
    assert isinstance(built, SmtpTransport)
    return built


@pytest.fixture
def make_transport(store: Store, clock: FakeClock, tls: Tls) -> MakeTransport:
    """An smtp instance configured as the SES readme says, aimed at the loopback endpoint."""

    def make(port: int, environ: Mapping[str, str] | None = None, **options: Any) -> SmtpTransport:
        table = {
            "host": "127.0.0.1",
            "port": port,
            "security": "starttls",
            "username": SMTP_USERNAME,
            "from": f"Shop <{SENDER}>",
            "ca_file": tls.ca_file,
            "timeout": 5.0,
            **options,
        }
        secrets = {"RESETCTL_SMTP_PASSWORD": SMTP_PASSWORD} if environ is None else environ
        return ses_instance(store, clock, table, secrets)

    return make


def assert_quiet(error: BaseException, *extra: str) -> None:
    text = f"{error!s} {error!r}"
    for secret in (SECRET_EMAIL, SECRET_URL, SMTP_PASSWORD, "arn:aws", *extra):
        assert secret not in text


def submit_failing(
    make_transport: MakeTransport, handler: SesHandler, tls: Tls, error: type[TransportError]
) -> TransportError:
    with ses_endpoint(handler, tls) as port, pytest.raises(error) as raised:
        make_transport(port).submit(email_message(), "ntc_ses:email:1")
    assert_quiet(raised.value)
    assert handler.received == []
    return raised.value


def test_ses_accepts_over_starttls_with_smtp_credentials(
    make_transport: MakeTransport, tls: Tls
) -> None:
    """STARTTLS, AUTH with the SMTP credentials, then SES's "250 Ok <id>": accepted, final."""
    handler = SesHandler()
    with ses_endpoint(handler, tls) as port:
        transport = make_transport(port)
        reply = transport.submit(email_message(), "ntc_ses:email:1")
    assert (reply.raw_status, reply.status) == ("250", Status.ACCEPTED)
    assert transport.status(reply.message_id).status is Status.ACCEPTED
    [mail] = handler.received
    assert mail["To"] == SECRET_EMAIL
    assert "X-SES-CONFIGURATION-SET" not in mail


def test_the_configuration_set_travels_as_its_header(
    make_transport: MakeTransport, tls: Tls
) -> None:
    """ses_configuration_set puts X-SES-CONFIGURATION-SET on every message, as SES reads it."""
    handler = SesHandler()
    with ses_endpoint(handler, tls) as port:
        make_transport(port, ses_configuration_set="reset-notices_eu").submit(
            email_message(), "ntc_ses:email:1"
        )
    [mail] = handler.received
    assert mail.get_all("X-SES-CONFIGURATION-SET") == ["reset-notices_eu"]


@pytest.mark.parametrize(
    "name", ["", "a" * 65, "has space", "set\r\nBcc: someone@example.org", "sét", "a.b"]
)
def test_a_configuration_set_outside_ses_naming_rules_is_refused(
    make_transport: MakeTransport, name: str
) -> None:
    """Only SES's names (64 letters, digits, "_", "-") can reach the header: no injection."""
    with pytest.raises(ConfigError, match=r"ses_eu\.ses_configuration_set: expected"):
        make_transport(free_port(), ses_configuration_set=name)


@pytest.mark.parametrize("step", ["MAIL", "RCPT", "content"])
def test_the_sending_rate_throttle_pauses_the_lane(
    make_transport: MakeTransport, tls: Tls, step: str
) -> None:
    """ "454 Throttling failure: Maximum sending rate exceeded" wherever SES says it: throttled."""
    error = submit_failing(make_transport, SesHandler(RATE, step), tls, ThrottledError)
    assert isinstance(error, ThrottledError)
    assert error.retry_after is None
    assert error.kind == "transient"


def test_the_daily_quota_throttle_pauses_the_lane_for_long(
    make_transport: MakeTransport, tls: Tls
) -> None:
    """The daily quota will not come back in a second: the lane pauses DAILY_QUOTA_PAUSE."""
    error = submit_failing(make_transport, SesHandler(QUOTA, "content"), tls, ThrottledError)
    assert isinstance(error, ThrottledError)
    assert error.retry_after == DAILY_QUOTA_PAUSE


@pytest.mark.parametrize(
    ("reply", "step"),
    [(SERVICE_454, "content"), (SERVICE_451, "content"), (SERVICE_451, "MAIL")],
)
def test_temporary_service_failures_are_transient_not_throttles(
    make_transport: MakeTransport, tls: Tls, reply: str, step: str
) -> None:
    """SES's 451/454 "Temporary service failure": nothing was sent, retry; no lane pause."""
    error = submit_failing(make_transport, SesHandler(reply, step), tls, TransientError)
    assert not isinstance(error, ThrottledError)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (not_verified(SENDER, SECRET_EMAIL), PermanentError),
        (ACCESS_DENIED, PermanentError),
    ],
    ids=["not-verified", "access-denied"],
)
def test_ses_refusals_after_the_content_are_permanent_and_not_quoted(
    make_transport: MakeTransport, tls: Tls, reply: str, error: type[TransportError]
) -> None:
    """An unverified identity or a denied IAM user: permanent, and SES's text (naming the
    recipient and the account's ARNs) goes nowhere."""
    raised = submit_failing(make_transport, SesHandler(reply, "content"), tls, error)
    assert "554" in str(raised)


@pytest.mark.parametrize(
    ("refusal", "error", "words"),
    [
        (AUTH_535, PermanentError, r"AUTH refused \(535\)"),
        (NOT_SUBSCRIBED, PermanentError, r"AUTH refused \(535\)"),
        (AUTH_454, TransientError, r"AUTH not accepted \(454\)"),
    ],
)
def test_ses_auth_replies_decide_the_kind(
    make_transport: MakeTransport,
    tls: Tls,
    refusal: str,
    error: type[TransportError],
    words: str,
) -> None:
    """Bad or unsubscribed credentials are permanent; SES's own auth hiccup (454) transient."""
    handler = SesHandler()
    with ses_endpoint(handler, tls, SesAuth(refusal)) as port, pytest.raises(error, match=words):
        make_transport(port).submit(email_message(), "ntc_ses:email:1")
    assert handler.received == []


def test_sending_without_credentials_is_permanent(store: Store, clock: FakeClock, tls: Tls) -> None:
    """No username: SES answers MAIL with "530 Authentication required", a permanent refusal."""
    handler = SesHandler()
    with ses_endpoint(handler, tls) as port:
        table = {"host": "127.0.0.1", "port": port, "from": SENDER, "ca_file": tls.ca_file}
        transport = ses_instance(store, clock, table, {})
        with pytest.raises(PermanentError, match=r"MAIL FROM refused \(530\)"):
            transport.submit(email_message(), "ntc_ses:email:1")
    assert handler.received == []


def test_too_many_connections_at_the_greeting_is_a_throttle(
    make_transport: MakeTransport, tls: Tls
) -> None:
    """ "421 Too many concurrent SMTP connections" greeting: nothing sent, the lane pauses."""
    handler = SesHandler()
    with (
        ses_endpoint(handler, tls, busy=True) as port,
        pytest.raises(ThrottledError, match="421") as raised,
    ):
        make_transport(port).submit(email_message(), "ntc_ses:email:1")
    assert raised.value.retry_after is None
    assert handler.received == []


def test_a_connection_lost_after_the_content_is_ambiguous(
    make_transport: MakeTransport, tls: Tls
) -> None:
    """SES may have queued it: no reply to the content is ambiguous (SES has no lookup)."""
    with ses_endpoint(SesHandler(at="drop"), tls) as port, pytest.raises(AmbiguousError) as raised:
        make_transport(port).submit(email_message(), "ntc_ses:email:1")
    assert_quiet(raised.value)


def test_missing_smtp_password_fails_at_build(make_transport: MakeTransport) -> None:
    """The SMTP password comes from RESETCTL_SMTP_PASSWORD (or credentials_file) only."""
    with pytest.raises(ConfigError, match="RESETCTL_SMTP_PASSWORD"):
        make_transport(free_port(), environ={})
