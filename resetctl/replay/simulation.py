"""The simulation: the real machine under a simulated clock, over a whole trace file.

A discrete-event simulation models cron's cadence and phase, the in-minute
``--max-runtime`` loop (and its one-second look for new work), batch size, leases, the
time transport calls take and how late reads come after they fall due, and drives every
notice with the same transition function ``sweep`` uses. It has no rules of its own and
writes no database.

A trace's cancel comes at its own time, whatever the sweeps are doing: a notice parked
across it is cancelled at that time when next looked at (before anything else), and one
in the middle of its work is cancelled before its next call. To count the fallbacks a
completed reset's cancel avoided, an uncancelled copy of the notice carries on unseen:
it takes no claim slot and no clock time, counts nothing else, and stops at the fallback
it would have sent.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from resetctl import machine
from resetctl.errors import ConfigError
from resetctl.machine import (
    ActionKind,
    Cancelled,
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
from resetctl.policy import Channel, Policy
from resetctl.replay.fitting import Resolver, read_traces
from resetctl.replay.report import PolicyReport, ReplayResult, ReplayStats
from resetctl.replay.traces import (
    ALL_SCENARIOS,
    MAX_READ_LAG,
    MAX_SWEEP_INTERVAL,
    MAX_SWEEP_START,
    MIN_SWEEP_INTERVAL,
    NEVER_ANSWERS_3,
    POINT,
    SCENARIOS,
    Header,
    Timelines,
    Trace,
    read_header,
)

#: Expiry reasons that mean the link ran out of time before the next action could happen:
#: the notices an on-call engineer would have been paged about.
PAGING_REASONS = frozenset(
    {Reason.FALLBACK_RESERVE_NOT_MET, Reason.NO_USEFUL_TIME, Reason.LINK_EXPIRED}
)
#: An idle sweep with --max-runtime looks for newly due work this often (sweep.IDLE_POLL).
IDLE_POLL = 1.0


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
    #: seconds from the first arrival to the first cron minute (the cron phase)
    first_sweep_at: float = 0.0
    #: seconds from a status read's due time to the read
    read_lag: float = 0.0
    #: seconds after its cron minute that each sweep starts (cron's own latency)
    sweep_start: float = 0.0


def _bits(mask: int) -> tuple[int, ...]:
    return _BITS[mask]


_BITS = tuple(tuple(s for s in range(3) if mask >> s & 1) for mask in range(8))


class _Live:
    """A notice in flight in the simulation, for the readings in ``mask``."""

    __slots__ = (
        "cancel_at",
        "fallback_at",
        "ghost",
        "mask",
        "policy",
        "reads",
        "sent",
        "state",
        "submitted_at",
        "trace",
    )

    #: messages sent per channel (a channel appears once it sent one)
    sent: dict[str, int]

    def __init__(self, trace: Trace, policy: Policy, state: NoticeState, mask: int) -> None:
        self.trace = trace
        self.policy = policy
        self.state = state
        self.mask = mask
        self.submitted_at: dict[str, float] = {}
        self.fallback_at: float | None = None
        self.reads = 0
        self.sent = {}
        cancelled = trace.cancelled
        #: when the application cancels it (math.inf: never)
        self.cancel_at = math.inf if cancelled is None else trace.arrived_at + cancelled[0]
        #: True for the uncancelled copy that only counts the fallback a cancel avoided
        self.ghost = False

    def fork(self, mask: int) -> _Live:
        """A copy for the readings in ``mask``, which saw something else from here on."""
        twin = self._copy(mask)
        self.mask &= ~mask
        return twin

    def uncancelled(self) -> _Live:
        """A ghost for the same readings: this notice as if its cancel never came."""
        twin = self._copy(self.mask)
        twin.cancel_at = math.inf
        twin.ghost = True
        return twin

    def _copy(self, mask: int) -> _Live:
        twin = _Live(self.trace, self.policy, self.state, mask)
        twin.submitted_at = dict(self.submitted_at)
        twin.fallback_at = self.fallback_at
        twin.reads = self.reads
        twin.sent = dict(self.sent)
        twin.cancel_at = self.cancel_at
        twin.ghost = self.ghost
        return twin


class Simulation:
    """One candidate's simulated production: cron, sweeps, leases, the machine.

    Every notice is simulated under the three readings of its trace at once: while they
    agree it is one notice; at the first read where they differ it forks, and each copy
    carries on for the readings that saw its status.
    """

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
        self.readings = [ReplayStats() for _ in SCENARIOS]
        #: per mask of readings, their counters (in _bits order)
        self._stats = tuple(
            tuple(self.readings[reading] for reading in _bits(mask)) for mask in range(8)
        )
        self._due: list[tuple[float, int, _Live]] = []
        self._workers: list[tuple[float, int, float]] = []  # (clock, seq, end)
        self._seq = itertools.count()
        self._phase = (options.first_sweep_at + options.sweep_start) % options.sweep_interval
        self._next_tick = self._phase
        self._regions: dict[str, tuple[Policy, tuple[str, ...]]] = {}

    @property
    def stats(self) -> ReplayStats:
        """The point estimate's counters."""
        return self.readings[POINT]

    # -- driving ------------------------------------------------------------------

    def arrive(self, trace: Trace) -> None:
        """Run the world up to ``trace``'s arrival, then enqueue it."""
        self.run_until(trace.arrived_at)
        region = self._regions.get(trace.region)
        if region is None:
            policy = self.candidate.policy_for(trace.region)
            region = self._regions[trace.region] = (
                policy,
                tuple(str(c) for c in policy.channels),
            )
        policy, channels = region
        state = NoticeState(trace.trace_id, Phase.QUEUED, trace.arrived_at + trace.ttl, channels)
        for stats in self.readings:
            stats.notices += 1
        self._push(trace.arrived_at, _Live(trace, policy, state, ALL_SCENARIOS))

    def finish(self) -> ReplayStats:
        """Run until every notice is terminal; the point estimate's counters."""
        self.run_until(math.inf)
        return self.stats

    def run_until(self, limit: float) -> None:
        """Process every sweep event before ``limit``."""
        while True:
            worker_at = self._workers[0][0] if self._workers else math.inf
            if not self._due and not self._workers:
                if math.isinf(limit):
                    return
                # Idle: skip cron ticks that would find nothing to do, but not the sweep
                # cron started last if, under --max-runtime, it is still looking for new
                # work every second when ``limit`` comes: it takes an arrival then, not
                # at the next tick.
                interval = self.options.sweep_interval
                tick = self._phase + math.ceil((limit - self._phase) / interval) * interval
                running = tick - interval
                end = running + self.options.max_runtime
                if running >= self._next_tick and limit < end:
                    look = running + math.ceil((limit - running) / IDLE_POLL) * IDLE_POLL
                    heapq.heappush(self._workers, (min(look, end), next(self._seq), end))
                self._next_tick = max(self._next_tick, tick)
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
        """One pass of `sweep_due` at ``clock``; reschedules itself under --max-runtime,
        looking for new work every second as the real loop does."""
        clock = self._sweep_due(clock)
        if clock >= end:
            return
        wake = min(end, clock + IDLE_POLL)
        if self._due:
            wake = min(wake, self._due[0][0])
        heapq.heappush(self._workers, (max(wake, clock), next(self._seq), end))

    def _sweep_due(self, clock: float) -> float:
        due = self._due
        pop = heapq.heappop
        size = self.batch_size
        work = self._work
        while due and due[0][0] <= clock:
            batch: list[_Live] = []
            claimed = 0
            while due and due[0][0] <= clock and claimed < size:
                live = pop(due)[2]
                if live.cancel_at <= clock:
                    # Cancelled while parked: the row is no longer due, no claim takes it.
                    self._cancel(live, live.state.phase, clock)
                    continue
                batch.append(live)
                claimed += not live.ghost
            lease_end = clock + self.lease
            for live in batch:
                if live.ghost:  # unseen: its calls take none of the sweep's time
                    work(live, clock, lease_end)
                else:
                    clock = work(live, clock, lease_end)
        return clock

    def _work(self, live: _Live, clock: float, lease_end: float) -> float:
        """Mirror of Sweeper._work: decide, act while due, hand the notice back."""
        policy = live.policy
        # After a step, the decision made with it stands (as the sweep records it): only
        # the first look decides afresh. Deciding again on a terminal state would lose the
        # reason it ended for.
        decision = machine.decide(live.state, policy, clock)
        stop = lease_end - self.margin
        # The row's phase as a cancel would find it: the phase of the call in flight, so
        # an answer that comes back after the cancel's time is only evidence.
        phase = live.state.phase
        while True:
            if clock >= live.cancel_at:
                self._cancel(live, phase, clock)
                return clock
            if not decision.due(clock) or clock >= stop:
                self._park(live, decision, clock)
                return clock
            channel = decision.channel
            assert channel is not None
            phase = decision.phase
            if decision.action is ActionKind.SUBMIT:
                if live.ghost and channel != live.state.channels[0]:
                    # The fallback the completed reset's cancel avoided: counted, and
                    # the ghost has said all it can.
                    for stats in self._stats[live.mask]:
                        stats.fallback_avoided_by_completion += 1
                    return clock
                clock, decision = self._submit(live, phase, channel, clock)
            else:
                clock += self.options.call_time
                live.reads += 1
                offset = clock - live.submitted_at[channel]
                timelines = live.trace.timelines.get(channel, NEVER_ANSWERS_3)
                status = self._read(live, timelines, channel, offset, clock)
                live.state, decision = machine.transition(
                    live.state, policy, Observed(channel, status, True), clock
                )

    def _park(self, live: _Live, decision: Decision, clock: float) -> None:
        state = live.state
        if state.phase is not decision.phase:
            live.state = NoticeState(
                state.notice_id, decision.phase, state.expires_at, state.channels, state.attempts
            )
        if decision.phase.terminal:
            if not live.ghost:
                self._record_end(live, decision.reason, clock)
            return
        assert decision.due_at is not None
        due = decision.due_at
        if decision.action is ActionKind.POLL:
            due += self.options.read_lag
        self._push(due, live)

    def _read(
        self, live: _Live, timelines: Timelines, channel: str, offset: float, clock: float
    ) -> Status:
        """The status the read sees; where the readings disagree, the notice forks and
        this copy keeps the point estimate's reading (or the first it still carries)."""
        optimistic, pessimistic, point = timelines
        if optimistic is point and pessimistic is point:
            return point.status_at(offset)
        if live.mask == ALL_SCENARIOS:
            status = point.status_at(offset)
            if optimistic.status_at(offset) is status and pessimistic.status_at(offset) is status:
                return status
        seen: dict[Status, int] = {}
        for reading in _bits(live.mask):
            status = timelines[reading].status_at(offset)
            seen[status] = seen.get(status, 0) | 1 << reading
        if len(seen) == 1:
            return next(iter(seen))
        kept = max(seen, key=lambda status: seen[status] & 1 << POINT)
        for status, mask in seen.items():
            if status is kept:
                continue
            twin = live.fork(mask)
            twin.state, decision = machine.transition(
                live.state, live.policy, Observed(channel, status, is_poll=True), clock
            )
            if decision.phase.terminal and clock >= twin.cancel_at:
                self._cancel(twin, live.state.phase, clock)  # the read came back too late
            elif decision.phase.terminal:
                self._park(twin, decision, clock)
            else:
                self._push(clock, twin)  # decides afresh, now, as the loop would
        return kept

    def _submit(
        self, live: _Live, phase: Phase, channel: str, clock: float
    ) -> tuple[float, Decision]:
        old = live.state
        state = NoticeState(old.notice_id, phase, old.expires_at, old.channels, old.attempts)
        readings = () if live.ghost else self._stats[live.mask]
        trace = live.trace
        if channel != state.channels[0] and live.fallback_at is None:
            live.fallback_at = clock
        if not live.submitted_at:
            for stats in readings:
                stats.queue_delay.append(clock - trace.arrived_at)
        if channel in trace.borrowed:
            for stats in readings:
                stats.borrowed[channel] += 1
        key = machine.attempt_key(state.notice_id, channel)
        state = machine.apply(state, SubmissionStarted(channel, key, True), clock)
        clock += self.options.call_time
        live.submitted_at[channel] = clock
        sent = live.sent
        sent[channel] = sent.get(channel, 0) + 1
        for stats in readings:
            stats.sent[channel] += 1
        # At the submission itself the readings agree: no interval starts before it.
        timeline = trace.timelines.get(channel, NEVER_ANSWERS_3)[POINT]
        first = timeline.status_at(0.0)
        outcome = SubmissionOutcome(channel, OutcomeKind.SUBMITTED, "replay", first)
        live.state, decision = machine.transition(state, live.policy, outcome, clock)
        return clock, decision

    def _cancel(self, live: _Live, phase: Phase, clock: float) -> None:
        """End ``live`` at its cancel's time through the machine, as the application's
        cancel did, on the row as it stood then (in ``phase``). A completed reset whose
        fallback had not gone out leaves a ghost behind to count the one it avoided."""
        assert live.trace.cancelled is not None
        why = live.trace.cancelled[1]
        at = live.cancel_at
        state = live.state
        if (
            why is Reason.COMPLETED
            and live.fallback_at is None
            and len(state.channels) > 1
            and not state.phase.terminal
        ):
            self._push(clock, live.uncancelled())  # decides afresh, now, as the loop would
        if state.phase is not phase:
            state = NoticeState(
                state.notice_id, phase, state.expires_at, state.channels, state.attempts
            )
        live.state, decision = machine.transition(state, live.policy, Cancelled(why), at)
        self._park(live, decision, at)

    def _record_end(self, live: _Live, reason: Reason, clock: float) -> None:
        trace = live.trace
        phase = live.state.phase
        primary = live.state.channels[0]
        both = len(live.sent) > 1
        reads = live.reads
        if live.fallback_at is not None:
            success = live.policy.success[Channel(primary)]
            timelines = trace.timelines.get(primary, NEVER_ANSWERS_3)
            # A primary success after the application's cancel helps no one (and no read
            # would see it: production reads nothing after a cancel).
            until = min(live.state.expires_at, live.cancel_at)
            # (The same for every reading: it reads the intervals themselves.)
            certain, possible = late_primary(live, primary, success, until)
            # A completed reset's fallback went out before the person completed it,
            # whether the notice was then cancelled or had already ended.
            completed = trace.cancelled is not None and trace.cancelled[1] is Reason.COMPLETED
            wasted = (False, False)
            if completed:
                wasted = primary_succeeded_by(live, primary, success, live.cancel_at)
            for reading in _bits(live.mask):
                stats = self.readings[reading]
                stats.escalated += 1
                stats.remaining_at_fallback.append(live.state.expires_at - live.fallback_at)
                first_success = timelines[reading].first_success(success)
                arrives = math.inf
                if first_success is not None:
                    arrives = live.submitted_at[primary] + first_success
                    if live.fallback_at < arrives < until:
                        stats.late_primary_after_fallback += 1
                stats.late_primary_certain += certain
                stats.late_primary_possible += possible
                if completed:
                    stats.fallback_before_completion += 1
                    if arrives <= live.cancel_at:
                        stats.fallback_wasted += 1
                    stats.fallback_wasted_certain += wasted[0]
                    stats.fallback_wasted_possible += wasted[1]
        for stats in self._stats[live.mask]:
            stats.status_reads += reads
            if both:
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
            elif phase is Phase.CANCELLED:
                stats.cancelled += 1
                stats.cancelled_by_reason[reason] += 1
        if self.on_end is not None and live.mask >> POINT & 1:
            self.on_end(trace, live.state, Counter(live.sent))


