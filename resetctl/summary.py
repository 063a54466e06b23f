"""What a sweep did and the one line that says so, shared by the command line and the
idle tick (which answers before the command-line stack is imported, so this module
imports nothing heavy)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime


def iso(ts: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC."""
    if ts is None:
        return None
    try:
        moment = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, ValueError, OSError):
        # Only a notice stored before max_ttl existed can hold such a time.
        return "out of range"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


#: The phase a notice moves into, and the summary's count of such moves.
_PHASE_COUNTERS = {
    "fallback_pending": "escalated",
    "expired": "expired",
    "accepted": "accepted",
    "failed": "failed",
}


@dataclass(slots=True)
class SweepSummary:
    """What a sweep did."""

    claimed: int = 0
    submitted: int = 0
    polled: int = 0
    escalated: int = 0
    expired: int = 0
    accepted: int = 0
    failed: int = 0
    errors: int = 0
    #: ambiguous submissions looked up at the provider
    looked_up: int = 0
    #: submissions not made because the lease or the link ran short before the call
    declined: int = 0
    #: calls a provider throttled (a 429): not attempts; their lane paused as asked
    throttled: int = 0
    #: claimed notices handed back unworked because the run time was spent or a signal
    #: asked the sweep to stop
    released: int = 0
    lost_races: int = 0
    lease_recoveries: int = 0
    batches: int = 0
    duration: float = 0.0

    def count_phase(self, phase: str) -> None:
        """Count a notice that moved into ``phase`` (the ones a summary names)."""
        counter = _PHASE_COUNTERS.get(phase)
        if counter is not None:
            setattr(self, counter, getattr(self, counter) + 1)

    def to_json(self) -> dict[str, float | int]:
        """The `--json` summary."""
        return asdict(self)

    def line(self, finished_at: float, json_output: bool) -> str:
        """The summary as `sweep` prints it: it carries its time, because a crontab
        appends it to a log of its own (logs go to stderr)."""
        at = iso(finished_at)
        if json_output:
            return json.dumps({"at": at, **self.to_json()})
        return (
            f"{at} claimed {self.claimed}, submitted {self.submitted}, polled {self.polled}, "
            f"escalated {self.escalated}, accepted {self.accepted}, expired {self.expired}, "
            f"failed {self.failed}, errors {self.errors}, looked up {self.looked_up}, "
            f"declined {self.declined}, released {self.released} in {self.duration:.2f}s"
        )
