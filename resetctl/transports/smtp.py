"""Email over SMTP with the standard library, to any relay.

SMTP has no idempotency key and no status lookup: the relay's 250 after DATA is the
last word it will ever say about a message. What this transport adds is telling the
three error kinds apart, which is why it drives the conversation one command at a
time instead of calling ``send_message``:

- anything that fails before the relay answers 354 to DATA (connect, TLS, EHLO,
  STARTTLS, AUTH, MAIL, RCPT, DATA itself) left nothing behind: transient, except
  refusals that retrying cannot change, which are permanent: a 5xx to AUTH
  (credentials or mechanism refused), to MAIL FROM (sender or relay policy), to
  RCPT (the recipient), or to DATA;
- once the content and its terminating dot were sent, a lost connection or a timeout
  before the final reply is ambiguous: the relay may have queued the message;
- the final reply decides the rest: 250 accepted, 4xx transient (the relay
  discarded the transaction), 5xx permanent.

A relay that turns a message away to slow us down raises ThrottledError (the lane
pauses, no retry is spent): Amazon SES's documented "454 Throttling failure" (sending
rate or daily quota) at MAIL, RCPT or after the content, and its "421 Too many
concurrent SMTP connections" greeting. Its reply text is read for that, never passed on.

``timeout`` bounds the whole submission, from the connect to the QUIT, and is the
transport's ``call_timeout``: smtplib's own time-out bounds each socket wait, so a
conversation of ten to eighteen waits could outlast a sweep's lease many times over.
Before each wait (the connect, a TLS handshake, each read of a reply, each write) the
socket gets what is left of the deadline; a step that finds nothing left fails as that
step fails on a time-out: transient up to the content, ambiguous while waiting for the
reply to it. Only resolving the relay's name is outside the deadline.

Exception messages carry SMTP reply codes and generic words only: smtplib's own
exceptions and the relay's reply text may quote the recipient address.

The sender is the notice's policy's (``[policy.<name>.email] from`` and ``reply_to``)
when it names one, else ``[smtp] from``; the From address is the envelope sender too, so
a region's bounces and SPF alignment follow its own domain.

No text the person chose can become a header: the subject is one line with no encoded
word (render's ``header_text``, applied again here for any caller), a recipient holding
an encoded-word opener is refused, and the composed header block is checked against the
headers built before anything is sent. The email package makes that last check itself
from CPython 3.11.10 / 3.12.5 (``HeaderWriteError``); 3.11.7 does not, so it is done here
on every interpreter.
"""

from __future__ import annotations

import contextlib
import email.errors
import hashlib
import io
import re
import smtplib
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import TYPE_CHECKING

from resetctl.errors import ConfigError
from resetctl.machine import Status
from resetctl.render import header_text
from resetctl.transports.base import (
    AmbiguousError,
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    ThrottledError,
    TransientError,
    Transport,
    TransportContext,
    TransportPlugin,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

#: The only raw status SMTP ever gives for a message: the reply to its content.
SMTP_STATUSES = frozenset({"250"})

SECURITY_PORTS = {"starttls": 587, "tls": 465, "none": 25}

#: Default seconds for a whole submission. A healthy relay takes well under a second,
#: and a few more when it scans the content after DATA; 20 s leaves room for a slow one
#: (an SMTP failure after the content is ambiguous, which SMTP cannot look up) while a
#: sweep's default 60 s lease still covers the call twice over.
DEFAULT_TIMEOUT = 20.0

_OPTIONS = {
    "host",
    "port",
    "security",
    "username",
    "from",
    "timeout",
    "ca_file",
    "ses_configuration_set",
}

#: The header that names an Amazon SES configuration set for one message.
SES_CONFIGURATION_SET_HEADER = "X-SES-CONFIGURATION-SET"
# SES's rule for a configuration set's name (64 letters, digits, "_" or "-"): nothing
# else can reach the header.
_SES_CONFIGURATION_SET = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Amazon SES's throttles: "454 Throttling failure: Maximum sending rate exceeded" and
# "... Daily message quota exceeded" (an enhanced status code may come first), and its
# "421 Too many concurrent SMTP connections" greeting.
_THROTTLED = re.compile(rb"\s*(?:[245]\.\d{1,3}\.\d{1,3}\s+)?throttling failure\b", re.I)
_DAILY_QUOTA = re.compile(rb"daily message quota", re.I)
_TOO_MANY_CONNECTIONS = re.compile(rb"too many concurrent smtp connections", re.I)
#: Seconds a lane pauses on SES's daily quota: the longest pause a provider may ask for
#: (its quota returns over hours, and other notices' deadlines are passing meanwhile).
DAILY_QUOTA_PAUSE = 300.0

# A line starting with a dot would end DATA early (RFC 5321 section 4.5.2).
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)
# A header field's name as RFC 5322 allows it: printable ASCII but the colon.
_FIELD_NAME = re.compile(rb"[!-9;-~]+")
_NOT_ONE_HEADER = "smtp: a header would not stay one header (refused as an injection; nothing sent)"


