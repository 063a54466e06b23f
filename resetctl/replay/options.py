"""How production runs sweeps, as replay models them: the options, and what a trace
file's header measured about them."""

from __future__ import annotations

from dataclasses import dataclass

from resetctl.errors import ConfigError
from resetctl.replay.traces import (
    MAX_READ_LAG,
    MAX_SWEEP_INTERVAL,
    MAX_SWEEP_START,
    MIN_SWEEP_INTERVAL,
    Header,
)

#: An idle sweep with --max-runtime looks for newly due work this often (sweep.IDLE_POLL).
IDLE_POLL = 1.0


@dataclass(frozen=True, slots=True)
class SimulationOptions:
    """How production runs sweeps, as the simulation models it."""

    #: seconds between cron starts of `resetctl sweep`
    sweep_interval: float = 60.0
    #: each sweep's --max-runtime (0: one pass, then exit)
    max_runtime: float = 0.0
    #: simulated seconds one transport call takes (submission or status read)
    call_time: float = 0.0
    #: notices per claim (default: the default policy's batch_size)
    batch_size: int | None = None
    #: seconds per lease (default: the default policy's lease)
    lease: float | None = None
    #: seconds from the first arrival to the first cron minute (the cron phase)
    first_sweep_at: float = 0.0
    #: seconds from a status read's due time to the read
    read_lag: float = 0.0
    #: seconds after its cron minute that each sweep starts (cron's own latency)
    sweep_start: float = 0.0
    #: how much earlier or later than simulated a real sweep may have acted on a notice
    #: (seconds): the range carries what that changes (0: nothing)
    timing_slack: float = 0.0


def check_given(
    sweep_interval: float | None, read_lag: float | None, sweep_start: float | None = None
) -> None:
    """ConfigError for a cron interval, read lag or sweep start given outside what a trace
    may say."""
    if sweep_interval is not None and not (
        MIN_SWEEP_INTERVAL <= sweep_interval <= MAX_SWEEP_INTERVAL
    ):
        raise ConfigError(
            f"--sweep-interval: must be from {MIN_SWEEP_INTERVAL:g}s to {MAX_SWEEP_INTERVAL:g}s"
        )
    if read_lag is not None and not 0 <= read_lag <= MAX_READ_LAG:
        raise ConfigError(f"--read-lag: must be from 0 to {MAX_READ_LAG:g}s")
    if sweep_start is not None and not 0 <= sweep_start <= MAX_SWEEP_START:
        raise ConfigError(f"sweep_start: must be from 0 to {MAX_SWEEP_START:g}s")


def with_header(
    options: SimulationOptions, header: Header, **given: float | None
) -> SimulationOptions:
    """``options`` with the cron phase, read lag and sweep start (each median) the header
    measured, unless given; the timing slack the range carries is one idle look (under
    --max-runtime) or the sweep start's spread, whichever is wider."""
    sweep_interval = given.get("sweep_interval") or header.sweep_interval or options.sweep_interval
    first = header.first_sweep_at if header.first_sweep_at is not None else options.first_sweep_at
    lag = given.get("read_lag")
    if lag is None:
        lag = header.read_lag_p50 if header.read_lag_p50 is not None else options.read_lag
    start = given.get("sweep_start")
    if start is None:
        start = header.sweep_start_p50
    if start is None:
        start = options.sweep_start
    slack = given.get("timing_slack")
    if slack is None:
        spread = 0.0
        if header.sweep_start_p50 is not None and header.sweep_start_p90 is not None:
            spread = header.sweep_start_p90 - header.sweep_start_p50
        slack = max(IDLE_POLL if options.max_runtime > 0 else 0.0, spread, options.timing_slack)
    return SimulationOptions(
        sweep_interval=sweep_interval,
        max_runtime=options.max_runtime,
        call_time=options.call_time,
        batch_size=options.batch_size,
        lease=options.lease,
        first_sweep_at=first,
        read_lag=lag,
        sweep_start=start,
        timing_slack=slack,
    )
