"""One sweep: claim due notices under a lease, run the machine, call transports, record.

Per notice: the claim's row under the lease, the machine's decision, the attempt intent
persisted and committed, the transport called with no transaction open, the outcome
recorded under the same attempt key. One notice's transport error never stops the batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from resetctl import machine
from resetctl.config import Policy, Settings, format_duration
from resetctl.errors import ConfigError
from resetctl.machine import (
    ActionKind,
    AttemptState,
    Decision,
    LookedUp,
    NoticeState,
    Observed,
    OutcomeKind,
    Phase,
    Reason,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
)
from resetctl.render import (
    RenderModel,
    SmsTooLong,
    TemplateError,
    configured_root,
    minutes_until_expiry,
    render_email,
    render_sms,
)
from resetctl.store import (
    Claim,
    Contact,
    DeclinedFacts,
    Facts,
    IntentFacts,
    LoadedNotice,
    LookupFacts,
    ObservationFacts,
    OutcomeFacts,
    Step,
    StepResult,
    Store,
)
from resetctl.summary import SweepSummary
from resetctl.telemetry import LOGGER, Listener, TransitionEvent, emit
from resetctl.transports.base import (
    BatchStatusTransport,
    LookupTransport,
    Message,
    PermanentError,
    ProviderStatus,
    Transport,
    TransportError,
    call_timeout,
    supports_batch_status,
    supports_lookup,
)

#: Steps one claim may take on a notice before it is left for a later sweep.
MAX_STEPS_PER_CLAIM = 16
#: Seconds of lease that must remain, beyond a transport's own call time-out, to start a
#: call (at most a quarter of the lease, so a short lease still gets work done).
LEASE_MARGIN = 1.0
#: An idle sweep with --max-runtime looks for newly due work this often (seconds): a
#: notice enqueued without --send goes out within about this long.
IDLE_POLL = 1.0
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


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """How one `resetctl sweep` runs."""

    #: recorded on leases and events
    worker_id: str
    #: notices claimed per batch
    batch_size: int
    #: seconds a claim owns its notices
    lease: float
    #: keep sweeping (sleeping until the next due time) for this many seconds; 0 = once
    max_runtime: float = 0.0


@dataclass(slots=True)
class _Pending:
    """A step decided in memory, waiting to be written with the rest of its round."""

    held: _Held
    state: NoticeState
    decision: Decision
    facts: Facts
    kind: str
    channel: str | None
    now: float


@dataclass(slots=True)
class _Prepared:
    """A submission ready to go: its intent, the rendered message and whom it is for."""

    intent: _Pending
    message: Message | None
    render_error: str | None
    contact: Contact | None

    @property
    def channel(self) -> str:
        """The channel being submitted."""
        assert self.intent.channel is not None
        return self.intent.channel


@dataclass(slots=True)
class _Held:
    """A notice this worker is working on under its lease."""

    claim: Claim
    loaded: LoadedNotice
    policy: Policy
    state: NoticeState = field(init=False)
    version: int = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.loaded.state
        self.version = self.loaded.version


class Sweeper:
    """Runs sweeps over one store with one set of transports."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        transports: Mapping[str, Transport],
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
        self.transports = transports
        self.clock = clock
        self.sleep = sleep
        self.listeners = list(listeners)
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
        """ConfigError when a lease cannot cover one call of some transport: such a sweep
        could never start a call (every call would be declined)."""
        for channel, transport in self.transports.items():
            needed = call_timeout(transport)
            if needed >= lease:
                raise ConfigError(
                    f"lease: {format_duration(lease)} cannot cover one {channel} call"
                    f" ({transport.name} time-outs add up to {format_duration(needed)});"
                    " use a longer lease or shorter time-outs"
                )

    def run(self, options: SweepOptions) -> SweepSummary:
        """Claim batches until nothing is due; with max_runtime, keep going until it ends.

        With max_runtime the run is bounded: once it is spent the sweep claims nothing
        more and starts no new call, hands back the leases of notices it has not worked,
        and returns within max_runtime plus one call's time-out. An idle run looks for
        newly due notices every IDLE_POLL seconds (one indexed query).
        """
        self.check_lease(options.lease)
        with self._rounds():
            return self._run(options)

    @contextlib.contextmanager
    def _rounds(self) -> Iterator[None]:
        """While sweeping, the embedded outbox writes its messages in the round's outcome
        transaction rather than committing each on its own (it dedupes by key)."""
        with self.store.defer_outbox():
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

    def send_now(self, notice_ids: Iterable[str], options: SweepOptions) -> set[str]:
        """Make the first submission of just-enqueued notices before returning.

        Claims exactly these notices (those still due and unleased), works them as a
        sweep would, and returns the ids whose submission a transport took. The others
        stay durable and due: cron's sweep retries them.
        """
        self.check_lease(options.lease)
        ids = list(notice_ids)
        summary = SweepSummary()
        with self._rounds():
            for start in range(0, len(ids), options.batch_size):
                chunk = ids[start : start + options.batch_size]
                now = self.clock()
                claims = self.store.claim_notices(options.worker_id, chunk, now, options.lease)
                if claims:
                    summary.claimed += len(claims)
                    self._work(claims, options.worker_id, summary)
        return self.submitted_notices & set(ids)

    def sweep_due(self, options: SweepOptions, summary: SweepSummary) -> None:
        """Claim and work batches until a claim comes back empty (or the run must stop).

        A notice handed back still due (its lease ran short, or another writer won) is
        claimed again, but a batch of nothing but such notices ends the pass: progress
        stalled, and the next sweep (or the --max-runtime loop) takes over.
        """
        seen: set[str] = set()
        while not self._should_stop():
            claims = self.store.claim_due(
                options.worker_id, self.clock(), options.lease, options.batch_size
            )
            if not claims:
                return
            self._failpoint("after_claim")
            summary.batches += 1
            summary.claimed += len(claims)
            self._work(claims, options.worker_id, summary)
            fresh = {c.notice_id for c in claims} - seen
            if not fresh:
                return
            seen |= fresh

    def _policy(self, loaded: LoadedNotice) -> Policy:
        key = (loaded.policy_name, loaded.policy_version)
        if key not in self._policies:
            self._policies[key] = self.store.load_policy(*key)
        return self._policies[key]

    def _die_during_outcome(self, kind: str) -> None:
        if kind == "outcome":
            self._failpoint("during_outcome")

    def _failpoint(self, name: str) -> None:
        if name in self.failpoints:
            os.kill(os.getpid(), signal.SIGKILL)

    def _margin(self, channel: str | None, lease: float) -> float:
        """Seconds of lease a call on ``channel`` needs left before it starts: the
        transport's whole time-out, so a call never outlives its lease, plus a little."""
        slack = min(LEASE_MARGIN, lease / 4)
        if channel is None or channel not in self.transports:
            return slack
        return call_timeout(self.transports[channel]) + slack

    def _work(self, claims: list[Claim], worker: str, summary: SweepSummary) -> None:
        """Drive a claimed batch in rounds: decide for every notice, then write each kind
        of step for the whole batch in one short transaction.

        A round commits the batch's intents together before any transport is called,
        calls the transports with no transaction open, and records the outcomes together.
        Submissions on a transport that cannot recover by key go intent, call, outcome one
        notice at a time instead (see _submit_all). Once the run must stop, what is still
        held is handed back with its decision, due as it was.
        """
        holds: list[_Held] = []
        self._recipients = {}
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
                self._emit(loaded.state, "lease_recovered", loaded.state.phase, worker)
            holds.append(_Held(claim, loaded, self._policy(loaded)))
        for step in range(MAX_STEPS_PER_CLAIM):
            if not holds:
                return
            now = self.clock()
            stopping = self._should_stop()
            ticks: list[_Pending] = []
            submits: list[tuple[_Held, Decision]] = []
            reads: list[tuple[_Held, Decision]] = []
            for held in holds:
                decision = machine.decide(held.state, held.policy, now)
                margin = self._margin(decision.channel, held.claim.lease_expires_at - now)
                lease_short = now >= held.claim.lease_expires_at - margin
                if not decision.due(now) or lease_short or step == MAX_STEPS_PER_CLAIM - 1:
                    # Record the decision and hand the lease back, even when work is
                    # still due: a lease is never kept idle.
                    ticks.append(
                        _Pending(held, held.state, decision, None, "tick", decision.channel, now)
                    )
                elif stopping:
                    summary.released += 1
                    ticks.append(
                        _Pending(held, held.state, decision, None, "tick", decision.channel, now)
                    )
                elif decision.action is ActionKind.SUBMIT:
                    submits.append((held, decision))
                else:
                    reads.append((held, decision))
            holds = [h for h, _, carry_on in self._write(ticks, worker, summary) if carry_on]
            outcomes = self._submit_all(submits, worker, summary, holds)
            outcomes += self._read_all(reads, summary)
            holds += [h for h, _, carry_on in self._write(outcomes, worker, summary) if carry_on]
        # Out of steps (a lost race in the last one): hand back whatever is still held.
        now = self.clock()
        leftovers = []
        for held in holds:
            decision = machine.decide(held.state, held.policy, now)
            leftovers.append(_Pending(held, held.state, decision, None, "tick", None, now))
        self._write(leftovers, worker, summary)

    def _submit_all(
        self,
        submits: list[tuple[_Held, Decision]],
        worker: str,
        summary: SweepSummary,
        holds: list[_Held],
    ) -> list[_Pending]:
        """Commit intents and call the transports; returns the outcomes still to write.

        For transports that recover by key, the round's intents commit together, then
        the calls run: a crash leaves them in doubt, and recovery resubmits under the same
        keys. For the others, each notice goes intent, call, outcome on its own, so a crash
        never leaves more than one of them in doubt (a doubt they resolve by lookup, or,
        without lookup, at the cost of that notice's channel).
        """
        if not submits:
            return []
        now = self.clock()
        contacts = self.store.load_contacts([held.state.notice_id for held, _ in submits])
        prepared: list[_Prepared] = []
        for held, decision in submits:
            assert decision.channel is not None
            channel = decision.channel
            transport = self.transports[channel]
            contact = contacts.get(held.state.notice_id)
            message, segments, locale, render_error = self._render(held, contact, channel, now)
            key = machine.attempt_key(held.state.notice_id, channel)
            settle = _lookup_settle(transport)
            mono = self.monotonic()
            started = SubmissionStarted(channel, key, transport.recovers_by_key, settle, mono)
            facts = IntentFacts(
                key,
                channel,
                transport.name,
                held.policy.template_version,
                segments,
                transport.recovers_by_key,
                settle,
                locale,
                _fingerprint(transport, message),
                mono,
            )
            state = machine.apply(held.state, started, now)
            intent = _Pending(held, state, decision, facts, "intent", channel, now)
            prepared.append(_Prepared(intent, message, render_error, contact))
        together = [p for p in prepared if self.transports[p.channel].recovers_by_key]
        alone = [p for p in prepared if not self.transports[p.channel].recovers_by_key]
        outcomes: list[_Pending] = []
        written = self._write([p.intent for p in together], worker, summary)
        if written:
            self._failpoint("after_intent")
        for item, (held, won, carry_on) in zip(together, written, strict=True):
            if won:
                outcomes.append(self._call(item, summary))
            elif carry_on:
                holds.append(held)  # evidence changed under our lease: decide again
        if outcomes:
            self._failpoint("after_submit")
        for item in alone:
            if self._should_stop():
                # Its intent was never written: the notice goes back as it was.
                summary.released += 1
                held = item.intent.held
                decision = machine.decide(held.state, held.policy, self.clock())
                tick = _Pending(held, held.state, decision, None, "tick", None, self.clock())
                self._write([tick], worker, summary)
                continue
            ((held, won, carry_on),) = self._write([item.intent], worker, summary)
            if not won:
                if carry_on:
                    holds.append(held)
                continue
            self._failpoint("after_intent")
            outcome = self._call(item, summary)
            self._failpoint("after_submit")
            holds += [h for h, _, go_on in self._write([outcome], worker, summary) if go_on]
        return outcomes

    def _call(self, item: _Prepared, summary: SweepSummary) -> _Pending:
        """Submit one message (no transaction open) and fold the outcome into its state.

        Expiry, the lease and the run's end are checked again just before the call: a
        round's earlier calls may have used the time. A call that is no longer worth
        making is declined: its intent is undone, so it spends no retry.
        """
        intent = item.intent
        held, decision, channel = intent.held, intent.decision, item.channel
        key = machine.attempt_key(held.state.notice_id, channel)
        message, render_error = item.message, item.render_error
        on_fallback = decision.phase is Phase.FALLBACK_PENDING
        reserve = held.policy.fallback_reserve if on_fallback else held.policy.send_reserve
        now = self.clock()
        margin = self._margin(channel, held.claim.lease_expires_at - now)
        skipped = None
        if now >= held.state.expires_at - reserve:
            skipped = "too little of the link's lifetime left"
        elif now >= held.claim.lease_expires_at - margin:
            skipped = "the lease no longer covers the call's time-out"
        elif self._should_stop():
            skipped = "the sweep is stopping"
        transport = self.transports[channel]
        reply: ProviderStatus | None = None
        error: str | None = render_error
        kind = OutcomeKind.PERMANENT
        if skipped is not None:
            kind, error = OutcomeKind.DECLINED, f"declined: not called ({skipped})"
            summary.declined += 1
        elif message is not None:
            try:
                reply = transport.submit(message, key)
                kind = OutcomeKind.SUBMITTED
                summary.submitted += 1
                self.submitted_notices.add(held.state.notice_id)
            except TransportError as exc:
                kind = OutcomeKind(exc.kind)
                # A plugin's message might quote what it was given: never let it out.
                error = f"{exc.kind}: {_redact(str(exc), item.contact)}"
            except Exception as exc:  # a transport bug may have sent it
                kind = OutcomeKind.AMBIGUOUS
                error = f"ambiguous: unexpected {type(exc).__name__}"
        if error is not None and skipped is None:
            summary.errors += 1
            notice_id = held.state.notice_id
            LOGGER.warning("notice %s: %s submission failed (%s)", notice_id, channel, error)
        now = self.clock()
        outcome = SubmissionOutcome(
            channel,
            kind,
            message_id=reply.message_id if reply else None,
            status=reply.status if reply else None,
        )
        state, decision = machine.transition(held.state, held.policy, outcome, now)
        facts: Facts
        if kind is OutcomeKind.DECLINED:
            facts = DeclinedFacts(key)
            return _Pending(held, state, decision, facts, "declined", channel, now)
        facts = OutcomeFacts(
            key,
            _ATTEMPT_STATE[kind],
            reply.message_id if reply else None,
            reply.raw_status if reply else None,
            reply.status if reply else None,
            error,
        )
        return _Pending(held, state, decision, facts, "outcome", channel, now)

    def _render(
        self, held: _Held, contact: Contact | None, channel: str, now: float
    ) -> tuple[Message | None, int | None, str | None, str | None]:
        """(message, SMS segments, template locale rendered, error) for one submission."""
        recipient = _recipient(contact, channel)
        if contact is None or recipient is None:
            return None, None, None, "permanent: no contact data for this channel"
        model = RenderModel(
            reset_url=contact.reset_url,
            minutes_until_expiry=minutes_until_expiry(held.state.expires_at, now),
            support_label=self.settings.support_label,
            display_name=contact.display_name,
            locale=held.loaded.locale,
        )
        version = held.policy.template_version
        root = configured_root(self.settings.templates_dir)
        try:
            if channel == "email":
                email = render_email(model, version, root)
                return (
                    Message(
                        channel, held.state.notice_id, recipient, held.state.expires_at, email=email
                    ),
                    None,
                    email.locale,
                    None,
                )
            sms = render_sms(model, version, held.policy.sms_max_segments, root)
        except SmsTooLong as exc:
            return None, exc.segments, None, f"permanent: {exc}"
        except TemplateError as exc:
            return None, None, None, f"permanent: {exc}"
        message = Message(channel, held.state.notice_id, recipient, held.state.expires_at, sms=sms)
        return message, sms.segments, sms.locale, None

    def _read_all(
        self, reads: list[tuple[_Held, Decision]], summary: SweepSummary
    ) -> list[_Pending]:
        """Status reads and lookups of the round (no transaction open), each folded into
        its notice's state. Once the run must stop, what is left is not folded (a batch
        read already made is dropped unread) and those notices are handed back by the
        next round."""
        lookups = [(h, d) for h, d in reads if d.action is ActionKind.LOOKUP]
        contacts: Mapping[str, Contact] = {}
        sent: Mapping[str, Mapping[str, str]] = {}
        if lookups:
            contacts = self.store.load_contacts([h.state.notice_id for h, _ in lookups])
            sent = self.store.load_fingerprints(
                [machine.attempt_key(h.state.notice_id, str(d.channel)) for h, d in lookups]
            )
        read_together = self._read_statuses(reads)
        done: list[_Pending] = []
        for held, decision in reads:
            if self._should_stop():
                break
            if decision.action is ActionKind.LOOKUP:
                done.append(self._lookup(held, decision, contacts, sent, summary))
            elif decision.action is ActionKind.POLL and decision.channel in read_together:
                batch = read_together[decision.channel]
                done.append(self._poll(held, decision, summary, batch))
            else:
                done.append(self._poll(held, decision, summary))
        return done

    def _read_statuses(self, reads: list[tuple[_Held, Decision]]) -> dict[str, _BatchRead]:
        """The round's polls on transports that read many statuses in one call, read now,
        one call per channel, with the time of the read. A batch call that fails is not
        charged to every notice in it: its channel's polls fall back to one read each,
        which say for themselves whether the provider is down."""
        wanted: dict[str, list[str]] = {}
        for held, decision in reads:
            channel = decision.channel
            if decision.action is not ActionKind.POLL or channel is None:
                continue
            attempt = held.state.attempt(channel)
            message_id = None if attempt is None else attempt.message_id
            if message_id is not None and supports_batch_status(self.transports[channel]):
                wanted.setdefault(channel, []).append(message_id)
        found: dict[str, _BatchRead] = {}
        for channel, message_ids in wanted.items():
            if self._should_stop():
                break
            reader: BatchStatusTransport = self.transports[channel]  # type: ignore[assignment]
            try:
                found[channel] = (reader.statuses(message_ids), self.clock())
            except Exception as exc:
                kind = exc.kind if isinstance(exc, TransportError) else type(exc).__name__
                LOGGER.warning(
                    "%s status read of %d messages failed (%s); reading them one by one",
                    channel,
                    len(message_ids),
                    kind,
                )
        return found

    def _poll(
        self,
        held: _Held,
        decision: Decision,
        summary: SweepSummary,
        batch: _BatchRead | None = None,
    ) -> _Pending:
        """Read one message's status (or take it from the round's batch read) and fold
        it into its state, as of the moment it was read."""
        assert decision.channel is not None
        attempt = held.state.attempt(decision.channel)
        assert attempt is not None
        assert attempt.message_id is not None
        transport = self.transports[decision.channel]
        read_at: float | None = None
        try:
            if batch is None:
                reply = transport.status(attempt.message_id)
            else:
                statuses, read_at = batch
                found = statuses.get(attempt.message_id)
                if found is None:  # what a single read of an unknown message says
                    raise PermanentError(f"{transport.name} has no such message")
                reply = found
            raw, status = reply.raw_status, reply.status
        except TransportError as exc:
            raw, status = f"error:{exc.kind}", Status.UNKNOWN
            summary.errors += 1
        except Exception as exc:
            raw, status = f"error:{type(exc).__name__}", Status.UNKNOWN
            summary.errors += 1
        summary.polled += 1
        now = self.clock() if read_at is None else read_at
        observed = Observed(decision.channel, status, is_poll=True)
        state, next_decision = machine.transition(held.state, held.policy, observed, now)
        facts = ObservationFacts(attempt.key, "poll", raw, status)
        return _Pending(held, state, next_decision, facts, "poll", decision.channel, now)

    def _lookup(
        self,
        held: _Held,
        decision: Decision,
        contacts: Mapping[str, Contact],
        sent: Mapping[str, Mapping[str, str]],
        summary: SweepSummary,
    ) -> _Pending:
        """Ask the provider whether a doubtful submission created a message.

        The lookup matches what was actually sent, as recorded with the intent (the
        sender, a digest of the exact body, the provider's own metadata), never what
        today's templates and settings would send.
        """
        channel = decision.channel
        assert channel is not None
        attempt = held.state.attempt(channel)
        assert attempt is not None
        transport = self.transports[channel]
        contact = contacts.get(held.state.notice_id)
        recipient = _recipient(contact, channel)
        fingerprint = sent.get(attempt.key)
        found: ProviderStatus | None = None
        failed = recipient is None or fingerprint is None or not supports_lookup(transport)
        if not failed:
            assert recipient is not None
            assert fingerprint is not None
            try:
                looker: LookupTransport = transport  # type: ignore[assignment]
                found = looker.lookup(recipient, attempt.key, attempt.last_call_at, fingerprint)
            except TransportError as exc:
                failed = True
                LOGGER.warning(
                    "notice %s: %s lookup failed (%s)",
                    held.state.notice_id,
                    channel,
                    _redact(str(exc), contact),
                )
            except Exception as exc:
                failed = True
                LOGGER.warning(
                    "notice %s: %s lookup failed (%s)",
                    held.state.notice_id,
                    channel,
                    type(exc).__name__,
                )
        if failed:
            summary.errors += 1
        summary.looked_up += 1
        now = self.clock()
        event = LookedUp(
            channel,
            found.message_id if found else None,
            found.status if found else None,
            failed=failed,
            mono=self.monotonic(),
        )
        state, next_decision = machine.transition(held.state, held.policy, event, now)
        after = state.attempt(channel)
        assert after is not None
        facts = LookupFacts(
            attempt.key,
            found.message_id if found else None,
            found.raw_status if found else None,
            found.status if found else None,
            after,
            failed=failed,
        )
        return _Pending(held, state, next_decision, facts, "lookup", channel, now)

    def _write(
        self, pendings: list[_Pending], worker: str, summary: SweepSummary
    ) -> list[tuple[_Held, bool, bool]]:
        """Write steps in one transaction; per step (held, won, carry on).

        Facts are always kept; each decision is a compare-and-set. A lost one is normal:
        when the row changed under a lease that is still ours (a callback recorded
        evidence), the fresh row is loaded and the machine decides again next round;
        otherwise the notice is someone else's.
        """
        if not pendings:
            return []
        with self.store.transaction():
            results = self.store.write_steps([self._step(p, worker) for p in pendings])
        written: list[tuple[_Held, bool, bool]] = []
        for pending, result in zip(pendings, results, strict=True):
            written.append(
                (pending.held, result.won, self._after(pending, result, worker, summary))
            )
        return written

    def _step(self, pending: _Pending, worker: str) -> Step:
        held, decision, channel = pending.held, pending.decision, pending.channel
        attempt = pending.state.attempt(channel) if channel else None
        keep_lease = decision.due(pending.now) and pending.kind != "tick"
        return Step(
            notice_id=held.state.notice_id,
            version=held.version,
            lease_token=held.claim.lease_token,
            old_phase=held.state.phase,
            decision=decision,
            release=not keep_lease,
            facts=pending.facts,
            kind=pending.kind,
            worker=worker,
            now=pending.now,
            polls=attempt.polls if attempt else None,
            channel=channel,
        )

    def _after(
        self, pending: _Pending, result: StepResult, worker: str, summary: SweepSummary
    ) -> bool:
        held, decision, channel = pending.held, pending.decision, pending.channel
        old_phase = held.state.phase
        if not result.won:
            summary.lost_races += 1
            self._emit(pending.state, "lost_race", old_phase, worker, channel, decision.reason)
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
            if decision.phase is Phase.FALLBACK_PENDING:
                summary.escalated += 1
            elif decision.phase is Phase.EXPIRED:
                summary.expired += 1
            elif decision.phase is Phase.ACCEPTED:
                summary.accepted += 1
            elif decision.phase is Phase.FAILED:
                summary.failed += 1
        return decision.due(pending.now) and pending.kind != "tick"

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
        emit(
            self.listeners,
            TransitionEvent(
                notice_id=state.notice_id,
                kind=kind,
                old_phase=old_phase.value,
                new_phase=state.phase.value,
                worker=worker,
                at=self.clock(),
                channel=channel,
                status=None if status is None else status.value,
                reason=None if reason is None else reason.value,
                recipient=self._recipients.get(state.notice_id),
            ),
        )


