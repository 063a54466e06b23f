"""Replay de-identified timing traces through the real machine under a simulated clock.

Each trace is one reset: when it arrived, how long its link lived, and per channel the
provider statuses seen at offsets from that channel's own submission. A discrete-event
simulation models cron's cadence, the in-minute ``--max-runtime`` loop, batch size, leases
and the time transport calls take, and drives every notice with the same transition
function ``sweep`` uses. It has no rules of its own and writes no database.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import math
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from resetctl import machine
from resetctl.config import Channel, Policy
from resetctl.errors import InputError, label
from resetctl.machine import (
    ActionKind,
    Decision,
    NoticeState,
    Observed,
    OutcomeKind,
    Phase,
    Reason,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
)
from resetctl.transports import StatusVocabulary, status_vocabulary

CHANNELS = ("email", "sms")
TRACE_FIELDS = frozenset({"trace_id", "region", "arrived_at", "ttl", "transport", *CHANNELS})
#: Expiry reasons that mean the link ran out of time before the next action could happen:
#: the notices an on-call engineer would have been paged about.
PAGING_REASONS = frozenset(
    {Reason.FALLBACK_RESERVE_NOT_MET, Reason.NO_USEFUL_TIME, Reason.LINK_EXPIRED}
)


@dataclass(frozen=True, slots=True)
class Timeline:
    """A channel's provider statuses by offset from its submission."""

    offsets: tuple[float, ...]
    statuses: tuple[Status, ...]

    def status_at(self, offset: float) -> Status:
        """The latest status reported at or before ``offset`` (pending before any)."""
        index = bisect_right(self.offsets, offset)
        return self.statuses[index - 1] if index else Status.PENDING

    def first_success(self, success: frozenset[str]) -> float | None:
        """The offset of the first status in ``success`` (the policy's success statuses
        for this channel), if any."""
        for offset, status in zip(self.offsets, self.statuses, strict=True):
            if status in success:
                return offset
        return None


NEVER_ANSWERS = Timeline((), ())


@dataclass(frozen=True, slots=True)
class Trace:
    """One reset's timing, with no notice id, account, contact data or URL."""

    line: int
    trace_id: str
    region: str
    arrived_at: float
    ttl: float
    timelines: Mapping[str, Timeline]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@functools.lru_cache(maxsize=64)
def _vocabulary(name: str) -> StatusVocabulary | None:
    # Looked up once per transport name, not once per line.
    return status_vocabulary(name)