def late_primary(
    live: _Live, primary: str, success: frozenset[str], until: float | None = None
) -> tuple[bool, bool]:
    """Whether the primary's success came after the fallback and before ``until`` (expiry,
    or the cancel if sooner): certainly (its whole interval lies there), and possibly
    (some of it does, or the primary was still open at its last read, before then). Not
    monotone in when changes happened, so neither reading alone bounds it."""
    assert live.fallback_at is not None
    if until is None:
        until = live.state.expires_at
    observed = live.trace.observations.get(primary)
    if observed is None or primary in live.trace.borrowed:
        timeline = live.trace.timelines.get(primary, NEVER_ANSWERS_3)[POINT]
        at = timeline.first_success(success)
        late = at is not None and (live.fallback_at < live.submitted_at[primary] + at < until)
        return late, late
    after = live.fallback_at - live.submitted_at[primary]
    before = until - live.submitted_at[primary]
    for lo, hi, status in observed.changes:
        if status in success:
            return after <= lo and hi < before, lo < before and hi > after
        if status is Status.FAILED and hi <= after:
            return False, False
    return False, observed.open and observed.end < before


def primary_succeeded_by(
    live: _Live, primary: str, success: frozenset[str], until: float
) -> tuple[bool, bool]:
    """Whether the primary had succeeded by ``until`` (a completed reset's cancel):
    certainly (its whole interval lies before), and possibly (some of it does, or the
    primary was still open at its last read, before then). With a fallback already sent,
    that fallback was wasted: the person could have used the primary."""
    observed = live.trace.observations.get(primary)
    if observed is None or primary in live.trace.borrowed:
        timeline = live.trace.timelines.get(primary, NEVER_ANSWERS_3)[POINT]
        at = timeline.first_success(success)
        done = at is not None and live.submitted_at[primary] + at <= until
        return done, done
    by = until - live.submitted_at[primary]
    for lo, hi, status in observed.changes:
        if status in success:
            certain = hi <= by
            return certain, certain or lo < by
        if status is Status.FAILED:
            return False, False
    return False, observed.open and observed.end < by