def normalize(raw: str) -> Status:
    """A 250 to the message content is acceptance; SMTP says nothing later."""
    return Status.ACCEPTED if raw in SMTP_STATUSES else Status.UNKNOWN


@dataclass(frozen=True, slots=True)
class SmtpRelay:
    """Where and how to reach the relay. Its repr shows no password."""

    #: relay host name or address (also the name its certificate must carry)
    host: str
    #: relay port
    port: int
    #: "starttls", "tls" (implicit TLS) or "none"
    security: str
    #: the From header as configured, e.g. ``Acme <no-reply@acme.example>`` (the default
    #: when a message's policy names no sender)
    from_header: str
    #: the bare address of ``from_header``, the envelope sender of such a message
    sender: str
    #: the domain of the sender, used in Message-IDs (ASCII)
    domain: str
    #: seconds for the whole submission, connect to QUIT (the call's deadline)
    timeout: float
    #: certificate verification for "starttls" and "tls"
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    #: AUTH user name, if the relay wants one
    username: str | None = None
    #: AUTH password (secret)
    password: str | None = field(default=None, repr=False)
    #: the Amazon SES configuration set each message names, if any
    ses_configuration_set: str | None = None


@dataclass(frozen=True, slots=True)
class _Composed:
    message_id: str
    #: the envelope sender (MAIL FROM)
    sender: str
    recipient: str
    #: the wire form: CRLF lines, dot-stuffed, ending with the terminating dot
    payload: bytes
    #: the addresses need SMTPUTF8
    utf8: bool


def message_id_for(attempt_key: str, domain: str) -> str:
    """The Message-ID of an attempt: the same key always gives the same id,
    so receivers that dedupe by Message-ID drop a duplicate."""
    digest = hashlib.sha256(attempt_key.encode("utf-8")).hexdigest()[:32]
    return f"<{digest}@{domain}>"


def envelope_sender(relay: SmtpRelay, message: Message) -> str:
    """The address a message comes from: its policy's, else the relay's configured one."""
    return message.sender.email_from or relay.sender


def compose(relay: SmtpRelay, message: Message, attempt_key: str, now: float) -> EmailMessage:
    """The transactional email for one attempt: text and HTML alternatives, from the
    message's sender (its policy's, else ``[smtp] from``)."""
    if message.email is None:
        raise PermanentError("smtp: the message has no rendered email")
    sender = message.sender
    utf8 = _needs_utf8(relay, message)
    # Without SMTPUTF8, headers are RFC 2047-encoded and bodies kept 7-bit, so any
    # relay carries them; an internationalized address needs UTF-8 headers instead.
    mail = EmailMessage(policy=policy.SMTPUTF8 if utf8 else policy.SMTP.clone(cte_type="7bit"))
    mail["Subject"] = header_text(message.email.subject)
    if sender.email_from is None:
        mail["From"] = relay.from_header
    else:
        # Built from its parts, so the email package quotes or encodes the name itself;
        # header_text keeps even the operator's name to one line with nothing to decode.
        name = header_text(sender.email_from_name or "")
        mail["From"] = Address(display_name=name, addr_spec=sender.email_from)
    if sender.email_reply_to is not None:
        mail["Reply-To"] = Address(addr_spec=sender.email_reply_to)
    mail["To"] = message.recipient
    mail["Date"] = formatdate(now, usegmt=True)
    mail["Message-ID"] = message_id_for(attempt_key, relay.domain)
    # A reset notice is transactional: auto-responders and out-of-office replies
    # should stay silent, and it carries no List-Unsubscribe (nothing to leave).
    mail["Auto-Submitted"] = "auto-generated"
    mail["X-Auto-Response-Suppress"] = "All"
    if relay.ses_configuration_set is not None:
        mail[SES_CONFIGURATION_SET_HEADER] = relay.ses_configuration_set
    mail.set_content(message.email.text)
    mail.add_alternative(message.email.html, subtype="html")
    return mail


