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

It also holds ``countbox``, the outbox with a call counter, for the race tests: both
append every submission to the file their table's ``call_log`` names, one line per
transport call, so a test counts calls per attempt key across processes. The outbox
keeps one message per key whatever the number of calls, so counting its rows cannot
show a duplicate call.

`install` puts a copy of this file in a directory as the module ``resetctl_soakbox``
with a dist-info entry point, as a third-party plugin would be installed.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True, slots=True)
class Call:
    """One transport call, as the call log has it."""

    attempt_key: str
    #: the process that made it
    pid: int
    #: the caller's clock at the call
    at: float


def _call_log(context: TransportContext) -> str | None:
    path: str | None = context.option("call_log", None, (str, type(None)))
    return path


def record_call(call_log: str | None, attempt_key: str, at: float) -> None:
    """Append one call to the log: one write to an O_APPEND file, so processes never
    interleave within a line."""
    if call_log is None:
        return
    line = f"{attempt_key}\t{os.getpid()}\t{at!r}\n".encode()
    fd = os.open(call_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_calls(call_log: Path) -> list[Call]:
    """Every call the log holds, in the order they were made (none if no file)."""
    if not call_log.exists():
        return []
    calls = []
    for line in call_log.read_text(encoding="utf-8").splitlines():
        key, pid, at = line.split("\t")
        calls.append(Call(key, int(pid), float(at)))
    return calls


class Soakbox:
    """The outbox's storage with scripted fates."""

    name = "soakbox"
    recovers_by_key = True
    #: like the outbox, it makes no network call for a lease to cover
    call_timeout = 0.0

    def __init__(self, context: TransportContext) -> None:
        context.reject_unknown({"call_log"})
        self._store = context.store
        self._clock = context.clock
        self._outbox = OutboxTransport(context.store, "pending", context.clock)
        self._call_log = _call_log(context)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Store the message once per key; report its status as of now."""
        now = self._clock()
        record_call(self._call_log, attempt_key, now)
        stored = self._outbox.submit(message, attempt_key)
        row = self._store.outbox_message(stored.message_id)
        # The outbox may hold a new message back until the sweep's round commits its
        # outcomes: then it was stored just now.
        submitted_at = now if row is None else float(row["submitted_at"])
        raw = raw_status(str(message.channel), message.recipient, now - submitted_at)
        return ProviderStatus(stored.message_id, raw, normalize(raw))

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


class Countbox:
    """The outbox, with every submission appended to the call log first.

    Options as the outbox's: ``email_status`` and ``sms_status`` set the status a new
    message starts with; ``latency`` (seconds) is a provider's time per submission, so a
    batch's calls can outlast a short lease whatever the machine's speed.
    """

    name = "countbox"
    recovers_by_key = True

    def __init__(self, context: TransportContext) -> None:
        context.reject_unknown({"email_status", "sms_status", "call_log", "latency"})
        default = "accepted" if context.channel == "email" else "delivered"
        initial = context.option(f"{context.channel}_status", default, str)
        self._clock = context.clock
        self._outbox = OutboxTransport(context.store, initial, context.clock)
        self._call_log = _call_log(context)
        self._latency = float(context.option("latency", 0.0, (int, float)))
        #: the outbox's (no network call for a lease to cover), plus any latency
        self.call_timeout = self._latency

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        """Count the call, then store the message once per key."""
        record_call(self._call_log, attempt_key, self._clock())
        if self._latency:
            time.sleep(self._latency)  # the simulated provider at work, in real time
        return self._outbox.submit(message, attempt_key)

    def status(self, message_id: str) -> ProviderStatus:
        """The outbox's status of the message."""
        return self._outbox.status(message_id)

    def close(self) -> None:
        """Nothing to release: the store belongs to the sweep."""


def _create(context: TransportContext) -> Transport:
    return Soakbox(context)


def _create_countbox(context: TransportContext) -> Transport:
    return Countbox(context)


PLUGIN = TransportPlugin(
    name="soakbox",
    channels=frozenset({"email", "sms"}),
    create=_create,
    vocabulary=StatusVocabulary("soakbox", frozenset(OUTBOX_STATUSES), normalize),
)
COUNTBOX = TransportPlugin(
    name="countbox",
    channels=frozenset({"email", "sms"}),
    create=_create_countbox,
    vocabulary=StatusVocabulary("countbox", frozenset(OUTBOX_STATUSES), normalize),
)


def install(site: Path) -> None:
    """Install a copy of this file in ``site`` as the plugin package resetctl-soakbox."""
    site.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).read_text(encoding="utf-8")
    (site / "resetctl_soakbox.py").write_text(source, encoding="utf-8")
    dist = site / "resetctl_soakbox-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: resetctl-soakbox\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[resetctl.transports]\n"
        "soakbox = resetctl_soakbox:PLUGIN\n"
        "countbox = resetctl_soakbox:COUNTBOX\n",
        encoding="utf-8",
    )
