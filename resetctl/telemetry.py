"""Transition events for logs and listeners, with redaction. Never raises into its caller.

Only ids, phases, channels, normalized statuses, counts and reasons are ever emitted: the
event type has no field that could hold an address, a phone number or a URL.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

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


Listener = Callable[[TransitionEvent], None]


def emit(listeners: list[Listener], event: TransitionEvent) -> None:
    """Hand ``event`` to the log and every listener; a failing listener is only logged."""
    # Telemetry must never break a sweep: neither the log nor a listener may raise here.
    with contextlib.suppress(Exception):
        LOGGER.info("transition %s", json.dumps(asdict(event), sort_keys=True))
    for listener in listeners:
        try:
            listener(event)
        except Exception as exc:
            with contextlib.suppress(Exception):
                LOGGER.warning("transition listener failed: %s", type(exc).__name__)