def _needs_utf8(relay: SmtpRelay, message: Message) -> bool:
    """True when an address the message names (sender, Reply-To, recipient) is not ASCII."""
    reply_to = message.sender.email_reply_to or ""
    return not (envelope_sender(relay, message) + reply_to + message.recipient).isascii()


def _prepare(relay: SmtpRelay, message: Message, attempt_key: str, now: float) -> _Composed:
    recipient = message.recipient
    # smtplib quotes a command argument holding a line break in its exception, and
    # angle brackets would break out of the RCPT path: refuse both before any I/O. The
    # email package decodes an encoded word even in an address, so the To header would
    # not name the envelope's recipient (or would break into lines).
    if any(c in recipient for c in "\r\n<>") or "@" not in recipient or "=?" in recipient:
        raise PermanentError("smtp: the recipient is not a valid address")
    # Raised by email's generator for a header it would write broken (3.11.10, 3.12.5 and
    # later); looked up here, since 3.11.7 has no such class.
    header_write_error: type[Exception] = getattr(email.errors, "HeaderWriteError", _NeverRaised)
    try:
        mail = compose(relay, message, attempt_key, now)
        wire = mail.as_bytes()
    except header_write_error:
        raise PermanentError(_NOT_ONE_HEADER) from None
    except (ValueError, TypeError, UnicodeError):
        # email's errors may quote the header value, i.e. the recipient.
        raise PermanentError("smtp: the message cannot be composed") from None
    if not headers_as_built(wire, mail.keys()):
        raise PermanentError(_NOT_ONE_HEADER)
    wire = _LEADING_DOT.sub(b"..", wire)
    if not wire.endswith(b"\r\n"):
        wire += b"\r\n"
    return _Composed(
        message_id=message_id_for(attempt_key, relay.domain),
        sender=envelope_sender(relay, message),
        recipient=recipient,
        payload=wire + b".\r\n",
        utf8=_needs_utf8(relay, message),
    )


class _NeverRaised(Exception):
    """Stands in for email.errors.HeaderWriteError where the interpreter has none."""


def headers_as_built(wire: bytes, names: list[str]) -> bool:
    """True when the header block of ``wire`` holds exactly the fields ``names``, in
    order, each on its own line (folded lines start with a space or a tab), and nothing
    but CRLF ends a line: no decoded line break added a header or ended them early."""
    head, blank, _ = wire.partition(b"\r\n\r\n")
    if not blank:
        return False
    written: list[bytes] = []
    for line in head.split(b"\r\n"):
        if b"\r" in line or b"\n" in line:
            return False
        if line[:1] in (b" ", b"\t"):
            if not written:
                return False
            continue
        name, colon, _ = line.partition(b":")
        if not colon or not _FIELD_NAME.fullmatch(name):
            return False
        written.append(name.lower())
    return written == [name.lower().encode("ascii", "replace") for name in names]


def _describe(exc: BaseException) -> str:
    """The class of a low-level failure, plus a TLS verification reason (no addresses)."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"{type(exc).__name__}: {exc.verify_message}"
    if isinstance(exc, TimeoutError) or isinstance(exc.__context__, TimeoutError):
        # The socket's or the deadline's; smtplib reports a read that timed out as
        # SMTPServerDisconnected, which would hide that time ran out.
        return "TimeoutError"
    return type(exc).__name__


class _OutOfTime(TimeoutError):
    """The submission's deadline has passed. A TimeoutError, so each step classifies it
    as it classifies a socket time-out."""


@dataclass(frozen=True, slots=True)
class _Deadline:
    """The monotonic instant a submission must be over by."""

    #: time.monotonic() value
    end: float

    def left(self) -> float:
        """Seconds left; _OutOfTime when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise _OutOfTime("smtp: the call's time-out ran out")
        return left