def _passes(lines: Iterable[str]) -> Callable[[], Iterable[str]]:
    """A way to read ``lines`` more than once: a list again, a file from its start."""
    if isinstance(lines, Iterator):
        seek = getattr(lines, "seek", None)
        if seek is None:
            lines = list(lines)
        else:
            handle = lines

            def again() -> Iterable[str]:
                seek(0)
                return handle

            return again
    kept = lines
    return lambda: kept


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
    measured, unless given."""
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
    return SimulationOptions(
        sweep_interval=sweep_interval,
        max_runtime=options.max_runtime,
        call_time=options.call_time,
        batch_size=options.batch_size,
        lease=options.lease,
        first_sweep_at=first,
        read_lag=lag,
        sweep_start=start,
    )


def replay(
    lines: Iterable[str],
    candidates: Sequence[Candidate],
    options: SimulationOptions,
    progress: Callable[[int], None] | None = None,
    seed: int = 0,
    tail_grace: float | None = None,
) -> ReplayResult:
    """Run every trace through every candidate.

    Two passes over ``lines`` (a list, or a file it seeks back to the start): the first
    fits the delay distributions and keeps timelines to borrow, the second simulates
    every candidate at once. ``options`` are used as given; see :func:`with_header`.
    """
    # Replay makes and drops a few million small objects (states, decisions, heap
    # entries), nearly none in cycles: the collector's default pace would spend about 5%
    # of the run looking for garbage the reference counts already freed.
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    try:
        return _replay(lines, candidates, options, progress, seed, tail_grace)
    finally:
        gc.set_threshold(*thresholds)


def _replay(
    lines: Iterable[str],
    candidates: Sequence[Candidate],
    options: SimulationOptions,
    progress: Callable[[int], None] | None,
    seed: int,
    tail_grace: float | None,
) -> ReplayResult:
    source = _passes(lines)
    header = read_header(source())
    resolver = Resolver.fitted_lines(source(), seed)
    grace = tail_grace
    if grace is None:
        grace = max(1.0, header.read_lag_p90 or 0.0)
    resolver.tail_grace = grace
    unknown: Counter[tuple[str, str, str]] = Counter()
    versions: Counter[int] = Counter()
    simulations = [Simulation(c, options) for c in candidates]
    for count, trace in enumerate(read_traces(source(), unknown, resolver), start=1):
        versions[trace.version] += 1
        for simulation in simulations:
            simulation.arrive(trace)
        if progress is not None and count % 1000 == 0:
            progress(count)
    reports = []
    for simulation in simulations:
        simulation.finish()
        optimistic, pessimistic, point = simulation.readings
        reports.append(PolicyReport(simulation.candidate.label, point, optimistic, pessimistic))
    return ReplayResult(reports, unknown, header, versions)
