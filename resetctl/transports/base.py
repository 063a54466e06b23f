"""The transport protocol: submit a message under a stable key, read its status.

A transport owns its provider's status vocabulary: it maps raw statuses to the
normalized ones and nothing else does. It knows nothing about phases.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from resetctl.errors import ConfigError
from resetctl.frozen import fast_init
from resetctl.machine import Status
from resetctl.policy import Sender
from resetctl.render import EmailContent, SmsContent

if TYPE_CHECKING:
    from resetctl.store import Store


#: The sender of a message whose policy names none: every field the transport's own.
TRANSPORT_SENDER = Sender()


@fast_init
@dataclass(frozen=True, slots=True)
class Message:
    """One rendered message for one recipient. Its repr shows no secret."""

    #: "email" or "sms"
    channel: str
    #: the notice it belongs to (opaque id)
    notice_id: str
    #: the address or E.164 number (secret)
    recipient: str = field(repr=False)
    #: absolute link expiry, so a transport can bound the provider's retries
    expires_at: float
    #: the rendered email (email channel)
    email: EmailContent | None = field(default=None, repr=False)
    #: the rendered SMS (sms channel)
    sms: SmsContent | None = field(default=None, repr=False)
    #: who it comes from, as the notice's stored policy says; each field left None (and
    #: a message built without one) means the transport's own setting. Last and
    #: defaulted, so a plugin that builds or reads messages as before keeps working.
    sender: Sender = TRANSPORT_SENDER


#: The keys of a lookup fingerprint that name the sender it was sent from (inspect
#: shows them; a fingerprint's other keys, such as a digest of the body, it does not).
SENDER_KEYS = ("from", "service", "reply_to")

# RFC 5322's specials: a display name holding one is written as a quoted string.
_SPECIALS = re.compile(r'[][()<>@,:;.\\"]')
_QUOTED_PAIR = re.compile(r'(["\\])')


def mailbox(address: str, name: str | None) -> str:
    """``Name <address>``, or the bare address without a name: one RFC 5322 mailbox, the
    name quoted (its quotes and backslashes escaped) when it holds a special character.
    Not encoded: a JSON API takes UTF-8 (SMTP builds its own header from the parts)."""
    if not name:
        return address
    if _SPECIALS.search(name):
        name = '"' + _QUOTED_PAIR.sub(r"\\\1", name) + '"'
    return f"{name} <{address}>"


@fast_init
@dataclass(frozen=True, slots=True)
class ProviderStatus:
    """What a provider said about a message: its id, raw status and normalized status."""

    #: the provider's message id
    message_id: str
    #: the provider's own word, stored as evidence
    raw_status: str
    #: the transport's classification of it
    status: Status


class TransportError(Exception):
    """A submission or status read failed. The message never holds a secret."""

    #: "transient", "ambiguous" or "permanent"
    kind = "transient"


class TransientError(TransportError):
    """Nothing was accepted; safe to retry under the same attempt key."""

    kind = "transient"


class ThrottledError(TransientError):
    """The provider turned the request away unread to slow us down (HTTP 429 and the
    like): nothing was created. The call is not an attempt (it spends no retry), and the
    transport's lane pauses for ``retry_after`` seconds (the lane's default when the
    provider did not say)."""

    kind = "transient"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        #: seconds the provider asked us to wait, when it said
        self.retry_after = retry_after


class AmbiguousError(TransportError):
    """The provider may have accepted it: recover by key or lookup, never resend blindly."""

    kind = "ambiguous"


class PermanentError(TransportError):
    """Refused for good (bad recipient, rejected content)."""

    kind = "permanent"


class Transport(Protocol):
    """A channel's provider."""

    #: the name configured under [transport]
    name: str
    #: True when a second submit under the same attempt key returns the first message
    recovers_by_key: bool

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Hand the message to the provider; raises a TransportError subclass."""
        ...

    def status(self, message_id: str) -> ProviderStatus:
        """Read the message's current status; raises a TransportError subclass."""
        ...

    def close(self) -> None:
        """Release connections (a sweep closes its transports when it ends)."""
        ...


#: Seconds a call may take when a transport does not say (``call_timeout``).
DEFAULT_CALL_TIMEOUT = 30.0


def call_timeout(transport: Transport) -> float:
    """The longest one call to ``transport`` can take (connect plus read time-outs).

    A sweep starts a call only while its lease still covers this much time, so a call
    never outlives the lease it was started under. Plugins that do not say get
    DEFAULT_CALL_TIMEOUT.
    """
    value = getattr(transport, "call_timeout", DEFAULT_CALL_TIMEOUT)
    return float(value) if isinstance(value, int | float) else DEFAULT_CALL_TIMEOUT