def _open_socket(host: str, port: int, deadline: _Deadline) -> socket.socket:
    """A TCP connection to the first address of ``host`` that answers, all of them
    within the deadline (socket.create_connection gives each address the whole time)."""
    failure: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            if isinstance(exc, _OutOfTime):
                break
            continue
        return sock
    raise failure


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read bounded by what is left of the deadline (smtplib's
    own file would let a relay trickling a reply wait out the time-out per read)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        self._sock.settimeout(self._deadline.left())
        count = self._sock.recv_into(buffer)
        # smtplib starts a TLS handshake right after reading the 220 to STARTTLS, with
        # whatever time-out the socket has: leave it what is left now.
        with contextlib.suppress(_OutOfTime):
            self._sock.settimeout(self._deadline.left())
        return count


class _DeadlineSMTP(smtplib.SMTP):
    """smtplib.SMTP whose every connect, handshake, read and write ends by one deadline."""

    def __init__(self, relay: SmtpRelay, deadline: _Deadline) -> None:
        self._deadline = deadline
        #: the context for implicit TLS ("tls"); None for a plain start
        self._implicit_tls = relay.tls if relay.security == "tls" else None
        # Connects and reads the greeting, through _get_socket and getreply below.
        super().__init__(relay.host, relay.port, timeout=relay.timeout)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = _open_socket(host, port, self._deadline)
        if self._implicit_tls is None:
            return sock
        try:
            # The handshake as a whole is bounded by the socket's time-out.
            sock.settimeout(self._deadline.left())
            return self._implicit_tls.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise

    def getreply(self) -> tuple[int, bytes]:
        if self.file is None and self.sock is not None:
            self.file = io.BufferedReader(_DeadlineReader(self.sock, self._deadline))
        return super().getreply()

    def send(self, s: ReadableBuffer | str) -> None:
        if self.sock is not None:
            # sendall is bounded as a whole by the socket's time-out.
            self.sock.settimeout(self._deadline.left())
        super().send(s)


def _refusal(step: str, code: int, reply: bytes = b"") -> PermanentError | TransientError:
    """A 5xx is a refusal that retrying cannot change; anything else may pass later, and
    a documented throttle (``reply``, the relay's text) asks the lane to pause."""
    if 500 <= code <= 599:
        return PermanentError(f"smtp: {step} refused ({code})")
    if 400 <= code <= 499 and _THROTTLED.match(reply):
        wait = DAILY_QUOTA_PAUSE if _DAILY_QUOTA.search(reply) else None
        return ThrottledError(f"smtp: {step} throttled by the relay ({code})", wait)
    return TransientError(f"smtp: {step} not accepted ({code})")


