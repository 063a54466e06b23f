"""``soakbox``: a transport plugin for the soak test, whose recipients name their fate.

It stores every message in the outbox (deduplicated by attempt key, so a resubmission
after a crash or a lapsed lease gets the first message back) but reports a status that
depends on the recipient and on how long ago, on the sweep's clock, the message was
first stored:

- email ``<fate>-<n>@soak.example``;
- SMS ``+1 415 55<f> <nnnn>``, the exchange digit ``f`` naming the fate.

Fates: ``accept`` (accepted after a short latency), ``fail`` (failed after a short
delay), ``never`` (pending for ever) and ``late`` (delivered minutes later, after the
channel's polls are spent). Delays are drawn from a hash of the recipient, so every
process, and the test predicting the outcome, agrees on them.

test_soak.py installs a copy of this file as the module ``resetctl_soakbox`` with a
dist-info entry point, as a third-party plugin would be installed.
"""

from __future__ import annotations

import hashlib

from resetctl.transports.base import (
    Message,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    Transport,
    TransportContext,
    TransportPlugin,
)
from resetctl.transports.outbox import OUTBOX_STATUSES, OutboxTransport, normalize

FATES = ("accept", "fail", "never", "late")
#: Percent of recipients per fate, by channel: (accept, fail, never, late).
WEIGHTS = {"email": (50, 20, 15, 15), "sms": (60, 15, 15, 10)}
#: Seconds (simulated) before an accepted or failed message says so: within the first
#: channel's last poll (105 s), so the machine always hears the answer in time.
QUICK = (0, 90)
#: Seconds before a late message is delivered: after the email's last poll (105 s) and
#: the SMS's (105 s after its own submission), so nobody is polling any more.
LATE = (240, 480)
_SMS_PREFIX = "+141555"
_RAW = {"email": "accepted", "sms": "delivered"}


def _draw(text: str, salt: str) -> int:
    """A deterministic number in [0, 2**32) from ``text``."""
    digest = hashlib.sha256(f"{salt}:{text}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def fate_of(channel: str, n: int) -> str:
    """The fate of notice ``n``'s message on ``channel``."""
    bucket = _draw(str(n), channel) % 100
    for fate, weight in zip(FATES, WEIGHTS[channel], strict=True):
        if bucket < weight:
            return fate
        bucket -= weight
    raise AssertionError("weights add up to 100")


def email_for(n: int) -> str:
    """Notice ``n``'s email address, naming its email fate."""
    return f"{fate_of('email', n)}-{n}@soak.example"


def phone_for(n: int) -> str:
    """Notice ``n``'s E.164 number, its exchange naming its SMS fate."""
    return f"{_SMS_PREFIX}{FATES.index(fate_of('sms', n))}{n % 10_000:04d}"


def _fate_of_recipient(channel: str, recipient: str) -> str:
    if channel == "email":
        return recipient.partition("-")[0]
    return FATES[int(recipient[len(_SMS_PREFIX)])]


def delay_of(channel: str, recipient: str) -> float:
    """Seconds after submission at which the recipient's message reaches its end state."""
    low, high = LATE if _fate_of_recipient(channel, recipient) == "late" else QUICK
    return float(low + _draw(recipient, "delay") % (high - low + 1))


def raw_status(channel: str, recipient: str, age: float) -> str:
    """The raw status a message to ``recipient`` has ``age`` seconds after submission."""
    fate = _fate_of_recipient(channel, recipient)
    if fate == "never" or age < delay_of(channel, recipient):
        return "pending"
    return "failed" if fate == "fail" else _RAW[channel]


class Soakbox:
    """The outbox's storage with scripted fates."""

    name = "soakbox"
    recovers_by_key = True

    def __init__(self, context: TransportContext) -> None:
        context.reject_unknown(set())
        self._store = context.store
        self._clock = context.clock
        self._outbox = OutboxTransport(context.store, "pending", context.clock)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Store the message once per key; report its status as of now."""
        stored = self._outbox.submit(message, attempt_key)
        return self.status(stored.message_id)

    def status(self, message_id: str) -> ProviderStatus:
        """The status the recipient's fate gives the message at this age."""
        row = self._store.outbox_message(message_id)
        if row is None:
            raise PermanentError("soakbox has no such message")
        age = self._clock() - float(row["submitted_at"])
        raw = raw_status(str(row["channel"]), str(row["to"]), age)
        return ProviderStatus(message_id, raw, normalize(raw))

    def close(self) -> None:
        """Nothing to release: the store belongs to the sweep."""


def _create(context: TransportContext) -> Transport:
    return Soakbox(context)


PLUGIN = TransportPlugin(
    name="soakbox",
    channels=frozenset({"email", "sms"}),
    create=_create,
    vocabulary=StatusVocabulary("soakbox", frozenset(OUTBOX_STATUSES), normalize),
)