def parse_trace(
    text: str, line: int, previous_arrival: float, unknown: Counter[tuple[str, str, str]]
) -> Trace:
    """One JSON line of a trace file; raises InputError naming the line and field."""

    def bad(field_name: str, problem: str) -> InputError:
        return InputError([f"line {line}: {field_name}: {problem}"])

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad("(line)", f"not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError):
        raise bad("(line)", "a number or nesting too large to read") from None
    if not isinstance(data, dict):
        raise bad("(line)", "expected a JSON object")
    for key in data:
        if key not in TRACE_FIELDS:
            shown = label(key)
            if shown == key:
                raise bad(key, "unknown field")
            raise bad("(field)", f"unknown field {shown}")
    trace_id = data.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id:
        raise bad("trace_id", "expected a non-empty string")
    region = data.get("region", "default")
    if not isinstance(region, str) or not region:
        raise bad("region", "expected a non-empty string")
    arrived_at = _number(data.get("arrived_at"))
    if arrived_at is None or arrived_at < 0:
        raise bad("arrived_at", "expected seconds (≥ 0) from the start of the trace")
    if arrived_at < previous_arrival:
        raise bad("arrived_at", "traces must be sorted by arrival")
    ttl = _number(data.get("ttl"))
    if ttl is None or ttl <= 0:
        raise bad("ttl", "expected a positive number of seconds")
    transports = data.get("transport", {})
    if not isinstance(transports, dict):
        raise bad("transport", 'expected an object such as {"email": "postmark"}')
    timelines: dict[str, Timeline] = {}
    for channel in CHANNELS:
        name = transports.get(channel, "outbox")
        vocabulary = _vocabulary(name) if isinstance(name, str) else None
        if vocabulary is None:
            raise bad(f"transport.{channel}", f"unknown transport {name!r}")
        raw_timeline = data.get(channel)
        if raw_timeline is None:
            continue
        if not isinstance(raw_timeline, list):
            raise bad(channel, "expected a list of [seconds, status] pairs")
        offsets: list[float] = []
        statuses: list[Status] = []
        for index, pair in enumerate(raw_timeline):
            where = f"{channel}[{index}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise bad(where, "expected [seconds_after_submission, raw_status]")
            offset, raw = _number(pair[0]), pair[1]
            if offset is None or offset < 0:
                raise bad(where, "expected seconds (≥ 0) after submission")
            if offsets and offset < offsets[-1]:
                raise bad(where, "timeline offsets must not decrease")
            if not isinstance(raw, str):
                raise bad(where, "expected a raw status string")
            if raw not in vocabulary.known:
                unknown[(name, channel, raw)] += 1
            offsets.append(offset)
            statuses.append(vocabulary.normalize(raw))
        timelines[channel] = Timeline(tuple(offsets), tuple(statuses))
    return Trace(line, trace_id, region, arrived_at, ttl, timelines)


def read_traces(lines: Iterable[str], unknown: Counter[tuple[str, str, str]]) -> Iterator[Trace]:
    """Parse a trace file lazily, checking arrival order; blank lines are skipped."""
    previous = 0.0
    source = iter(lines)
    number = 0
    while True:
        number += 1
        try:
            text = next(source)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise InputError([f"line {number}: (line): not UTF-8 text"]) from None
        if not text.strip():
            continue
        trace = parse_trace(text, number, previous, unknown)
        previous = trace.arrived_at
        yield trace


@dataclass(frozen=True, slots=True)
class Candidate:
    """One set of policies to compare, by region."""

    label: str
    policies: Mapping[str, Policy]

    def policy_for(self, region: str) -> Policy:
        """The region's policy, else the default one."""
        return self.policies.get(region) or self.policies["default"]


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


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    rank = max(1, math.ceil(fraction * len(values)))
    return float(values[rank - 1])


@dataclass(slots=True)
class ReplayStats:
    """Counters and samples gathered over one candidate's simulation."""

    notices: int = 0
    accepted: int = 0
    accepted_primary: int = 0
    escalated: int = 0
    expired: int = 0
    failed: int = 0
    both_channels: int = 0
    late_primary_after_fallback: int = 0
    status_reads: int = 0
    would_page: int = 0
    sent: Counter[str] = field(default_factory=Counter)
    remaining_at_fallback: array[float] = field(default_factory=lambda: array("d"))
    time_to_acceptance: array[float] = field(default_factory=lambda: array("d"))
    queue_delay: array[float] = field(default_factory=lambda: array("d"))


class _Live:
    """A notice in flight in the simulation."""

    __slots__ = ("fallback_at", "policy", "reads", "sent", "state", "submitted_at", "trace")

    sent: Counter[str]

    def __init__(self, trace: Trace, policy: Policy, state: NoticeState) -> None:
        self.trace = trace
        self.policy = policy
        self.state = state
        self.submitted_at: dict[str, float] = {}
        self.fallback_at: float | None = None
        self.reads = 0
        self.sent = Counter()


class Simulation:
    """One candidate's simulated production: cron, sweeps, leases, the machine."""

    def __init__(
        self,
        candidate: Candidate,
        options: SimulationOptions,
        on_end: Callable[[Trace, NoticeState, Counter[str]], None] | None = None,
    ) -> None:
        self.candidate = candidate
        self.options = options
        self.on_end = on_end
        default = candidate.policy_for("default")
        self.batch_size = options.batch_size or default.batch_size
        self.lease = options.lease or default.lease
        self.margin = min(1.0, self.lease / 4)
        self.stats = ReplayStats()
        self._due: list[tuple[float, int, _Live]] = []
        self._workers: list[tuple[float, int, float]] = []  # (clock, seq, end)
        self._seq = itertools.count()
        self._next_tick = 0.0

    # -- driving ------------------------------------------------------------------

    def arrive(self, trace: Trace) -> None:
        """Run the world up to ``trace``'s arrival, then enqueue it."""
        self.run_until(trace.arrived_at)
        policy = self.candidate.policy_for(trace.region)
        channels = tuple(str(c) for c in policy.channels)
        state = NoticeState(trace.trace_id, Phase.QUEUED, trace.arrived_at + trace.ttl, channels)
        self.stats.notices += 1
        self._push(trace.arrived_at, _Live(trace, policy, state))

    def finish(self) -> ReplayStats:
        """Run until every notice is terminal."""
        self.run_until(math.inf)
        return self.stats

    def run_until(self, limit: float) -> None:
        """Process every sweep event before ``limit``."""
        while True:
            worker_at = self._workers[0][0] if self._workers else math.inf
            if not self._due and not self._workers:
                if math.isinf(limit):
                    return
                # Idle: skip cron ticks that would find nothing to do.
                interval = self.options.sweep_interval
                self._next_tick = max(self._next_tick, math.ceil(limit / interval) * interval)
                return
            if min(worker_at, self._next_tick) >= limit:
                return
            if self._next_tick <= worker_at:
                tick = self._next_tick
                self._next_tick += self.options.sweep_interval
                end = tick + self.options.max_runtime
                heapq.heappush(self._workers, (tick, next(self._seq), end))
            else:
                clock, _, end = heapq.heappop(self._workers)
                self._sweep(clock, end)

    def _push(self, due: float, live: _Live) -> None:
        heapq.heappush(self._due, (due, next(self._seq), live))

    # -- one sweep process ---------------------------------------------------------

    def _sweep(self, clock: float, end: float) -> None:
        """One pass of `sweep_due` at ``clock``; reschedules itself under --max-runtime."""
        clock = self._sweep_due(clock)
        if clock >= end:
            return
        wake = min(end, self._due[0][0]) if self._due else end
        heapq.heappush(self._workers, (max(wake, clock), next(self._seq), end))

    def _sweep_due(self, clock: float) -> float:
        while self._due and self._due[0][0] <= clock:
            batch: list[_Live] = []
            while self._due and self._due[0][0] <= clock and len(batch) < self.batch_size:
                batch.append(heapq.heappop(self._due)[2])
            lease_end = clock + self.lease
            for live in batch:
                clock = self._work(live, clock, lease_end)
        return clock

    def _work(self, live: _Live, clock: float, lease_end: float) -> float:
        """Mirror of Sweeper._work: decide, act while due, hand the notice back."""
        policy = live.policy
        # After a step, the decision made with it stands (as the sweep records it): only
        # the first look decides afresh. Deciding again on a terminal state would lose the
        # reason it ended for.
        decision = machine.decide(live.state, policy, clock)
        while True:
            if not decision.due(clock) or clock >= lease_end - self.margin:
                live.state = NoticeState(
                    live.state.notice_id,
                    decision.phase,
                    live.state.expires_at,
                    live.state.channels,
                    live.state.attempts,
                )
                if decision.phase.terminal:
                    self._record_end(live, decision.reason, clock)
                else:
                    assert decision.due_at is not None
                    self._push(decision.due_at, live)
                return clock
            channel = decision.channel
            assert channel is not None
            if decision.action is ActionKind.SUBMIT:
                clock, decision = self._submit(live, decision.phase, channel, clock)
            else:
                clock += self.options.call_time
                live.reads += 1
                offset = clock - live.submitted_at[channel]
                status = live.trace.timelines.get(channel, NEVER_ANSWERS).status_at(offset)
                live.state, decision = machine.transition(
                    live.state, policy, Observed(channel, status, is_poll=True), clock
                )

    def _submit(
        self, live: _Live, phase: Phase, channel: str, clock: float
    ) -> tuple[float, Decision]:
        state = NoticeState(
            live.state.notice_id,
            phase,
            live.state.expires_at,
            live.state.channels,
            live.state.attempts,
        )
        if channel != state.channels[0] and live.fallback_at is None:
            live.fallback_at = clock
        if not live.submitted_at:
            self.stats.queue_delay.append(clock - live.trace.arrived_at)
        key = machine.attempt_key(state.notice_id, channel)
        state = machine.apply(state, SubmissionStarted(channel, key, True), clock)
        clock += self.options.call_time
        live.submitted_at[channel] = clock
        live.sent[channel] += 1
        self.stats.sent[channel] += 1
        first = live.trace.timelines.get(channel, NEVER_ANSWERS).status_at(0.0)
        outcome = SubmissionOutcome(channel, OutcomeKind.SUBMITTED, "replay", first)
        live.state, decision = machine.transition(state, live.policy, outcome, clock)
        return clock, decision

    def _record_end(self, live: _Live, reason: Reason, clock: float) -> None:
        stats = self.stats
        trace = live.trace
        phase = live.state.phase
        stats.status_reads += live.reads
        primary = live.state.channels[0]
        if live.fallback_at is not None:
            stats.escalated += 1
            stats.remaining_at_fallback.append(live.state.expires_at - live.fallback_at)
            timeline = trace.timelines.get(primary, NEVER_ANSWERS)
            success = timeline.first_success(live.policy.success[Channel(primary)])
            if success is not None:
                arrives = live.submitted_at[primary] + success
                if live.fallback_at < arrives < live.state.expires_at:
                    stats.late_primary_after_fallback += 1
        if len(live.sent) > 1:
            stats.both_channels += 1
        if phase is Phase.ACCEPTED:
            stats.accepted += 1
            if live.fallback_at is None:
                stats.accepted_primary += 1
            stats.time_to_acceptance.append(clock - trace.arrived_at)
        elif phase is Phase.EXPIRED:
            stats.expired += 1
            if reason in PAGING_REASONS:
                stats.would_page += 1
        elif phase is Phase.FAILED:
            stats.failed += 1
        if self.on_end is not None:
            self.on_end(trace, live.state, live.sent)


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """One candidate's outcome over the whole trace file."""

    policy: str
    stats: ReplayStats

    def to_json(self) -> dict[str, Any]:
        """The public ``--json`` shape (snake_case keys)."""
        s = self.stats
        remaining = sorted(s.remaining_at_fallback)
        accepted = sorted(s.time_to_acceptance)
        delays = sorted(s.queue_delay)
        return {
            "policy": self.policy,
            "notices": s.notices,
            "accepted": s.accepted,
            "accepted_primary": s.accepted_primary,
            "escalated": s.escalated,
            "expired": s.expired,
            "failed": s.failed,
            "both_channels": s.both_channels,
            "late_primary_after_fallback": s.late_primary_after_fallback,
            "status_reads": s.status_reads,
            "status_reads_per_notice": round(s.status_reads / s.notices, 3) if s.notices else 0,
            "messages_sent": {channel: s.sent.get(channel, 0) for channel in CHANNELS},
            "remaining_at_fallback": {
                "p50": percentile(remaining, 0.5),
                "p95": percentile(remaining, 0.95),
                "min": remaining[0] if remaining else None,
            },
            "time_to_acceptance": {
                "p50": percentile(accepted, 0.5),
                "p95": percentile(accepted, 0.95),
            },
            "would_page": s.would_page,
            "queue_delay_p95": percentile(delays, 0.95),
        }


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Every candidate's report, plus the raw statuses no transport recognized."""

    reports: list[PolicyReport]
    unknown_statuses: Counter[tuple[str, str, str]]


def replay(
    lines: Iterable[str],
    candidates: Sequence[Candidate],
    options: SimulationOptions,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Run every trace through every candidate in one pass over ``lines``."""
    unknown: Counter[tuple[str, str, str]] = Counter()
    simulations = [Simulation(c, options) for c in candidates]
    for count, trace in enumerate(read_traces(lines, unknown), start=1):
        for simulation in simulations:
            simulation.arrive(trace)
        if progress is not None and count % 1000 == 0:
            progress(count)
    reports = [PolicyReport(s.candidate.label, s.finish()) for s in simulations]
    return ReplayResult(reports, unknown)
