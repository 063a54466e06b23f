"""The SMTP transport against a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import asyncio
import email
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from conftest import FakeClock
from contract import SECRET_EMAIL, SECRET_URL, TransportContract, email_message
from smtp_relay import free_port

from resetctl.config import settings_from_mapping
from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.render import EmailContent
from resetctl.store import Store
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    TransientError,
    TransportError,
    TransportPlugin,
    build_transports,
    plugin,
)
from resetctl.transports.base import call_timeout
from resetctl.transports.smtp import DEFAULT_TIMEOUT, SmtpTransport, message_id_for, normalize

SENDER = "no-reply@shop.example"
USERNAME = "resetctl"
PASSWORD = "relay-pw-CANARY-5b7e"

#: A whole-call time-out short enough to wait out in a test.
TINY_TIMEOUT = 0.3
#: The "slow" relay's delay before each reply: under TINY_TIMEOUT, so only a deadline
#: for the whole call (not smtplib's per-wait time-out) stops a conversation of them.
SLOW_REPLY = 0.25
#: The longest the "stall-content" relay holds its reply back (the client leaves first).
STALL_LIMIT = 5.0
#: What a submission may take past its deadline: closing up, and a busy machine.
OVERRUN = 0.2


@dataclass
class ScriptedHandler:
    """An aiosmtpd handler whose transactions end as scripted; it records what it took."""

    outcome: str = "accept"
    received: list[EmailMessage] = field(default_factory=list)
    envelopes: list[tuple[str | None, list[str]]] = field(default_factory=list)

    async def _pace(self) -> None:
        if self.outcome == "slow":
            await asyncio.sleep(SLOW_REPLY)

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        await self._pace()
        # aiosmtpd leaves recording the name to a handler that hooks EHLO.
        session.host_name = hostname
        return responses

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        await self._pace()
        if self.outcome == "refuse-sender":
            return "550 5.7.1 sender not allowed"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        await self._pace()
        # Real relays quote the address in refusals: the transport must not pass it on.
        if self.outcome == "reject":
            return f"550 5.1.1 <{address}>: Recipient address rejected"
        if self.outcome == "transient":
            return f"451 4.3.0 <{address}>: try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await self._pace()
        if self.outcome == "stall-content":
            # The content has arrived; the reply comes late (the client gives up first,
            # and its leaving cancels this handler).
            await asyncio.sleep(STALL_LIMIT)
        if self.outcome == "ambiguous":
            # The content has arrived; the connection dies before the final reply.
            assert server.transport is not None
            server.transport.close()
            # connection_lost cancels this handler: until then, say nothing.
            await asyncio.Event().wait()
        if self.outcome == "defer-content":
            return "451 4.3.0 queue full"
        if self.outcome == "refuse-content":
            return "554 5.6.0 message refused"
        assert isinstance(envelope.original_content, bytes)
        parsed = email.message_from_bytes(envelope.original_content, policy=default_policy)
        assert isinstance(parsed, EmailMessage)
        self.received.append(parsed)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 2.0.0 OK queued"


def _authenticator(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
) -> AuthResult:
    accepted = (
        isinstance(auth_data, LoginPassword)
        and auth_data.login == USERNAME.encode()
        and auth_data.password == PASSWORD.encode()
    )
    # handled=False lets aiosmtpd answer a failure with its own 535.
    return AuthResult(success=accepted, handled=False)


@contextmanager
def serve(handler: ScriptedHandler, **smtp_options: Any) -> Iterator[int]:
    """Run an SMTP server on a free loopback port; yields the port."""
    port = free_port()
    # server_hostname spares aiosmtpd a reverse DNS lookup of this machine.
    controller = Controller(
        handler, hostname="127.0.0.1", port=port, server_hostname="localhost", **smtp_options
    )
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


@dataclass(frozen=True)
class Tls:
    """A throwaway CA's bundle and a server context with a certificate for loopback."""

    ca_file: str
    server: ssl.SSLContext


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    return Tls(str(ca_file), server)


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture
def plain_port(handler: ScriptedHandler) -> Iterator[int]:
    with serve(handler) as port:
        yield port


MakeTransport = Callable[..., SmtpTransport]


@pytest.fixture
def make_transport(store: Store, clock: FakeClock) -> MakeTransport:
    """Build the email transport the way a sweep does, from a config mapping."""

    def make(environ: Mapping[str, str] | None = None, **options: Any) -> SmtpTransport:
        table = {"host": "127.0.0.1", "from": f"Shop <{SENDER}>", "timeout": 5.0, **options}
        settings = settings_from_mapping({"transport": {"email": "smtp"}, "smtp": table})
        built = build_transports(settings, store, clock, environ or {})["email"]
        assert isinstance(built, SmtpTransport)
        return built

    return make


