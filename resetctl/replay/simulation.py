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
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from resetctl import machine
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
from resetctl.replay.options import IDLE_POLL, SimulationOptions
from resetctl.replay.readings import (
    ALL_READINGS,
    BITS,
    BORROWS,
    EARLY,
    ENVELOPE_FIGURES,
    FIRST_DRAW,
    LATE,
    POINT_FAMILY,
    SHOWN,
    TIMING,
    Envelope,
    copy_figures,
    late_primary,
    primary_succeeded_by,
)
from resetctl.replay.report import PolicyReport, ReplayResult, ReplayStats
from resetctl.replay.traces import (
    NEVER_ANSWERS_3,
    OPTIMISTIC,
    PESSIMISTIC,
    POINT,
    SCENARIOS,
    Timeline,
    Timelines,
    Trace,
    read_header,
)

#: Expiry reasons that mean the link ran out of time before the next action could happen:
#: the notices an on-call engineer would have been paged about.
PAGING_REASONS = frozenset(
    {Reason.FALLBACK_RESERVE_NOT_MET, Reason.NO_USEFUL_TIME, Reason.LINK_EXPIRED}
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One set of policies to compare, by region."""

    label: str
    policies: Mapping[str, Policy]

    def policy_for(self, region: str) -> Policy:
        """The region's policy, else the default one."""
        return self.policies.get(region) or self.policies["default"]


def _bits(mask: int) -> tuple[int, ...]:
    return BITS[mask]


def _seen(
    mask: int, timelines: Timelines, others: Sequence[Timeline] | None, offset: float
) -> dict[Status, int]:
    """Per status, the readings in ``mask`` that see it at ``offset``: the three readings
    their own timelines, the point estimate's alternatives its timeline, but the other
    borrowed timelines (``others``) theirs."""
    seen: dict[Status, int] = {}
    groups: list[tuple[Timeline, int]] = []
    for reading in (OPTIMISTIC, PESSIMISTIC):
        if mask >> reading & 1:
            groups.append((timelines[reading], 1 << reading))
    point = mask & (POINT_FAMILY if others is None else POINT_FAMILY & ~BORROWS)
    if point:
        groups.append((timelines[POINT], point))
    if others is not None:
        for index, timeline in enumerate(others):
            bit = 1 << (FIRST_DRAW + index)
            if mask & bit:
                groups.append((timeline, bit))
    for timeline, bits in groups:
        status = timeline.status_at(offset)
        seen[status] = seen.get(status, 0) | bits
    return seen


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
        "shadow",
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
        #: True for a copy that carries only the point estimate's alternatives: like a
        #: ghost it takes no claim slot and no clock time, and it counts only in the
        #: envelope
        self.shadow = not mask & SHOWN

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
        twin.shadow = not mask & SHOWN
        return twin


class Simulation:
    """One candidate's simulated production: cron, sweeps, leases, the machine.

    Every notice is simulated under the three readings of its trace, and the point
    estimate's alternatives (see :mod:`resetctl.replay.readings`), at once: while they
    agree it is one notice; at the first read (or decision) where they differ it forks,
    and each copy carries on for the readings that saw its status.
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
        #: per mask of readings, the shown readings' counters (in _bits order)
        self._stats = tuple(
            tuple(self.readings[reading] for reading in _bits(mask & SHOWN))
            for mask in range(ALL_READINGS + 1)
        )
        #: the readings every notice starts with: the sweep-timing alternatives only
        #: when there is a slack to try
        self._all = ALL_READINGS if options.timing_slack > 0 else ALL_READINGS & ~TIMING
        self._shifts = {EARLY: -options.timing_slack, LATE: options.timing_slack}
        self.envelope = Envelope(self._all & POINT_FAMILY)
        #: per policy: the link's landmarks (the reserves before expiry) and the longest
        #: wait a decision looks ahead (the longest poll delay)
        self._landmarks: dict[int, tuple[tuple[float, ...], float]] = {}
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
        self._push(trace.arrived_at, _Live(trace, policy, state, self._all))

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
                claimed += not (live.ghost or live.shadow)
            lease_end = clock + self.lease
            for live in batch:
                if live.ghost or live.shadow:  # unseen: its calls take none of the time
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
        if live.mask & TIMING:
            self._timed(live, live.state, None, decision, clock)
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
                observed = Observed(channel, status, True)
                before = live.state
                live.state, decision = machine.transition(before, policy, observed, clock)
                if live.mask & TIMING:
                    self._timed(live, before, observed, decision, clock)

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
        mask = live.mask
        others = None
        if mask & BORROWS and channel in live.trace.borrowed:
            others = live.trace.alternatives.get(channel) or None  # () : nothing to borrow
        if others is None:
            if optimistic is point and pessimistic is point:
                return point.status_at(offset)
            if mask & SHOWN == SHOWN:
                status = point.status_at(offset)
                if (
                    optimistic.status_at(offset) is status
                    and pessimistic.status_at(offset) is status
                ):
                    return status
        seen = _seen(mask, timelines, others, offset)
        if len(seen) == 1:
            return next(iter(seen))
        before = live.state
        return self._split(
            live,
            seen,
            lambda status: machine.transition(
                before, live.policy, Observed(channel, status, is_poll=True), clock
            ),
            before.phase,
            clock,
        )

    def _split(
        self,
        live: _Live,
        seen: dict[Status, int],
        step: Callable[[Status], tuple[NoticeState, Decision]],
        phase: Phase,
        clock: float,
    ) -> Status:
        """Fork ``live`` by what its readings saw (``seen``: status to readings): each
        other status goes on in a copy of its own, taking ``step`` (a cancel finds the
        row in ``phase``); the status this copy keeps is the point estimate's (else one a
        shown reading saw)."""
        kept = max(seen, key=lambda status: (seen[status] >> POINT & 1, seen[status] & SHOWN))
        for status, mask in seen.items():
            if status is kept:
                continue
            twin = live.fork(mask)
            twin.state, decision = step(status)
            if decision.phase.terminal and clock >= twin.cancel_at:
                self._cancel(twin, phase, clock)  # the answer came back too late
            elif decision.phase.terminal:
                self._park(twin, decision, clock)
            else:
                self._push(clock, twin)  # decides afresh, now, as the loop would
        return kept

    def _timed(
        self,
        live: _Live,
        before: NoticeState,
        event: Observed | SubmissionOutcome | None,
        decision: Decision,
        clock: float,
    ) -> None:
        """The step ``live`` just took (``event`` from ``before``; None: a fresh look) as
        its sweep-timing alternatives see it: every action of the notice the timing slack
        earlier or later against its link's expiry (and its cancel), which is what sweeps
        acting that much earlier or later amount to. Where that decides otherwise, the
        alternative goes on in a copy of its own, whose state keeps the shifted expiry.
        Asked only of the copy that carries the point estimate (its state is unshifted),
        and only near a landmark (expiry less a reserve) a decision could cross within
        the slack."""
        if not live.mask >> POINT & 1:
            return  # a timing alternative on its own: its state is shifted already
        policy = live.policy
        landmarks = self._landmarks.get(id(policy))
        if landmarks is None:
            kept = sorted({0.0, policy.fallback_reserve, policy.send_reserve})
            ahead = max(max(policy.polls_for(str(c)), default=0.0) for c in policy.channels)
            landmarks = self._landmarks[id(policy)] = (tuple(kept), ahead)
        reserves, ahead = landmarks
        slack = self.options.timing_slack
        # Is some expiry less a reserve within [clock - slack, clock + ahead + slack]?
        expires = before.expires_at
        nearest = bisect_left(reserves, expires - clock - ahead - slack)
        if nearest == len(reserves) or reserves[nearest] > expires - clock + slack:
            return
        for reading in (EARLY, LATE):
            bit = 1 << reading
            if not live.mask & bit:
                continue
            shift = self._shifts[reading]
            shifted = NoticeState(
                before.notice_id,
                before.phase,
                before.expires_at - shift,
                before.channels,
                before.attempts,
            )
            if event is None:
                state, other = shifted, machine.decide(shifted, policy, clock)
            else:
                state, other = machine.transition(shifted, policy, event, clock)
            if other == decision:
                continue
            twin = live.fork(bit)
            twin.state = state
            twin.cancel_at = live.cancel_at - shift
            if other.phase.terminal and clock >= twin.cancel_at:
                self._cancel(twin, before.phase, clock)
            elif other.phase.terminal:
                self._park(twin, other, clock)
            else:
                self._push(clock, twin)  # decides afresh, now, as the loop would

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
        # At the submission itself the three readings agree: no interval starts before
        # it. Other borrowed timelines may answer otherwise.
        timeline = trace.timelines.get(channel, NEVER_ANSWERS_3)[POINT]
        first = timeline.status_at(0.0)
        started = state
        if live.mask & BORROWS and channel in trace.borrowed:
            first = self._answered(live, channel, started, timeline, first, phase, clock)
        outcome = SubmissionOutcome(channel, OutcomeKind.SUBMITTED, "replay", first)
        live.state, decision = machine.transition(started, live.policy, outcome, clock)
        if live.mask & TIMING:
            self._timed(live, started, outcome, decision, clock)
        return clock, decision

    def _answered(
        self,
        live: _Live,
        channel: str,
        started: NoticeState,
        timeline: Timeline,
        first: Status,
        phase: Phase,
        clock: float,
    ) -> Status:
        """How a borrowed channel's submission was answered: ``first`` for the point
        estimate, but another borrowed timeline may answer otherwise, in a copy of its
        own (``started``: the notice as its intent left it)."""
        others = live.trace.alternatives.get(channel)
        if not others:
            return first
        seen = _seen(live.mask, (timeline, timeline, timeline), others, 0.0)
        if len(seen) == 1:
            return first

        def answered(status: Status) -> tuple[NoticeState, Decision]:
            outcome = SubmissionOutcome(channel, OutcomeKind.SUBMITTED, "replay", status)
            return machine.transition(started, live.policy, outcome, clock)

        return self._split(live, seen, answered, phase, clock)

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
        certain = possible = completed = False
        wasted = (False, False)
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
            if completed:
                wasted = primary_succeeded_by(live, primary, success, live.cancel_at)
            for reading in _bits(live.mask & SHOWN):
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
        family = live.mask & self.envelope.family
        if family and family != self.envelope.family:
            escalated = live.fallback_at is not None
            counts = dict.fromkeys(ENVELOPE_FIGURES, 0)
            counts.update(
                accepted=phase is Phase.ACCEPTED,
                accepted_primary=phase is Phase.ACCEPTED and not escalated,
                escalated=escalated,
                expired=phase is Phase.EXPIRED,
                failed=phase is Phase.FAILED,
                both_channels=both,
                status_reads=reads,
                would_page=phase is Phase.EXPIRED and reason in PAGING_REASONS,
                cancelled=phase is Phase.CANCELLED,
                fallback_before_completion=escalated and completed,
            )
            if phase is Phase.CANCELLED:
                counts[f"cancelled_by_reason.{reason.value}"] = 1
            late = (certain, possible)
            self.envelope.add(trace.line, family, copy_figures(live, counts, late, wasted))


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
        label = simulation.candidate.label
        reports.append(PolicyReport(label, point, optimistic, pessimistic, simulation.envelope))
    return ReplayResult(reports, unknown, header, versions)
