"""Transition events for logs and listeners, with redaction. Never raises into its caller.

Only ids, phases, channels, normalized statuses, counts and reasons are ever emitted: the
event type has no field that could hold an address, a phone number or a URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from resetctl.machine import NoticeState, Phase, Reason, Status

LOGGER = logging.getLogger("resetctl")
#: Event kinds whose log lines are routine when nothing else about them is rare.
_ROUTINE_KINDS = frozenset({"intent", "outcome", "poll", "callback", "tick", "cancel"})
#: Normalized statuses of routine lines (``failed`` and ``unknown`` are always kept).
_ROUTINE_STATUSES = frozenset({None, "pending", "accepted", "delivered"})
#: The machine's reasons on the way to a success (or a cancel): every other reason
#: names a failure, a retry, a doubt, an escalation or an expiry, and is always logged.
_ROUTINE_REASONS = frozenset(
    {
        None,
        "first_submission",
        "poll_scheduled",
        "accepted",
        "fallback_submission",
        "terminal",
        "completed",
        "superseded",
        "withdrawn",
    }
)


@dataclass(frozen=True, slots=True)
class TransitionEvent:
    """One recorded step of a notice, safe to print anywhere."""

    #: the notice's opaque id
    notice_id: str
    #: event kind: intent, outcome, poll, tick, lost_race, lease_recovered
    kind: str
    #: phase before the step
    old_phase: str
    #: phase after the step
    new_phase: str
    #: the sweep's worker id
    worker: str
    #: when (seconds since the epoch, from the caller's clock)
    at: float
    #: the channel concerned, if any
    channel: str | None = None
    #: the normalized status observed, if any
    status: str | None = None
    #: the machine's reason
    reason: str | None = None
    #: keyed HMAC of the recipient, for correlation across notices (never the address)
    recipient: str | None = None
    #: the attempt concerned (``<notice_id>:<channel>:<n>``), if any
    attempt_key: str | None = None
    #: status reads the attempt had made, if any
    polls: int | None = None


Listener = Callable[[TransitionEvent], None]
_EVENT_FIELDS = tuple(f.name for f in fields(TransitionEvent))


def transition_of(
    state: NoticeState,
    kind: str,
    old_phase: Phase,
    worker: str,
    at: float,
    channel: str | None = None,
    reason: Reason | None = None,
    status: Status | None = None,
    recipient: str | None = None,
) -> TransitionEvent:
    """The event of one recorded step of ``state``'s notice, with its attempt's key and
    poll count as the stored event has them."""
    attempt = None if channel is None else state.attempt(channel)
    return TransitionEvent(
        notice_id=state.notice_id,
        kind=kind,
        old_phase=old_phase.value,
        new_phase=state.phase.value,
        worker=worker,
        at=at,
        channel=channel,
        status=None if status is None else status.value,
        reason=None if reason is None else reason.value,
        recipient=recipient,
        attempt_key=None if attempt is None else attempt.key,
        polls=None if attempt is None else attempt.polls,
    )


def always_logged(values: Mapping[str, object]) -> bool:
    """True for a line sampling never drops: a failure, an expiry, an escalation (a move
    into the fallback), a lost race, a lease recovery, a doubt (a lookup, an ``unknown``
    status, a recovery) or anything else off the way to a success."""
    moved = values.get("old_phase") != values.get("new_phase")
    return (
        values.get("kind") not in _ROUTINE_KINDS
        or values.get("status") not in _ROUTINE_STATUSES
        or values.get("reason") not in _ROUTINE_REASONS
        or values.get("new_phase") in ("expired", "failed")
        or (moved and values.get("new_phase") == "fallback_pending")
    )


def sampled_in(notice_id: str, rate: float) -> bool:
    """Whether ``notice_id``'s routine lines are kept at ``rate`` (0 to 1): decided by a
    hash of the id, so one notice's lines are kept or dropped together, on every host."""
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(notice_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < rate * 2**64


def keeps_line(values: Mapping[str, object], rate: float) -> bool:
    """Whether a transition's log line is written under ``[telemetry] sample_success``."""
    return always_logged(values) or sampled_in(str(values.get("notice_id")), rate)


def emit(listeners: list[Listener], event: TransitionEvent, sample_success: float = 1.0) -> None:
    """Hand ``event`` to the log (routine lines sampled at ``sample_success``, by
    notice) and every listener (never sampled); a failing listener is only logged."""
    # Telemetry must never break a sweep: neither the log nor a listener may raise here.
    with contextlib.suppress(Exception):
        # Built only when someone listens: a sweep emits one event per step.
        if LOGGER.isEnabledFor(logging.INFO):
            values = {name: getattr(event, name) for name in _EVENT_FIELDS}
            if keeps_line(values, sample_success):
                LOGGER.info("transition", extra={"transition": values})
    for listener in listeners:
        try:
            listener(event)
        except Exception as exc:
            with contextlib.suppress(Exception):
                LOGGER.warning("transition listener failed: %s", type(exc).__name__)


def event_values(row: Mapping[str, object]) -> dict[str, object]:
    """A stored event row as the fields its log line carries (the recipient hash, a
    sweep's own, is not stored with it)."""
    return {name: row.get(name) for name in _EVENT_FIELDS}


def json_line_bytes(values: Mapping[str, object]) -> int:
    """The bytes of the JSON log line (with its newline) a transition writes."""
    record = logging.LogRecord("resetctl", logging.INFO, __file__, 0, "transition", None, None)
    record.created = float(values.get("at") or 0.0)  # type: ignore[arg-type]
    record.msecs = record.created % 1 * 1000
    record.transition = dict(values)
    return len(_JSON.format(record).encode("utf-8")) + 1


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message and a transition's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        transition = getattr(record, "transition", None)
        if isinstance(transition, dict):
            line.update(transition)
        return json.dumps(line, separators=(",", ":"))


class TextLines(logging.Formatter):
    """``time level logger message key=value …``."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{self.formatTime(record)} {record.levelname} {record.name} {record.getMessage()}"
        transition = getattr(record, "transition", None)
        if isinstance(transition, dict):
            text += " " + " ".join(f"{k}={v}" for k, v in transition.items() if v is not None)
        return text


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (tests and runners swap it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


_JSON = JsonLines()
_JSON.converter = time.gmtime


def configure_logging(log_format: str, level: str) -> None:
    """Send resetctl's logs to stderr as ``json`` or ``text`` lines at ``level``."""
    formatter: logging.Formatter = JsonLines() if log_format == "json" else TextLines()
    formatter.converter = time.gmtime  # UTC, as the "Z" says
    handler = _Stderr()
    handler.setFormatter(formatter)
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(getattr(logging, level.upper(), logging.INFO))
    LOGGER.propagate = False