def _no_secrets(error: BaseException, *extra: str) -> None:
    text = f"{error!s} {error!r}"
    for secret in (SECRET_EMAIL, SECRET_URL, PASSWORD, *extra):
        assert secret not in text


def test_accepted_message_is_transactional_multipart(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """A 250 after DATA is accepted; the mail is text+HTML with a transactional header set."""
    transport = make_transport(port=plain_port, security="none")
    reply = transport.submit(email_message(), "ntc_1:email:1")
    assert (reply.raw_status, reply.status) == ("250", Status.ACCEPTED)
    assert reply.message_id == message_id_for("ntc_1:email:1", "shop.example")
    [mail] = handler.received
    assert handler.envelopes == [(SENDER, [SECRET_EMAIL])]
    assert mail.get_content_type() == "multipart/alternative"
    text, html = mail.iter_parts()
    assert text.get_content_type() == "text/plain"
    assert html.get_content_type() == "text/html"
    assert SECRET_URL in text.get_content()
    assert f'href="{SECRET_URL}"' in html.get_content()
    assert mail["Message-ID"] == reply.message_id
    assert mail["To"] == SECRET_EMAIL
    assert mail["From"] == f"Shop <{SENDER}>"
    assert mail["Subject"] == "Your password reset link (expires in 10 min)"
    assert mail["Date"]
    assert mail["Auto-Submitted"] == "auto-generated"
    assert mail["X-Auto-Response-Suppress"] == "All"
    assert "List-Unsubscribe" not in mail


def test_message_id_is_stable_per_attempt_key(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """The same attempt key always carries the same Message-ID; another key another one."""
    transport = make_transport(port=plain_port, security="none")
    first = transport.submit(email_message(), "ntc_1:email:1")
    again = transport.submit(email_message(), "ntc_1:email:1")
    other = transport.submit(email_message(), "ntc_2:email:1")
    ids = [mail["Message-ID"] for mail in handler.received]
    assert ids == [first.message_id, first.message_id, other.message_id]
    assert again.message_id == first.message_id != other.message_id


def test_status_is_final_and_needs_no_server(make_transport: MakeTransport) -> None:
    """status() repeats the accepted 250 without any network call (nothing listens)."""
    transport = make_transport(port=free_port(), security="none")
    reply = transport.status("<abc@shop.example>")
    assert (reply.message_id, reply.raw_status, reply.status) == (
        "<abc@shop.example>",
        "250",
        Status.ACCEPTED,
    )


def test_refused_recipient_is_permanent_without_the_address(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """A 550 to RCPT is permanent, and the relay's reply (quoting the address) is dropped."""
    handler.outcome = "reject"
    transport = make_transport(port=plain_port, security="none")
    with pytest.raises(PermanentError, match=r"RCPT refused \(550\)") as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    _no_secrets(raised.value)
    assert handler.received == []


def test_connection_dropped_after_data_is_ambiguous(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """A connection lost after the content was sent, before the final reply, is ambiguous."""
    handler.outcome = "ambiguous"
    transport = make_transport(port=plain_port, security="none")
    with pytest.raises(AmbiguousError) as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    _no_secrets(raised.value)


def test_nothing_listening_is_transient(make_transport: MakeTransport) -> None:
    """A refused connection means nothing was accepted: transient."""
    transport = make_transport(port=free_port(), security="none")
    with pytest.raises(TransientError, match="cannot connect") as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    _no_secrets(raised.value)


def test_replies_each_within_the_timeout_cannot_outlast_it_together(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """timeout bounds the whole submission: slow replies end it before DATA, transient."""
    handler.outcome = "slow"
    transport = make_transport(port=plain_port, security="none", timeout=TINY_TIMEOUT)
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"failed \(TimeoutError\)") as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    assert time.monotonic() - started < TINY_TIMEOUT + OVERRUN
    _no_secrets(raised.value)
    assert handler.received == []


def test_a_stalled_reply_to_the_content_is_ambiguous_by_the_deadline(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """A relay that holds its reply to the content past the deadline: ambiguous, on time."""
    handler.outcome = "stall-content"
    transport = make_transport(port=plain_port, security="none", timeout=TINY_TIMEOUT)
    started = time.monotonic()
    with pytest.raises(AmbiguousError, match=r"TimeoutError") as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    assert time.monotonic() - started < TINY_TIMEOUT + OVERRUN
    _no_secrets(raised.value)


@pytest.mark.parametrize(("options", "expected"), [({}, DEFAULT_TIMEOUT), ({"timeout": 2.5}, 2.5)])
def test_call_timeout_is_the_configured_timeout(
    store: Store, clock: FakeClock, options: dict[str, float], expected: float
) -> None:
    """call_timeout is [smtp] timeout, 20 s by default: it bounds the whole submission."""
    table = {"host": "127.0.0.1", "from": SENDER, **options}
    settings = settings_from_mapping({"transport": {"email": "smtp"}, "smtp": table})
    transport = build_transports(settings, store, clock, {})["email"]
    assert isinstance(transport, SmtpTransport)
    assert transport.call_timeout == call_timeout(transport) == expected
    assert DEFAULT_TIMEOUT == 20.0


@pytest.mark.parametrize(
    ("outcome", "error", "words"),
    [
        ("transient", TransientError, r"RCPT not accepted \(451\)"),
        ("refuse-sender", PermanentError, r"MAIL FROM refused \(550\)"),
        ("defer-content", TransientError, r"content not accepted \(451\)"),
        ("refuse-content", PermanentError, r"content refused \(554\)"),
    ],
)
def test_reply_codes_decide_the_error_kind(
    make_transport: MakeTransport,
    handler: ScriptedHandler,
    plain_port: int,
    outcome: str,
    error: type[TransportError],
    words: str,
) -> None:
    """4xx replies are transient and 5xx permanent, at MAIL, RCPT and after the content."""
    handler.outcome = outcome
    transport = make_transport(port=plain_port, security="none")
    with pytest.raises(error, match=words) as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    _no_secrets(raised.value)
    assert handler.received == []


def test_internationalized_recipient_travels_with_smtputf8(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int
) -> None:
    """A non-ASCII address is sent with SMTPUTF8 when the relay offers it."""
    recipient = "jos\u00e9@example.org"
    base = email_message()
    message = Message("email", base.notice_id, recipient, base.expires_at, email=base.email)
    transport = make_transport(port=plain_port, security="none")
    assert transport.submit(message, "ntc_1:email:1").status is Status.ACCEPTED
    assert handler.envelopes == [(SENDER, [recipient])]
    assert handler.received[0]["To"] == recipient


def test_recipient_with_a_line_break_is_refused_before_connecting(
    make_transport: MakeTransport,
) -> None:
    """A recipient that would inject an SMTP command is permanent, and is not echoed."""
    injected = f"{SECRET_EMAIL}\r\nRCPT TO:<other@example.org>"
    message = Message(
        "email", "ntc_1", injected, 4e9, email=EmailContent("Subject", "text", "<p>html</p>")
    )
    transport = make_transport(port=free_port(), security="none")
    with pytest.raises(PermanentError) as raised:
        transport.submit(message, "ntc_1:email:1")
    _no_secrets(raised.value, "other@example.org")


def test_starttls_with_a_private_ca_is_accepted(
    make_transport: MakeTransport, handler: ScriptedHandler, tls: Tls
) -> None:
    """STARTTLS to a relay that requires it, trusting the relay's CA from ca_file."""
    with serve(handler, tls_context=tls.server, require_starttls=True) as port:
        transport = make_transport(port=port, ca_file=tls.ca_file)
        assert transport.submit(email_message(), "ntc_1:email:1").status is Status.ACCEPTED
    assert len(handler.received) == 1


def test_starttls_with_an_untrusted_certificate_is_transient(
    make_transport: MakeTransport, handler: ScriptedHandler, tls: Tls
) -> None:
    """Without the private CA the certificate is not verified: nothing is sent."""
    with serve(handler, tls_context=tls.server, require_starttls=True) as port:
        transport = make_transport(port=port)
        with pytest.raises(TransientError, match=r"STARTTLS failed.*SSLCertVerificationError"):
            transport.submit(email_message(), "ntc_1:email:1")
    assert handler.received == []


def test_relay_without_starttls_is_never_used_in_clear(
    make_transport: MakeTransport, handler: ScriptedHandler, plain_port: int, tls: Tls
) -> None:
    """security = "starttls" against a relay that does not offer it: transient, nothing sent."""
    transport = make_transport(port=plain_port, ca_file=tls.ca_file)
    with pytest.raises(TransientError, match="does not offer STARTTLS"):
        transport.submit(email_message(), "ntc_1:email:1")
    assert handler.received == []


def test_implicit_tls_is_accepted(
    make_transport: MakeTransport, handler: ScriptedHandler, tls: Tls
) -> None:
    """security = "tls" speaks SMTP inside TLS from the first byte."""
    with serve(handler, ssl_context=tls.server) as port:
        transport = make_transport(port=port, security="tls", ca_file=tls.ca_file)
        assert transport.submit(email_message(), "ntc_1:email:1").status is Status.ACCEPTED
    assert len(handler.received) == 1


@pytest.fixture
def auth_port(handler: ScriptedHandler, tls: Tls) -> Iterator[int]:
    with serve(
        handler,
        tls_context=tls.server,
        require_starttls=True,
        authenticator=_authenticator,
        auth_required=True,
        auth_require_tls=True,
    ) as port:
        yield port


def test_auth_with_the_password_from_the_environment(
    make_transport: MakeTransport, handler: ScriptedHandler, tls: Tls, auth_port: int
) -> None:
    """AUTH after STARTTLS with RESETCTL_SMTP_PASSWORD from the environment."""
    transport = make_transport(
        {"RESETCTL_SMTP_PASSWORD": PASSWORD},
        port=auth_port,
        ca_file=tls.ca_file,
        username=USERNAME,
    )
    assert transport.submit(email_message(), "ntc_1:email:1").status is Status.ACCEPTED
    assert len(handler.received) == 1
    assert PASSWORD not in repr(transport.relay)


def test_wrong_password_is_permanent_and_not_shown(
    make_transport: MakeTransport, handler: ScriptedHandler, tls: Tls, auth_port: int
) -> None:
    """A 535 to AUTH is permanent (retrying repeats it); the password is in no message."""
    wrong = "wrong-pw-CANARY-1f0a"
    transport = make_transport(
        {"RESETCTL_SMTP_PASSWORD": wrong}, port=auth_port, ca_file=tls.ca_file, username=USERNAME
    )
    with pytest.raises(PermanentError, match=r"AUTH refused \(535\)") as raised:
        transport.submit(email_message(), "ntc_1:email:1")
    _no_secrets(raised.value, wrong)
    assert handler.received == []


def test_missing_password_fails_at_build_time(make_transport: MakeTransport) -> None:
    """With a username and no RESETCTL_SMTP_PASSWORD, building fails and names the secret."""
    with pytest.raises(ConfigError, match="RESETCTL_SMTP_PASSWORD"):
        make_transport({}, username=USERNAME)


def test_missing_from_is_a_config_error(store: Store, clock: FakeClock) -> None:
    """The sender is required: ConfigError names smtp.from."""
    settings = settings_from_mapping({"transport": {"email": "smtp"}, "smtp": {"host": "x"}})
    with pytest.raises(ConfigError, match=r"smtp\.from"):
        build_transports(settings, store, clock, {})


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"security": "ssl"}, "smtp.security"),
        ({"port": "25"}, "smtp.port"),
        ({"port": 0}, "smtp.port"),
        ({"timeout": 0}, "smtp.timeout"),
        ({"from": "not an address"}, "smtp.from"),
        ({"relay": "x"}, "smtp.relay"),
        ({"security": "none", "username": USERNAME}, "smtp.username"),
        ({"security": "none", "ca_file": "/nowhere/ca.pem"}, "smtp.ca_file"),
        ({"ca_file": "/nowhere/ca.pem"}, "smtp.ca_file"),
    ],
)
def test_bad_options_are_config_errors(
    make_transport: MakeTransport, options: dict[str, Any], key: str
) -> None:
    """Each bad [smtp] option is refused at build time, naming its key."""
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_transport({"RESETCTL_SMTP_PASSWORD": PASSWORD}, **options)


@pytest.mark.parametrize(("security", "port"), [("starttls", 587), ("tls", 465), ("none", 25)])
def test_default_port_follows_security(
    make_transport: MakeTransport, security: str, port: int
) -> None:
    """The port defaults to 587 for STARTTLS, 465 for implicit TLS and 25 for none."""
    relay = make_transport(security=security).relay
    assert (relay.port, relay.host) == (port, "127.0.0.1")


def test_vocabulary() -> None:
    """Only 250 is known, and it is accepted; anything else is unknown."""
    found = plugin("smtp")
    assert found is not None
    assert found.vocabulary.known == frozenset({"250"})
    assert normalize("250") is Status.ACCEPTED
    assert normalize("451") is Status.UNKNOWN
    assert found.channels == frozenset({"email"})


@dataclass
class SmtpHarness:
    transport: SmtpTransport
    plugin: TransportPlugin
    handler: ScriptedHandler
    caplog: pytest.LogCaptureFixture
    channel: str = "email"
    reports_later_statuses: bool = False

    def message(self) -> Message:
        return email_message()

    def script(self, outcome: str) -> None:
        self.handler.outcome = outcome

    def report(self, message_id: str, outcome: str) -> None:
        raise AssertionError("SMTP has no later statuses to report")

    def logs(self) -> str:
        # Only what resetctl logged: aiosmtpd's own log names the recipient it serves.
        return "\n".join(
            record.getMessage()
            for record in self.caplog.records
            if record.name.startswith("resetctl")
        )


class TestSmtpContract(TransportContract):
    @pytest.fixture
    def harness(
        self,
        make_transport: MakeTransport,
        handler: ScriptedHandler,
        plain_port: int,
        caplog: pytest.LogCaptureFixture,
    ) -> SmtpHarness:
        caplog.set_level("DEBUG", logger="resetctl")
        found = plugin("smtp")
        assert found is not None
        transport = make_transport(port=plain_port, security="none")
        return SmtpHarness(transport, found, handler, caplog)
