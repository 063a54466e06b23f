"""The sweep's clocks and crash points: real time, or a rehearsal's (sped up, or set
off as another host's would be), the host's monotonic clock beside it, and the
failpoints crash tests kill a sweep at. The sweep loop reads these; nothing here
decides anything about a notice."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from resetctl import machine

#: Failpoint names for crash tests (RESETCTL_FAILPOINTS, comma-separated): the process
#: kills itself with SIGKILL at that boundary, as a crash would.
FAILPOINTS = frozenset({"after_claim", "after_intent", "after_submit", "during_outcome"})


def default_worker_id() -> str:
    """``host:pid``: unique per process, readable in ``inspect``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def clock_from_env(
    environ: Mapping[str, str],
) -> tuple[Callable[[], float], Callable[[float], None]]:
    """The sweep's clock and sleep: real time, or, for soak tests and rehearsals, time
    running RESETCTL_TIME_SCALE times faster since RESETCTL_TIME_ORIGIN (epoch seconds),
    so several processes share one accelerated clock. RESETCTL_CLOCK_SKEW (seconds)
    sets this host's clock off by that much (the multi-host simulation's fast host)."""
    scale = float(environ.get("RESETCTL_TIME_SCALE", "1") or 1)
    skew = float(environ.get("RESETCTL_CLOCK_SKEW", "0") or 0)
    if scale == 1 and skew == 0:
        return time.time, time.sleep
    origin = float(environ.get("RESETCTL_TIME_ORIGIN") or time.time()) if scale != 1 else 0.0
    clock = HostClock(scale, skew, origin)
    return clock, clock.sleep


@dataclass(frozen=True, slots=True)
class HostClock:
    """This host's wall clock, set off by ``skew`` seconds and running ``scale`` times
    faster since ``origin`` (rehearsals and multi-host tests), with its monotonic clock
    beside it, sped up alike."""

    #: how many times faster than real time
    scale: float = 1.0
    #: seconds this host's clock is off
    skew: float = 0.0
    #: the epoch second from which a scaled clock runs faster
    origin: float = 0.0

    def __call__(self) -> float:
        real = time.time()
        return self.origin + (real - self.origin) * self.scale + self.skew

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock's time."""
        time.sleep(seconds / self.scale)

    def monotonic(self) -> str | None:
        """The host's monotonic reading, scaled as this clock is."""
        return host_monotonic(self.scale)()


def monotonic_for(clock: Callable[[], float]) -> Callable[[], str | None]:
    """The monotonic readings that go with ``clock``: the host's for the real clock
    (or a HostClock), none for an injected one (a test's fake clock), whose time the
    host's monotonic clock knows nothing of."""
    if clock is time.time:
        return host_monotonic()
    if isinstance(clock, HostClock):
        return clock.monotonic
    return no_monotonic


def failpoints_from_env(environ: Mapping[str, str]) -> frozenset[str]:
    """The failpoints named in RESETCTL_FAILPOINTS (unknown names are ignored)."""
    names = environ.get("RESETCTL_FAILPOINTS", "")
    return frozenset(n.strip() for n in names.split(",") if n.strip() in FAILPOINTS)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


#: This boot's id (Linux): monotonic readings compare only within one boot.
_BOOT_ID = _boot_id()


def host_monotonic(scale: float = 1.0) -> Callable[[], str | None]:
    """This host's monotonic clock as the machine stores it (``boot@seconds``): Linux's
    CLOCK_BOOTTIME, which every process on the host shares and no wall-clock step
    moves; ``scale`` speeds it up as RESETCTL_TIME_SCALE speeds up the sweep's clock.
    Where there is no such clock, readings are None and only the wall clock counts."""
    boot = _BOOT_ID
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if boot is None or clock_id is None:
        return lambda: None

    def reading() -> str:
        return machine.monotonic_reading(boot, time.clock_gettime(clock_id) * scale)

    return reading


def no_monotonic() -> str | None:
    """No monotonic reading: for an injected clock (tests, rehearsals), whose time a
    host's monotonic clock knows nothing of."""
    return None


def crash_at(failpoints: frozenset[str], name: str) -> None:
    """Kill this process with SIGKILL at failpoint ``name``, when it is armed, as a
    crash would (nothing after it runs, no cleanup)."""
    if name in failpoints:
        os.kill(os.getpid(), signal.SIGKILL)