class LookupTransport(Transport, Protocol):
    """A transport without idempotency keys that can find what it sent.

    A doubtful submission (the provider may have created the message) is never resent
    blindly: the sweep looks it up. Found, the attempt is submitted and polling goes on;
    not found on two lookups at least ``lookup_settle`` seconds apart, both made at
    least ``lookup_settle`` after the call (so the provider could have listed it),
    nothing was created and the same attempt key may be sent again.

    A lookup matches what was actually sent: ``fingerprint`` says, before the call,
    what will recognise the message (the sender, a digest of the exact body, the
    provider's metadata); it is stored with the intent and handed back to ``lookup``,
    so a later change of templates or settings never makes a lookup miss.
    """

    #: seconds a created message may take to appear in the provider's list (counted
    #: from the call), and between the two not-found lookups that prove it absent
    lookup_settle: float

    def fingerprint(self, message: Message) -> Mapping[str, str]:
        """What ``lookup`` needs to recognise ``message`` once sent. Never the body, the
        recipient or the link in clear (a digest of the body is fine). The sender this
        send names (the message's ``sender`` where it sets one, else the transport's
        own) goes under SENDER_KEYS: inspect shows those keys as the attempt's sender."""
        ...

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        """The message submitted to ``recipient`` under ``attempt_key`` at or after
        ``since`` (epoch seconds) that matches ``sent`` (this transport's fingerprint
        of it), or None when the provider has no such message. Raises TransientError
        when the read itself failed (a failed read proves nothing either way)."""
        ...


def body_digest(text: str) -> str:
    """The SHA-256 of ``text`` (UTF-8), hex: how a fingerprint names a body."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class BatchStatusTransport(Transport, Protocol):
    """A transport that can read many messages' statuses in one call (the embedded
    outbox: one query for a round's reads instead of one per message). It opts in with
    ``reads_in_batches = True``: a plugin's unrelated ``statuses`` is never called."""

    #: True: the sweep reads a round's polls on this transport with ``statuses``
    reads_in_batches: bool

    def statuses(self, message_ids: Sequence[str]) -> Mapping[str, ProviderStatus]:
        """The current status of each message it knows, by id; a message it does not
        know is absent. Raises a TransportError subclass when the read itself failed."""
        ...


def supports_batch_status(transport: Transport) -> bool:
    """True when ``transport`` reads many statuses in one call, and says so."""
    return getattr(transport, "reads_in_batches", False) is True and callable(
        getattr(transport, "statuses", None)
    )


def supports_lookup(transport: Transport) -> bool:
    """True when ``transport`` can recover an ambiguous submission by lookup."""
    return (
        callable(getattr(transport, "lookup", None))
        and callable(getattr(transport, "fingerprint", None))
        and isinstance(getattr(transport, "lookup_settle", None), int | float)
    )


#: How a raw status outside a provider's documented values is stored: this prefix and
#: its length in characters (``unknown:12``), never the text itself.
UNKNOWN_EVIDENCE = "unknown:"


@dataclass(frozen=True, slots=True)
class StatusVocabulary:
    """A transport's raw statuses and its own mapping to the normalized ones."""

    #: the transport's name, as in [transport] and in replay traces
    name: str
    #: every raw status the transport knows; others normalize to unknown
    known: frozenset[str]
    #: the transport's raw-to-normalized mapping (the only copy of it)
    normalize: Callable[[str], Status]
    #: the documented spelling of a raw status the transport also reads when written
    #: another way (Postmark's words in any case), or None for exact spelling only
    spelling: Callable[[str], str | None] | None = None

    def documented(self, raw: str) -> str | None:
        """The documented status ``raw`` is, in its documented spelling; None when it is
        not one of the provider's documented values."""
        if raw in self.known:
            return raw
        if self.spelling is not None:
            spelled = self.spelling(raw)
            if spelled is not None and spelled in self.known:
                return spelled
        return None

    def evidence(self, raw: str) -> str:
        """``raw`` as it may be stored and shown: a documented status verbatim (in its
        documented spelling), anything else as ``unknown:<length>``.

        A provider's reply or a signed callback can carry text that is not a status at
        all (a re-split callback body can put the phone number in MessageStatus), and a
        raw status travels into ``inspect``, exports and replay, so only the provider's
        own words are kept as they came.
        """
        documented = self.documented(raw)
        return f"{UNKNOWN_EVIDENCE}{len(raw)}" if documented is None else documented

    def reading(self, raw: str) -> tuple[str, Status]:
        """(evidence, normalized status) of ``raw``: what a transport reply or a callback
        records. An undocumented status is always normalized to unknown."""
        documented = self.documented(raw)
        if documented is None:
            return f"{UNKNOWN_EVIDENCE}{len(raw)}", Status.UNKNOWN
        return documented, self.normalize(documented)

    def reply(self, message_id: str, raw: str) -> ProviderStatus:
        """A ProviderStatus for ``raw`` as evidence (see :meth:`evidence`)."""
        stored, status = self.reading(raw)
        return ProviderStatus(message_id, stored, status)