#: A batch status read: the statuses it returned by message id, and when it was read.
_BatchRead = tuple[Mapping[str, ProviderStatus], float]


def _lookup_settle(transport: Transport) -> float | None:
    return float(transport.lookup_settle) if supports_lookup(transport) else None  # type: ignore[attr-defined]


def _fingerprint(transport: Transport, message: Message | None) -> str | None:
    """What a lookup needs to recognise ``message`` later, as JSON (None when the
    transport cannot look up, or nothing was rendered)."""
    if message is None or not supports_lookup(transport):
        return None
    looker: LookupTransport = transport  # type: ignore[assignment]
    return json.dumps(dict(looker.fingerprint(message)), sort_keys=True)


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


_ATTEMPT_STATE = {
    OutcomeKind.SUBMITTED: AttemptState.SUBMITTED,
    OutcomeKind.TRANSIENT: AttemptState.INTENT,
    OutcomeKind.AMBIGUOUS: AttemptState.AMBIGUOUS,
    OutcomeKind.PERMANENT: AttemptState.REJECTED,
}


def _redact(text: str, contact: Contact | None) -> str:
    """``text`` with the notice's contact data and URL taken out."""
    if contact is None:
        return text
    for secret in (contact.reset_url, contact.email, contact.phone, contact.display_name):
        if secret:
            text = text.replace(secret, "<redacted>")
    if contact.phone:
        text = text.replace(contact.phone.lstrip("+"), "<redacted>")
    return text


def _recipient(contact: Contact | None, channel: str) -> str | None:
    if contact is None:
        return None
    return contact.email if channel == "email" else contact.phone
