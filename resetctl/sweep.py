"""One sweep: claim due notices under a lease, run the machine, call transports, record.

Calls fan out, writes funnel in. Each claimed notice is driven on its own: its machine
decides, its next call waits in its transport's lane (an in-flight cap, a rate limit, a
Retry-After pause; nearest deadline first), an intent is committed just before a
submission starts, the call runs in a bounded pool of threads with no transaction open
(or in place, for the embedded outbox), and its outcome is folded and written by this
thread, grouped with whatever other outcomes came back at the same moment, as soon as
it returns. A slow provider holds only its own lane; a failure read's fallback is
claimed and submitted without waiting for anyone else's reads.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial

from resetctl import calls, machine, tracing
from resetctl.calls import CallResult
from resetctl.clocks import crash_at, monotonic_for
from resetctl.config import DEFAULT_CONCURRENCY, Settings
from resetctl.decks import HELD_BACK, Decks
from resetctl.errors import ConfigError, StoreError
from resetctl.folds import (
    deadline_of,
    deferred_of,
    fold_lookup,
    fold_poll,
    fold_submit,
    intent_of,
    message_id_of,
    read_alone,
    step_of,
    tick_of,
)
from resetctl.lanes import Lane, take_startable
from resetctl.machine import (
    ActionKind,
    NoticeState,
    OutcomeKind,
    Phase,
    Reason,
    Status,
)
from resetctl.policy import Policy
from resetctl.providers import Providers
from resetctl.rollout import diverted_submissions
from resetctl.routes import Routes
from resetctl.store import (
    Claim,
    LoadedNotice,
    StepKind,
    StepResult,
    Store,
    database_errors,
)
from resetctl.summary import SweepSummary
from resetctl.telemetry import LOGGER, Listener, emit, transition_of
from resetctl.transports.base import (
    ThrottledError,
    Transport,
    TransportError,
    call_timeout,
    supports_batch_status,
    supports_lookup,
)
from resetctl.work import (
    Flight,
    Held,
    Job,
    NotCalled,
    Pending,
    SendProgress,
    SendReport,
    SweepOptions,
    check_lease,
)

#: Steps one claim may take on a notice before it is left for a later sweep.
MAX_STEPS_PER_CLAIM = 16
#: Seconds of lease that must remain, beyond a transport's own call time-out, to start a
#: call (at most a quarter of the lease, so a short lease still gets work done).
LEASE_MARGIN = 1.0
#: An idle sweep with --max-runtime looks for newly due work this often (seconds): a
#: notice enqueued without --send goes out within about this long.
IDLE_POLL = 1.0
#: The longest the sweep waits for a call to return before it looks at the clock again
#: (a stop, the run's end, a lane's pause ending).
WAKE_EVERY = 0.25


class Sweeper:
    """Runs sweeps over one store with one set of transports."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        transports: Providers | Mapping[str, Transport],
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        listeners: Iterable[Listener] = (),
        failpoints: frozenset[str] = frozenset(),
        monotonic: Callable[[], str | None] | None = None,
    ) -> None:
        self.store = store
        #: the host's monotonic readings stored beside wall times (see machine.Attempt);
        #: by default the real one with the real clock, none with an injected clock
        self.monotonic = monotonic_for(clock) if monotonic is None else monotonic
        self.settings = settings
        #: each channel's provider instances, built, and their shared health (a plain
        #: channel-to-transport mapping is one instance per channel)
        self.providers = (
            transports if isinstance(transports, Providers) else Providers.of_channels(transports)
        )
        self.clock = clock
        self.sleep = sleep
        self.listeners = [*listeners, *tracing.listeners()]
        self.failpoints = failpoints
        if "during_outcome" in failpoints:
            store.call_before_commit(self._die_during_outcome)
        self._policies: dict[tuple[str, int], Policy] = {}
        self._recipients: dict[str, str | None] = {}
        #: set by stop() (a signal handler) or when --max-runtime is spent
        self._stopping = False
        self._deadline: float | None = None
        #: notices whose submission call the transport took during this run
        self.submitted_notices: set[str] = set()
        self._progress: SendProgress | None = None
        self._concurrency = DEFAULT_CONCURRENCY
        #: this run's lanes, one per (channel, instance), and the health that holds them
        self.routes = Routes(self.providers, settings, self._concurrency)
        self.lanes: dict[str, Lane[Job]] = self.routes.lanes
        #: this run's pool of calling threads, and its lanes' decks
        self.decks = self._decks_for(self._concurrency)

    def stop(self) -> None:
        """Ask the run to end: claim nothing more, start no new call, hand leases back.

        Safe to call from a signal handler: it only sets a flag the run checks.
        """
        self._stopping = True

    def _should_stop(self) -> bool:
        if self._stopping:
            return True
        return self._deadline is not None and self.clock() >= self._deadline

    def check_lease(self, lease: float) -> None:
        """ConfigError when a lease cannot cover one call of some transport."""
        check_lease(self.providers.each(), lease)

    def run(self, options: SweepOptions) -> SweepSummary:
        """Claim batches until nothing is due; with max_runtime, keep going until it ends.

        With max_runtime the run is bounded: once it is spent the sweep claims nothing
        more and starts no new call, hands back the leases of notices it has not worked,
        and returns within max_runtime plus one call's time-out. An idle run looks for
        newly due notices every IDLE_POLL seconds (one indexed query).
        """
        self.check_lease(options.lease)
        with self._rounds(), self._engine(options):
            return self._run(options)

    @contextlib.contextmanager
    def _rounds(self) -> Iterator[None]:
        """While sweeping, the embedded outbox writes its messages in the round's outcome
        transaction rather than committing each on its own (it dedupes by key), and the
        rounds' commits leave checkpoints to a thread of their own."""
        with self.store.defer_outbox(), self.store.checkpoints_aside():
            yield

    def _run(self, options: SweepOptions) -> SweepSummary:
        summary = SweepSummary()
        started = self.clock()
        end = started + options.max_runtime
        self._deadline = end if options.max_runtime > 0 else None
        while not self._stopping:
            claimed_before = summary.claimed
            self.sweep_due(options, summary)
            # Due by this host's clock, yet nothing was claimed: another worker holds it,
            # or the database's clock (PostgreSQL's, the one leases are read on) says not
            # yet. Ask again after an idle poll, not at once.
            held_elsewhere = summary.claimed == claimed_before
            now = self.clock()
            if self._should_stop() or now >= end:
                break
            while not self._should_stop():
                now = self.clock()
                next_due = self.store.next_due_at()
                if next_due is not None and next_due <= now and not held_elsewhere:
                    break
                wake = min(end, now + IDLE_POLL)
                if next_due is not None and next_due > now:
                    wake = min(wake, next_due)
                held_elsewhere = False
                if wake > now:
                    self.sleep(wake - now)
        summary.duration = self.clock() - started
        self.store.record_sweep(self.clock(), summary.duration)
        return summary

    def send_now(self, notice_ids: Iterable[str], options: SweepOptions) -> SendReport:
        """Make the first submission of just-enqueued notices before returning.

        Claims exactly these notices (still due and unleased) and works them as a sweep
        would. They are committed already, so a database failure ends the run without
        raising, and the report says which calls went out unrecorded; cron's sweep
        carries on (a doubt recovered by key or lookup, never resent blindly).
        """
        self.check_lease(options.lease)
        ids = list(dict.fromkeys(notice_ids))
        asked: set[str] = set()
        claimed: set[str] = set()
        failure: str | None = None
        summary = SweepSummary()
        progress = self._progress = SendProgress()
        failures: tuple[type[Exception], ...] = (StoreError, *database_errors())
        try:
            with self._rounds(), self._engine(options):
                for start in range(0, len(ids), options.batch_size):
                    chunk = ids[start : start + options.batch_size]
                    now = self.clock()
                    claims = self.store.claim_notices(options.worker_id, chunk, now, options.lease)
                    asked.update(chunk)
                    claimed.update(claim.notice_id for claim in claims)
                    if claims:
                        summary.claimed += len(claims)
                        self._work(claims, options.worker_id, summary)
        except failures as exc:
            # The first line only: a server's detail lines may quote the row's values.
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            failure = f"database {self.store.path}: {reason}"
            LOGGER.warning(
                "send: %s; the notices are committed and cron's sweep carries on", failure
            )
        finally:
            self._progress = None
        return progress.report(
            ids, frozenset(asked), frozenset(claimed), self.submitted_notices, failure
        )

    def sweep_due(self, options: SweepOptions, summary: SweepSummary) -> None:
        """Claim and work batches until a claim comes back empty (or the run must stop).

        A notice handed back still due (its lease ran short, or another writer won) is
        claimed again, but a batch of nothing but such notices ends the pass: progress
        stalled, and the next sweep (or the --max-runtime loop) takes over.
        """
        seen: set[str] = set()
        stalled = False

        def claim_more() -> list[Claim]:
            nonlocal stalled
            if stalled or self._should_stop():
                return []
            size = min(options.batch_size, self.decks.claim_size(first=not seen))
            claims = self.store.claim_due(options.worker_id, self.clock(), options.lease, size)
            if not claims:
                stalled = True
                return []
            self._failpoint("after_claim")
            summary.batches += 1
            summary.claimed += len(claims)
            fresh = {c.notice_id for c in claims} - seen
            if not fresh:
                stalled = True  # only notices handed back this pass: progress stalled
            seen.update(fresh)
            return claims

        while claims := claim_more():
            self._work(claims, options.worker_id, summary, claim_more)

    def _policy(self, loaded: LoadedNotice) -> Policy:
        key = (loaded.policy_name, loaded.policy_version)
        if key not in self._policies:
            self._policies[key] = self.store.load_policy(*key)
        return self._policies[key]

    def _die_during_outcome(self, kind: str) -> None:
        if kind == StepKind.OUTCOME:
            self._failpoint("during_outcome")

    def _failpoint(self, name: str) -> None:
        crash_at(self.failpoints, name)

    def _margin(self, transport: Transport | None, lease: float) -> float:
        """Seconds of lease a call to ``transport`` needs left before it starts: its
        whole time-out, so a call never outlives its lease, plus a little."""
        slack = min(LEASE_MARGIN, lease / 4)
        return slack if transport is None else call_timeout(transport) + slack

    @contextlib.contextmanager
    def _engine(self, options: SweepOptions) -> Iterator[None]:
        """The run's lanes and its pool of calling threads (made on first use)."""
        if options.concurrency < 1:
            raise ConfigError("concurrency: must be at least 1")
        self._concurrency = options.concurrency
        self.routes = Routes(self.providers, self.settings, options.concurrency)
        self.lanes = self.routes.lanes
        self.decks = self._decks_for(options.concurrency)
        try:
            yield
        finally:
            self.decks.close()
            self._record_lanes()

    def _record_lanes(self) -> None:
        """Add this run's lane counts, per instance, to what health and metrics show."""
        counts = self.routes.counts()
        if counts:
            self.store.add_lane_counts(counts)

    def _decks_for(self, concurrency: int) -> Decks:
        return Decks(self.routes, concurrency, self.clock, self.sleep, self._not_worth_calling)

    def _hold(self, claims: list[Claim], worker: str, summary: SweepSummary) -> list[Held]:
        """The claimed notices this worker now holds, loaded."""
        holds: list[Held] = []
        unloaded = [claim.notice_id for claim in claims if claim.loaded is None]
        batch = self.store.load_notices(unloaded) if unloaded else {}
        for claim in claims:
            loaded = claim.loaded or batch.get(claim.notice_id)
            # (A row loaded after the claim may already be someone else's.)
            if loaded is None or loaded.lease_token != claim.lease_token:
                continue
            # Logs correlate by the keyed recipient hash, never the recipient.
            self._recipients[claim.notice_id] = loaded.recipient_hash
            if claim.recovered:
                summary.lease_recoveries += 1
                self.store.record_lease_recovery(
                    claim.notice_id, worker, loaded.state.phase, self.clock()
                )
                self._emit(loaded.state, StepKind.LEASE_RECOVERED, loaded.state.phase, worker)
            holds.append(Held(claim, loaded, self._policy(loaded)))
            tracing.claimed(self.listeners, claim, loaded, worker, self.clock)
        return holds

    def _work(
        self,
        claims: list[Claim],
        worker: str,
        summary: SweepSummary,
        claim_more: Callable[[], list[Claim]] | None = None,
    ) -> None:
        """Drive claimed notices until none has work due (or the run must stop); with
        ``claim_more``, claim the next batch once this one no longer fills the pool.

        Each notice moves on its own: decided, its call queued in its lane, started when
        the lane allows (its intent committed first), its outcome written as it returns,
        with whatever returned alongside. Once the run must stop, nothing new starts:
        calls in flight finish and are recorded, queued work goes back, due as it was.
        """
        self._recipients = {}
        self.decks.warm()  # its threads start while this one decides and commits
        flight = Flight(ready=self._hold(claims, worker, summary))
        while True:
            if claim_more is not None and self.decks.wants_more(flight):
                flight.ready += self._hold(claim_more(), worker, summary)
            if flight.ready:
                ready, flight.ready = flight.ready, []
                self._route(ready, flight, worker, summary)
            if self._should_stop():
                self._hand_back_queued(flight, worker, summary)
            else:
                self._start(flight, worker, summary)
            if flight.outcomes:
                self._flush_outcomes(flight, worker, summary)
                continue  # their notices may have work due now
            if not flight.returned:
                if not flight.pooled:
                    if not any(len(lane) for lane in self.lanes.values()):
                        if not flight.ready:
                            return
                        continue
                    if self._progress is not None:
                        # The first submission does not wait out a provider's pause
                        # or rate: cron's sweep carries on with what could not start.
                        self._hand_back_queued(flight, worker, summary)
                        continue
                    # Work waits only for a lane's pause or rate: sleep until it can start.
                    self.sleep(self._wake_in(flight) or WAKE_EVERY / 10)
                    continue
                self.decks.came_back(flight, self._wake_in(flight))
            if flight.returned:
                # Whatever else came back meanwhile is written in the same transaction.
                self.decks.came_back(flight, None)
                returned, flight.returned = flight.returned, []
                self._record(returned, flight, worker, summary)

    def _wake_in(self, flight: Flight) -> float:
        """Seconds until a lane could start queued work, at most WAKE_EVERY (while the
        sweep's every call is taken, only a call's return frees one: wait for it)."""
        if self._room(flight) <= 0:
            return WAKE_EVERY
        now = self.clock()
        wakes = [w for lane in self.lanes.values() if (w := lane.wake_at(now)) is not None]
        return max(0.0, min([WAKE_EVERY, *(w - now for w in wakes)]))

    def _route(self, ready: list[Held], flight: Flight, worker: str, summary: SweepSummary) -> None:
        """Decide for each ready notice: queue its next call in its lane, or write the
        decision and hand the lease back (nothing due, the lease too short for the call,
        out of steps, or the run is stopping)."""
        now = self.clock()
        stopping = self._should_stop()
        ticks: list[Pending] = []
        lookups: list[Job] = []
        for held in ready:
            decision = machine.decide(held.state, held.policy, now)
            if (
                not decision.due(now)
                or held.steps >= MAX_STEPS_PER_CLAIM - 1
                or decision.channel is None
            ):
                ticks.append(tick_of(held, decision, now))
                continue
            job = Job(held, decision, decision.channel, StepKind.TICK)
            found = self.routes.place(job, held, decision, now)
            margin = self._margin(job.transport, held.claim.lease_expires_at - now)
            if job.transport is None or now >= held.claim.lease_expires_at - margin:
                # Record the decision and hand the lease back, even when work is still
                # due: a lease is never kept idle.
                if job.transport is None:
                    LOGGER.warning(
                        "notice %s: %s provider instance %s is not configured; not called",
                        held.state.notice_id,
                        decision.channel,
                        found.instance,
                    )
                ticks.append(tick_of(held, decision, now))
                continue
            if stopping:
                summary.released += 1
                ticks.append(tick_of(held, decision, now))
                continue
            job.kind = {
                ActionKind.SUBMIT: StepKind.INTENT,
                ActionKind.POLL: StepKind.POLL,
                ActionKind.LOOKUP: StepKind.LOOKUP,
            }[found.action]
            back_at = self.routes.out_of_use_until(job, now)
            if back_at is not None:  # its instance is out of use: hand it back till then
                ticks.append(deferred_of(held, decision, back_at, now))
                continue
            if job.kind is StepKind.LOOKUP:
                lookups.append(job)
            self.routes.lane_of(job).put(job, deadline_of(held, decision), now)
        if lookups:
            contacts = self.store.load_contacts([j.held.state.notice_id for j in lookups])
            sent = self.store.load_fingerprints([j.key for j in lookups])
            for job in lookups:
                job.contact = contacts.get(job.held.state.notice_id)
                job.sent = sent.get(job.key)
        flight.ready += [h for h, _, carry_on in self._write(ticks, worker, summary) if carry_on]

    def _hand_back_queued(self, flight: Flight, worker: str, summary: SweepSummary) -> None:
        """The run is stopping: work still waiting in a lane goes back, due as it was;
        submissions on a deck are not called (their intents get a declined outcome)."""
        self.decks.not_called(flight, self.decks.recall(), "the sweep is stopping")
        now = self.clock()
        ticks = []
        for lane in self.lanes.values():
            for job in lane.drain():
                summary.released += 1
                ticks.append(tick_of(job.held, job.decision, now))
        flight.ready += [h for h, _, carry_on in self._write(ticks, worker, summary) if carry_on]

    def _room(self, flight: Flight) -> int:
        """Calls the sweep's concurrency lets start now (jobs on a deck are not made)."""
        return self._concurrency - (flight.pooled - self.decks.waiting())

    def _startable(self, flight: Flight) -> list[tuple[Lane[Job], Job]]:
        """Work the lanes let start now, within the sweep's concurrency."""
        room = self._room(flight)
        now = self.clock()
        started = take_startable(self.lanes, self.routes.in_place, room, now)
        kept: list[tuple[Lane[Job], Job]] = []
        for lane, job, waited in started:
            lease_left = job.held.claim.lease_expires_at - now
            if self.routes.may_start(job, now, self._margin(job.transport, lease_left)):
                job.waited = waited
                kept.append((lane, job))
            else:  # its instance is out of use, or another process probes it
                lane.withdrawn()
                lane.put(job, deadline_of(job.held, job.decision), now)
        return kept

    def _start(self, flight: Flight, worker: str, summary: SweepSummary) -> None:
        """Start what the lanes allow: submissions' intents first, in one transaction,
        then every call, in place or in the pool."""
        self.decks.not_called(flight, self.decks.promote(), HELD_BACK)
        started = self._startable(flight)
        decked = self.decks.take()
        if not started and not decked:
            return
        submits = [(lane, job) for lane, job in started if job.kind is StepKind.INTENT]
        reads = [(lane, job) for lane, job in started if job.kind is not StepKind.INTENT]
        # A keyless call made in place goes intent, call, outcome on its own, so a crash
        # never leaves more than one of them in doubt; calls in the pool leave at most
        # their lane's in-flight cap.
        alone = [
            (lane, job)
            for lane, job in submits
            if job.lane in self.routes.in_place
            and job.transport is not None
            and not job.transport.recovers_by_key
        ]
        together = [item for item in submits if item not in alone]
        for item in alone:
            for _, job in self._commit_intents([item], flight, worker, summary):
                assert job.rendered is not None
                assert job.transport is not None
                transport, message = job.transport, job.rendered.message
                job.called = message is not None
                result = (
                    CallResult(self.clock())
                    if message is None
                    else calls.submit(transport, message, job.key, self.clock)
                )
                self._record([([job], result)], flight, worker, summary)
                self._flush_outcomes(flight, worker, summary)
        go = self._commit_intents(together + decked, flight, worker, summary)
        to_deck = {id(job) for _, job in decked}
        on_deck: list[tuple[Job, Callable[[], CallResult]]] = []
        for _, job in go:
            assert job.rendered is not None
            assert job.transport is not None
            message = job.rendered.message
            transport = job.transport
            if message is None:  # nothing to send: the outcome is the render error
                flight.returned.append(([job], CallResult(self.clock())))
                continue
            submit = partial(calls.submit, transport, message, job.key, self.clock)
            if id(job) in to_deck:  # placed once every call starting now has started
                on_deck.append((job, submit))
                continue
            skipped = self._not_worth_calling(job)
            if skipped is not None:  # calls made in place before it used the time up
                flight.returned.append(([job], CallResult(self.clock(), error=NotCalled(skipped))))
                continue
            self._dispatch(flight, [job], submit)
        batched: dict[str, list[Job]] = {}
        for _, job in reads:
            read_on = job.transport
            assert read_on is not None
            attempt = job.held.state.attempt(job.channel)
            assert attempt is not None
            if job.kind is StepKind.LOOKUP:
                recipient = calls.recipient_of(job.contact, job.channel)
                if recipient is None or job.sent is None or not supports_lookup(read_on):
                    # Nothing to look up with: a failed read, which proves nothing.
                    failed = CallResult(self.clock(), error=TransportError("cannot look up"))
                    flight.returned.append(([job], failed))
                    continue
                since, sent = attempt.last_call_at, job.sent
                self._dispatch(
                    flight,
                    [job],
                    partial(calls.look_up, read_on, recipient, job.key, since, sent, self.clock),
                )
            elif supports_batch_status(read_on) and not job.alone:
                job.batched = True
                batched.setdefault(job.lane, []).append(job)
            else:
                assert attempt.message_id is not None
                mid = attempt.message_id
                self._dispatch(
                    flight,
                    [job],
                    partial(calls.read_status, read_on, mid, self.clock),
                )
        for jobs in batched.values():
            batch_on = jobs[0].transport
            assert batch_on is not None
            ids = [message_id_of(job) for job in jobs]
            self._dispatch(
                flight,
                jobs,
                partial(calls.read_statuses, batch_on, ids, self.clock),
            )
        for job, decked_call in on_deck:  # (it says itself whether it was called)
            flight.pooled += 1
            self.decks.start([job], decked_call, on_deck=True)

    def _dispatch(self, flight: Flight, jobs: list[Job], call: Callable[[], CallResult]) -> None:
        """Make the call: here, for a transport that waits on nothing; else in the pool,
        where it starts once its lane's rate limit admits it."""
        for job in jobs:
            job.called = True
        if jobs[0].lane in self.routes.in_place:
            flight.returned.append((jobs, call()))
            return
        flight.pooled += len(jobs)
        self.decks.start(jobs, call, on_deck=False)

    def _not_worth_calling(self, job: Job) -> str | None:
        """Why a submission should not be made now, or None (see Job.not_worth_calling)."""
        now, lease_end = self.clock(), job.held.claim.lease_expires_at
        return job.not_worth_calling(
            now, self._margin(job.transport, lease_end - now), self._should_stop()
        )

    def _commit_intents(
        self,
        submits: list[tuple[Lane[Job], Job]],
        flight: Flight,
        worker: str,
        summary: SweepSummary,
    ) -> list[tuple[Lane[Job], Job]]:
        """Render each submission and commit its intent, together, just before the calls.

        Expiry, the lease and the run's end are checked again first: the work may have
        waited in its lane. A submission no longer worth making is not made, and no
        intent is written for it: it spends no retry.
        """
        if not submits:
            return []
        now = self.clock()
        contacts = self.store.load_contacts([job.held.state.notice_id for _, job in submits])
        jobs = [job for _, job in submits]
        diverted = diverted_submissions(
            self.store, self.settings, jobs, contacts, now, self._not_worth_calling
        )
        intents: list[Pending] = []
        kept: list[tuple[Lane[Job], Job]] = []
        skipped: list[Pending] = []
        for lane, job in submits:
            held, policy = job.held, job.held.policy
            if held.state.notice_id in diverted:  # a capped SMS, or a shadow notice's end
                lane.withdrawn()
                skipped.append(diverted[held.state.notice_id])
                continue
            if self._not_worth_calling(job) is not None:
                lane.finished()
                summary.declined += 1
                skipped.append(tick_of(held, machine.decide(held.state, policy, now), now))
                continue
            transport = job.transport
            assert transport is not None
            job.contact = contacts.get(held.state.notice_id)
            job.rendered = calls.render(
                self.settings, policy, held.state, held.loaded.locale, job.contact, job.channel, now
            )
            intents.append(intent_of(job, transport, now, self.monotonic()))
            kept.append((lane, job))
        # The outcomes that came back ride in the same transaction as these intents.
        riding, flight.outcomes = flight.outcomes + skipped, []
        written = self._write(riding + intents, worker, summary)
        flight.ready += [h for h, _, go_on in written[: len(riding)] if go_on]
        written = written[len(riding) :]
        if written:
            self._failpoint("after_intent")
        go: list[tuple[Lane[Job], Job]] = []
        for (lane, job), (held, won, carry_on) in zip(kept, written, strict=True):
            if won:
                go.append((lane, job))
                if self._progress is not None:  # called, outcome unknown until it returns
                    self._progress.calls[held.state.notice_id] = OutcomeKind.AMBIGUOUS
            else:
                lane.finished()
                if carry_on:
                    flight.ready.append(held)  # evidence changed under our lease: decide again
        return go

    def _record(
        self,
        returned: list[tuple[list[Job], CallResult]],
        flight: Flight,
        worker: str,
        summary: SweepSummary,
    ) -> None:
        """Fold what came back into each notice; it is written in one transaction, with the
        intents of the calls that start next (each intent still commits before its call)."""
        pendings: list[Pending] = []
        submitted = False
        ended_at = self.clock()
        called = [(jobs[0], result.error) for jobs, result in returned if jobs[0].called]
        self.routes.ended(called, ended_at)
        for jobs, result in returned:
            tracing.called(self.listeners, jobs, result)
            for job in jobs:
                lane = self.routes.lane_of(job)
                if isinstance(result.error, NotCalled):
                    lane.withdrawn()  # its slot is free, and it was no call
                else:
                    lane.finished()
            self.decks.timed(jobs, result)
            if isinstance(result.error, ThrottledError):
                summary.throttled += 1
                self.routes.throttled(jobs[0], result.error, self.clock())
                if jobs[0].kind is not StepKind.INTENT:
                    self.routes.requeue(jobs, self.clock())
                    continue
            if jobs[0].kind is StepKind.INTENT:
                submitted = True
                pendings.append(
                    fold_submit(jobs[0], result, summary, self._progress, self.submitted_notices)
                )
            elif jobs[0].kind is StepKind.LOOKUP:
                pendings.append(fold_lookup(jobs[0], result, summary, self.monotonic()))
            elif jobs[0].batched and result.statuses is None:
                # A failed batch read is not charged to every notice in it: each is read
                # again on its own, which says for itself whether the provider is down.
                self.routes.requeue(read_alone(jobs, result), self.clock())
            else:
                pendings += [fold_poll(job, result, job.transport, summary) for job in jobs]
        if submitted:
            self._failpoint("after_submit")
        for job, back_at in self.routes.take_deferred():
            pendings.append(deferred_of(job.held, job.decision, back_at, ended_at))
        flight.outcomes += pendings

    def _flush_outcomes(self, flight: Flight, worker: str, summary: SweepSummary) -> None:
        """Write the outcomes no intent took along."""
        outcomes, flight.outcomes = flight.outcomes, []
        flight.ready += [h for h, _, carry_on in self._write(outcomes, worker, summary) if carry_on]

    def _write(
        self, pendings: list[Pending], worker: str, summary: SweepSummary
    ) -> list[tuple[Held, bool, bool]]:
        """Write steps in one transaction; per step (held, won, carry on).

        Facts are always kept; each decision is a compare-and-set. A lost one is normal:
        when the row changed under a lease that is still ours (a callback recorded
        evidence), the fresh row is loaded and the machine decides again next round;
        otherwise the notice is someone else's.
        """
        if not pendings:
            return []
        results = self.store.write_round([step_of(p, worker) for p in pendings])
        written: list[tuple[Held, bool, bool]] = []
        for pending, result in zip(pendings, results, strict=True):
            written.append(
                (pending.held, result.won, self._after(pending, result, worker, summary))
            )
        return written

    def _after(
        self, pending: Pending, result: StepResult, worker: str, summary: SweepSummary
    ) -> bool:
        held, decision, channel = pending.held, pending.decision, pending.channel
        if self._progress is not None:
            self._progress.steps[held.state.notice_id] = (pending.kind, held)
        old_phase = held.state.phase
        if not result.won:
            summary.lost_races += 1
            self._emit(
                pending.state, StepKind.LOST_RACE, old_phase, worker, channel, decision.reason
            )
            fresh = self.store.load_notice(held.state.notice_id)
            if fresh is None or fresh.lease_token != held.claim.lease_token:
                return False
            held.state, held.version = fresh.state, fresh.version
            return True
        state = pending.state
        if state.phase is not decision.phase:  # an intent's state still has its old phase
            state = NoticeState(
                state.notice_id, decision.phase, state.expires_at, state.channels, state.attempts
            )
        held.state = state
        held.version = result.version
        status = getattr(pending.facts, "status", None)
        self._emit(held.state, pending.kind, old_phase, worker, channel, decision.reason, status)
        if decision.phase is not old_phase:
            summary.count_phase(decision.phase.value)
        return decision.due(pending.now) and pending.kind is not StepKind.TICK

    def _emit(
        self,
        state: NoticeState,
        kind: str,
        old_phase: Phase,
        worker: str,
        channel: str | None = None,
        reason: Reason | None = None,
        status: Status | None = None,
    ) -> None:
        if not self.listeners and not LOGGER.isEnabledFor(logging.INFO):
            return  # nobody reads it: a sweep emits one per step, so build nothing
        recipient, at = self._recipients.get(state.notice_id), self.clock()
        event = transition_of(
            state, kind, old_phase, worker, at, channel, reason, status, recipient
        )
        emit(self.listeners, event, self.settings.sample_success)