class SmtpTransport:
    """Hands each message to one SMTP relay; the 250 to its content is final."""

    name = "smtp"
    #: SMTP has no idempotency key: submitting again sends a second email
    recovers_by_key = False
    #: the longest one call can take: the configured timeout bounds the whole submission
    call_timeout: float

    def __init__(self, relay: SmtpRelay, clock: Callable[[], float]) -> None:
        #: the validated [smtp] options
        self.relay = relay
        self.call_timeout = relay.timeout
        self._clock = clock

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Send the message; raises TransientError, AmbiguousError or PermanentError."""
        deadline = _Deadline(time.monotonic() + self.relay.timeout)
        composed = _prepare(self.relay, message, attempt_key, self._clock())
        connection = self._connect(deadline)
        try:
            self._hello(connection)
            self._envelope(connection, composed)
            return self._transfer(connection, composed)
        finally:
            # QUIT is a courtesy: the outcome is already decided, so a relay that has
            # gone away by now changes nothing.
            with contextlib.suppress(smtplib.SMTPException, OSError):
                connection.quit()
            connection.close()

    def close(self) -> None:
        """Nothing to release: each submission opens and closes its own connection."""

    def status(self, message_id: str) -> ProviderStatus:
        """The relay's 250 is its last word: accepted, without any network call."""
        return ProviderStatus(message_id, "250", normalize("250"))

    def _connect(self, deadline: _Deadline) -> smtplib.SMTP:
        relay = self.relay
        where = f"{relay.host}:{relay.port}"
        try:
            return _DeadlineSMTP(relay, deadline)
        except smtplib.SMTPConnectError as exc:
            # Even a 554 greeting is transient: it refuses this connection, not the message.
            said = exc.smtp_error
            said = said if isinstance(said, bytes) else said.encode("utf-8", "replace")
            if exc.smtp_code == 421 and _TOO_MANY_CONNECTIONS.search(said):
                raise ThrottledError(f"smtp: {where} greeted with 421 (too busy)") from None
            raise TransientError(f"smtp: {where} greeted with {exc.smtp_code}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise TransientError(f"smtp: cannot connect to {where} ({_describe(exc)})") from None

    def _hello(self, connection: smtplib.SMTP) -> None:
        relay = self.relay
        step = "EHLO"
        try:
            connection.ehlo_or_helo_if_needed()
            if relay.security == "starttls":
                step = "STARTTLS"
                # Raises when the relay does not offer STARTTLS: never fall back to
                # plain text, the password and the reset link would travel in clear.
                connection.starttls(context=relay.tls)
                step = "EHLO"
                code, _ = connection.ehlo()
                if code != 250:
                    raise TransientError(f"smtp: EHLO after STARTTLS not accepted ({code})")
            if relay.username is not None and relay.password is not None:
                step = "AUTH"
                connection.login(relay.username, relay.password)
        except smtplib.SMTPAuthenticationError as exc:
            # Wrong credentials or a mechanism the relay refuses: a configuration
            # problem every retry would repeat (while a 454 may clear).
            raise _refusal("AUTH", exc.smtp_code) from None
        except smtplib.SMTPNotSupportedError:
            raise TransientError(f"smtp: the relay does not offer {step}") from None
        except smtplib.SMTPResponseException as exc:
            raise TransientError(f"smtp: {step} not accepted ({exc.smtp_code})") from None
        except (smtplib.SMTPException, OSError, ValueError) as exc:
            raise TransientError(f"smtp: {step} failed ({_describe(exc)})") from None

    def _envelope(self, connection: smtplib.SMTP, composed: _Composed) -> None:
        options: list[str] = []
        if composed.utf8:
            if not connection.has_extn("smtputf8"):
                # This relay can never carry the address: retrying it will not help.
                raise PermanentError("smtp: the relay cannot carry an internationalized address")
            options = ["SMTPUTF8", "BODY=8BITMIME"]
        step = "MAIL FROM"
        try:
            code, reply = connection.mail(composed.sender, options)
            if code != 250:
                raise _refusal(step, code, reply)
            step = "RCPT"
            code, reply = connection.rcpt(composed.recipient)
            if code not in (250, 251):
                raise _refusal(step, code, reply)
        except (smtplib.SMTPException, OSError, ValueError) as exc:
            raise TransientError(f"smtp: {step} failed ({_describe(exc)})") from None

    def _transfer(self, connection: smtplib.SMTP, composed: _Composed) -> ProviderStatus:
        try:
            connection.putcmd("data")
            code, reply = connection.getreply()
        except (smtplib.SMTPException, OSError) as exc:
            raise TransientError(f"smtp: DATA failed ({_describe(exc)})") from None
        if code != 354:
            raise _refusal("DATA", code, reply)
        try:
            connection.send(composed.payload)
        except (smtplib.SMTPException, OSError) as exc:
            # The payload ends with the terminating dot: if it did not all leave, the
            # relay holds an unfinished message, which it must discard.
            raise TransientError(f"smtp: sending the content failed ({_describe(exc)})") from None
        try:
            code, reply = connection.getreply()
        except (smtplib.SMTPException, OSError) as exc:
            raise AmbiguousError(
                f"smtp: no reply after the content; the relay may have queued it ({_describe(exc)})"
            ) from None
        if code == 250:
            return ProviderStatus(composed.message_id, "250", normalize("250"))
        if 400 <= code <= 599:
            raise _refusal("message content", code, reply)
        raise AmbiguousError(f"smtp: unexpected reply to the content ({code})")


def _relay_from(context: TransportContext) -> SmtpRelay:
    context.reject_unknown(_OPTIONS)
    security = context.option("security", "starttls", str)
    if security not in SECURITY_PORTS:
        raise ConfigError(f"{context.table}.security: must be one of starttls, tls, none")
    host = context.option("host", "localhost", str)
    if not host:
        raise ConfigError(f"{context.table}.host: must not be empty")
    from resetctl.config import loopback_host

    if security == "none" and not loopback_host(host):
        # Every message carries a reset link: in clear only to a relay on this machine.
        raise ConfigError(
            f'{context.table}.security: "none" only to a loopback host; use starttls or tls'
        )
    port = context.option("port", SECURITY_PORTS[security], int)
    if not 0 < port < 65536:
        raise ConfigError(f"{context.table}.port: must be between 1 and 65535")
    timeout = float(context.option("timeout", DEFAULT_TIMEOUT, (int, float)))
    if timeout <= 0:
        raise ConfigError(f"{context.table}.timeout: must be positive")

    if "from" not in context.options:
        raise ConfigError(
            f"{context.table}.from: required (the sender, e.g. no-reply@shop.example)"
        )
    from_header = context.option("from", "", str)
    sender = parseaddr(from_header)[1]
    local, _, domain = sender.rpartition("@")
    if not local or not domain or "\r" in from_header or "\n" in from_header:
        raise ConfigError(f"{context.table}.from: expected an email address")
    try:
        # Message-IDs are ASCII; an internationalized sender domain goes in as IDNA.
        domain = domain if domain.isascii() else domain.encode("idna").decode("ascii")
    except UnicodeError:
        raise ConfigError(f"{context.table}.from: the domain is not a valid name") from None

    tls: ssl.SSLContext | None = None
    ca_file = context.option("ca_file", "", str) if "ca_file" in context.options else None
    if security == "none":
        if ca_file is not None:
            raise ConfigError(f"{context.table}.ca_file: only used with security starttls or tls")
    else:
        try:
            # Verifies the chain and the host name; ca_file adds a private CA.
            tls = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError):
            raise ConfigError(f"{context.table}.ca_file: cannot read a CA bundle there") from None

    username: str | None = None
    password: str | None = None
    if "username" in context.options:
        username = context.option("username", "", str)
        if not username:
            raise ConfigError(f"{context.table}.username: must not be empty")
        if security == "none":
            # AUTH over plain text would hand the password to anyone on the path.
            raise ConfigError(f"{context.table}.username: AUTH needs security starttls or tls")
        # From the environment or the credentials_file, never from the config itself.
        password = context.require_secret("RESETCTL_SMTP_PASSWORD")
    configuration_set: str | None = None
    if "ses_configuration_set" in context.options:
        configuration_set = context.option("ses_configuration_set", "", str)
        if not _SES_CONFIGURATION_SET.fullmatch(configuration_set):
            raise ConfigError(
                f"{context.table}.ses_configuration_set: expected 1 to 64 letters, digits,"
                ' "_" or "-" (an Amazon SES configuration set name)'
            )
    return SmtpRelay(
        host=host,
        port=port,
        security=security,
        from_header=from_header,
        sender=sender,
        domain=domain,
        timeout=timeout,
        tls=tls,
        username=username,
        password=password,
        ses_configuration_set=configuration_set,
    )


def _create(context: TransportContext) -> Transport:
    # Everything is checked here, password included, so a misconfigured sweep fails
    # before it claims a notice.
    return SmtpTransport(_relay_from(context), context.clock)


PLUGIN = TransportPlugin(
    name="smtp",
    channels=frozenset({"email"}),
    create=_create,
    vocabulary=StatusVocabulary("smtp", SMTP_STATUSES, normalize),
)
