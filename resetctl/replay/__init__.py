"""Replay de-identified timing traces through the real machine under a simulated clock.

Each trace is one reset: when it arrived, how long its link lived, and per channel what
the reads saw. The package is in parts: ``traces`` (the format, read and written),
``fitting`` (from what the reads saw to the timelines a notice follows), ``options`` (how
production runs sweeps), ``simulation`` (cron, sweeps and leases around the transition
function ``sweep`` uses), ``readings`` (what a simulated notice carries, and the envelope)
and ``report`` (the counters and the figures). It writes no database: ``export_timings``
only reads one.

What the traces cannot say is reported rather than guessed: every figure comes as an
optimistic value, a pessimistic one and a point estimate, with a range that also covers
the point estimate's alternatives (sweeps a little earlier or later, other borrowed
timelines for a channel a notice never used); borrowed timelines are counted.
"""

from resetctl.replay.fitting import (
    BORROW_POOL,
    FIT_SAMPLE,
    JUST_AFTER,
    DelayFit,
    Resolver,
    read_traces,
)
from resetctl.replay.options import IDLE_POLL, SimulationOptions, check_given, with_header
from resetctl.replay.readings import BORROW_DRAWS, COUNTS, Envelope, late_primary
from resetctl.replay.report import (
    PolicyReport,
    ReplayResult,
    ReplayStats,
    percentile,
)
from resetctl.replay.simulation import PAGING_REASONS, Candidate, Simulation, replay
from resetctl.replay.traces import (
    ALL_SCENARIOS,
    CHANNELS,
    CRON_INTERVAL,
    FINAL,
    FINAL_ORDER,
    HEADER_FIELDS,
    NEVER_ANSWERS,
    NEVER_ANSWERS_3,
    OPTIMISTIC,
    PESSIMISTIC,
    POINT,
    SCENARIOS,
    TRACE_FIELDS,
    TRACE_VERSION,
    Header,
    Observation,
    Timeline,
    Timelines,
    Trace,
    export_timings,
    parse_header,
    parse_trace,
    parse_traces,
    read_header,
)

__all__ = [
    "ALL_SCENARIOS",
    "BORROW_DRAWS",
    "BORROW_POOL",
    "CHANNELS",
    "COUNTS",
    "CRON_INTERVAL",
    "FINAL",
    "FINAL_ORDER",
    "FIT_SAMPLE",
    "HEADER_FIELDS",
    "IDLE_POLL",
    "JUST_AFTER",
    "NEVER_ANSWERS",
    "NEVER_ANSWERS_3",
    "OPTIMISTIC",
    "PAGING_REASONS",
    "PESSIMISTIC",
    "POINT",
    "SCENARIOS",
    "TRACE_FIELDS",
    "TRACE_VERSION",
    "Candidate",
    "DelayFit",
    "Envelope",
    "Header",
    "Observation",
    "PolicyReport",
    "ReplayResult",
    "ReplayStats",
    "Resolver",
    "Simulation",
    "SimulationOptions",
    "Timeline",
    "Timelines",
    "Trace",
    "check_given",
    "export_timings",
    "late_primary",
    "parse_header",
    "parse_trace",
    "parse_traces",
    "percentile",
    "read_header",
    "read_traces",
    "replay",
    "with_header",
]