@dataclass(frozen=True, slots=True)
class TransportContext:
    """What a transport factory gets: its config table, secrets, the store and clock."""

    #: the transport's name under [transport] (and of its own table)
    name: str
    #: the channel this instance serves ("email" or "sms")
    channel: str
    #: the transport's own top-level table, e.g. ``[twilio]``
    options: Mapping[str, Any]
    #: a secret by environment-variable name: the environment first, then the
    #: ``credentials_file`` named in the table. Never from argv.
    secret: Callable[[str], str | None]
    #: the notices database (the outbox keeps its messages there)
    store: Store
    #: the sweep's clock (seconds since the epoch)
    clock: Callable[[], float]
    #: where its table is in the config, as errors name it (``providers.twilio_eu``;
    #: the instance's name when it is a top-level table such as ``[twilio]``)
    where: str = ""

    @property
    def table(self) -> str:
        """How errors name this instance's table."""
        return self.where or self.name

    def option(self, key: str, default: Any, kind: type | tuple[type, ...]) -> Any:
        """A typed option from the table; ConfigError names ``<transport>.<key>``."""
        value = self.options.get(key, default)
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            expected = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise ConfigError(f"{self.table}.{key}: expected {expected}")
        return value

    def reject_unknown(self, known: set[str]) -> None:
        """ConfigError for any key of the table outside ``known`` (plus credentials_file)."""
        for key in self.options:
            if key not in known and key != "credentials_file":
                raise ConfigError(f"{self.table}.{key}: unknown key")

    def require_secret(self, name: str) -> str:
        """A secret that must be there: ConfigError names it (never its value)."""
        value = self.secret(name)
        if not value:
            raise ConfigError(
                f"{self.table}: {name} is not set (set the environment variable, or name a"
                f" credentials_file in [{self.table}])"
            )
        return value


@dataclass(frozen=True, slots=True)
class CallbackRequest:
    """One HTTP request a provider made to its callback endpoint, as it arrived.

    Its repr shows none of it: the body and headers may hold a phone number, an address
    or a signature.
    """

    #: the full URL the provider requested: the public scheme, host and path it was
    #: given, and the query string exactly as sent (a signature may cover it)
    url: str = field(repr=False)
    #: the request's headers, names in lower case (the last value of a repeated one)
    headers: Mapping[str, str] = field(repr=False)
    #: the body as posted, bytes for bytes
    body: bytes = field(repr=False)


@fast_init
@dataclass(frozen=True, slots=True)
class CallbackReport:
    """One status report a verified callback carried, as the machine reads it."""

    #: the provider's message id (None when the report names only the attempt)
    message_id: str | None
    #: the attempt key the message was sent under, when the provider echoed it back
    attempt_key: str | None
    #: the provider's status word as evidence (:meth:`StatusVocabulary.evidence`)
    raw_status: str
    #: its normalized status
    status: Status
    #: the report's identity, from signed (or authenticated) content only: a provider's
    #: retry of the same report is stored once
    dedupe: str


class CallbackReader(Protocol):
    """A provider instance's callbacks and webhooks: verified and read by its own kind.

    The API, ``observe`` and the web layer route a request to the instance it was
    addressed to and know no provider's fields or signature scheme.
    """

    #: the public URL the provider posts to (its path is where ``serve`` mounts it),
    #: or None when the instance was given none
    public_url: str | None
    #: the media types its requests come in (anything else is refused unread)
    media_types: frozenset[str]

    def check(self) -> None:
        """ConfigError (naming the secret, never its value) when a key it verifies
        requests with is missing: a server fails when it starts, not on the first
        callback. Building the reader does not check, so ``observe`` of one instance
        never needs another's keys."""
        ...

    def read(self, request: CallbackRequest, now: float) -> Sequence[CallbackReport]:
        """The reports ``request`` carries, once its signature (or credentials) match.

        Raises SignatureMismatch for a forged or stale request and MalformedCallback
        for one that is not a report; neither message quotes the request. A verified
        request that says nothing the machine reads (an open, a click) is no report.
        """
        ...


@dataclass(frozen=True, slots=True)
class TransportPlugin:
    """A transport as registered in the ``resetctl.transports`` entry-point group."""

    #: the name used under [transport]
    name: str
    #: channels it can serve
    channels: frozenset[str]
    #: builds an instance for one channel; raises ConfigError for bad options or
    #: missing credentials, before any notice is claimed
    create: Callable[[TransportContext], Transport]
    #: its raw status vocabulary, for replay traces
    vocabulary: StatusVocabulary
    #: builds the reader of an instance's callbacks and webhooks from the same context
    #: (ConfigError when a signing key it needs is missing), or None: no callbacks
    callbacks: Callable[[TransportContext], CallbackReader] | None = None
