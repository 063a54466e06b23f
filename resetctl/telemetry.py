"""Transition events for logs and listeners, with redaction. Never raises into its caller.

Only ids, phases, channels, normalized statuses, counts and reasons are ever emitted: the
event type has no field that could hold an address, a phone number or a URL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TextIO

LOGGER = logging.getLogger("resetctl")


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


Listener = Callable[[TransitionEvent], None]
_EVENT_FIELDS = tuple(f.name for f in fields(TransitionEvent))


def emit(listeners: list[Listener], event: TransitionEvent) -> None:
    """Hand ``event`` to the log and every listener; a failing listener is only logged."""
    # Telemetry must never break a sweep: neither the log nor a listener may raise here.
    with contextlib.suppress(Exception):
        # Built only when someone listens: a sweep emits one event per step.
        if LOGGER.isEnabledFor(logging.INFO):
            values = {name: getattr(event, name) for name in _EVENT_FIELDS}
            LOGGER.info("transition", extra={"transition": values})
    for listener in listeners:
        try:
            listener(event)
        except Exception as exc:
            with contextlib.suppress(Exception):
                LOGGER.warning("transition listener failed: %s", type(exc).__name__)


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


def configure_logging(log_format: str, level: str) -> None:
    """Send resetctl's logs to stderr as ``json`` or ``text`` lines at ``level``."""
    formatter: logging.Formatter = JsonLines() if log_format == "json" else TextLines()
    formatter.converter = time.gmtime  # UTC, as the "Z" says
    handler = _Stderr()
    handler.setFormatter(formatter)
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(getattr(logging, level.upper(), logging.INFO))
    LOGGER.propagate = False
