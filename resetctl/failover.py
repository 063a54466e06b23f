"""Provider instance health: when an instance is taken out of use, and when it comes back.

After ``[failover] after`` consecutive transient failures or time-outs, all within
``window`` of the first, an instance is **open** for ``cooldown``: no call goes to it, and
new attempts go to the next healthy instance of their channel. When the cooldown ends it
is **half open**: the first process to claim the probe makes one call (the instance is
**probing** while it runs); a success closes it, a failure opens it again. The state is
a row per instance in the database, so every sweep on every host agrees.

Everything here is pure (``now`` is passed in); the store reads and writes the rows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from resetctl.instances import Failover


class InstanceState(enum.StrEnum):
    """What an instance's health row says at one moment."""

    #: in use
    CLOSED = "closed"
    #: out of use until its cooldown ends
    OPEN = "open"
    #: its cooldown ended: the next call (one, by whoever claims it) is the probe
    HALF_OPEN = "half_open"
    #: its probe call is in flight
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class InstanceHealth:
    """One instance's health row."""

    #: the instance's name
    instance: str
    #: consecutive failures since its last success
    failures: int = 0
    #: when the first of them happened
    first_failure_at: float | None = None
    #: out of use until then (None: closed)
    open_until: float | None = None
    #: a probe call is in flight until then
    probe_until: float | None = None
    #: times it was opened (again after a failed probe included)
    opened: int = 0
    #: failures ever counted
    total_failures: int = 0
    #: the latest failure and success
    last_failure_at: float | None = None
    last_success_at: float | None = None

    def state(self, now: float) -> InstanceState:
        """Its state at ``now``."""
        if self.open_until is None:
            return InstanceState.CLOSED
        if now < self.open_until:
            return InstanceState.OPEN
        if self.probe_until is not None and now < self.probe_until:
            return InstanceState.PROBING
        return InstanceState.HALF_OPEN


def after_failure(health: InstanceHealth, now: float, failover: Failover) -> InstanceHealth:
    """The row after a failed call ended at ``now``."""
    counted = replace(health, total_failures=health.total_failures + 1, last_failure_at=now)
    state = health.state(now)
    if state is InstanceState.OPEN:
        return counted  # a call begun before it opened: it stays open as long as it was
    if state is not InstanceState.CLOSED:
        # The probe (or a call racing it) failed: out of use for another cooldown.
        return replace(
            counted,
            open_until=now + failover.cooldown,
            probe_until=None,
            opened=health.opened + 1,
            failures=health.failures + 1,
        )
    first = health.first_failure_at
    if first is None or now - first > failover.window:
        counted = replace(counted, failures=1, first_failure_at=now)
    else:
        counted = replace(counted, failures=health.failures + 1)
    if counted.failures >= failover.after:
        return replace(counted, open_until=now + failover.cooldown, opened=health.opened + 1)
    return counted


def after_success(health: InstanceHealth, now: float) -> InstanceHealth:
    """The row after a call the instance answered ended at ``now``: closed, no streak."""
    return replace(
        health,
        failures=0,
        first_failure_at=None,
        open_until=None,
        probe_until=None,
        last_success_at=now,
    )


def success_changes(health: InstanceHealth | None) -> bool:
    """True when a success must be written (it ends a streak or an opening); a success
    on a healthy instance writes nothing, so the common path costs no transaction."""
    return health is not None and (health.failures > 0 or health.open_until is not None)
