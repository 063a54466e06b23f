"""The work a sweep holds: how it runs (its options, each lane's limits), the notices it
holds under their leases, the steps they wait to write, the calls they wait on, and
what a first submission reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from resetctl import machine
from resetctl.calls import CallResult, Rendered
from resetctl.config import DEFAULT_CONCURRENCY
from resetctl.durations import format_duration
from resetctl.errors import ConfigError
from resetctl.machine import Decision, NoticeState, OutcomeKind, Phase
from resetctl.policy import Policy
from resetctl.store import Claim, Contact, Facts, LoadedNotice, StepKind
from resetctl.transports.base import Transport, call_timeout


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
    #: provider calls in flight at once, over every lane
    concurrency: int = DEFAULT_CONCURRENCY


class NotCalled(Exception):
    """A submission whose intent was written but whose call was not made."""


@dataclass(slots=True)
class Pending:
    """A step decided in memory, waiting to be written with the others ready with it."""

    held: Held
    state: NoticeState
    decision: Decision
    facts: Facts
    kind: StepKind
    channel: str | None
    now: float
    #: seconds its call waited in its transport's lane (a slot, a token, a pause)
    lane_wait: float | None = None


@dataclass(slots=True)
class Held:
    """A notice this worker is working on under its lease."""

    claim: Claim
    loaded: LoadedNotice
    policy: Policy
    state: NoticeState = field(init=False)
    version: int = field(init=False)
    #: steps written for it under this claim
    steps: int = 0

    def __post_init__(self) -> None:
        self.state = self.loaded.state
        self.version = self.loaded.version


@dataclass(slots=True)
class Job:
    """One provider call a held notice's machine asked for: waiting in its lane, or in
    flight. A notice has at most one job at a time, so its calls keep the machine's
    order."""

    held: Held
    decision: Decision
    channel: str
    #: INTENT (a submission), POLL or LOOKUP
    kind: StepKind
    #: a submission's message as rendered when its intent was written
    rendered: Rendered | None = None
    contact: Contact | None = None
    #: a lookup's recorded fingerprint of what was sent
    sent: Mapping[str, str] | None = None
    #: a poll read in one call with others on its transport
    batched: bool = False
    #: a poll that must be read on its own (its batch read failed)
    alone: bool = False
    #: seconds it waited in its lane before it started
    waited: float = 0.0
    #: the provider instance the call goes to, and its transport (None: not configured)
    instance: str | None = None
    transport: Transport | None = None
    #: this call is its half-open instance's probe
    probe: bool = False
    #: the provider was called (not a render error, nor a read nothing could make)
    called: bool = False

    def not_worth_calling(self, now: float, margin: float, stopping: bool) -> str | None:
        """Why this submission should not be made at ``now`` (the link's reserve or the
        lease's ``margin`` ran short, or the run is stopping), or None."""
        held = self.held
        if now >= machine.action_deadline(held.state, held.policy, self.decision):
            return "too little of the link's lifetime left"
        if now >= held.claim.lease_expires_at - margin:
            return "the lease no longer covers the call's time-out"
        if stopping:
            return "the sweep is stopping"
        return None

    @property
    def lane(self) -> str:
        """The lane it waits in: its channel's, on its instance."""
        return lane_key(self.channel, self.instance or "")

    @property
    def key(self) -> str:
        return machine.attempt_key(self.held.state.notice_id, self.channel)


def lane_key(channel: str, instance: str) -> str:
    """The name of the lane of ``instance``'s calls on ``channel``."""
    return f"{channel}/{instance}"


@dataclass(slots=True)
class Flight:
    """The sweep's calls in flight and the ones that came back, for one claimed batch."""

    #: jobs in the pool's calls (running, or on a lane's deck) not yet come back
    pooled: int = 0
    returned: list[tuple[list[Job], CallResult]] = field(default_factory=list)
    #: notices to decide again (a step written that leaves work due)
    ready: list[Held] = field(default_factory=list)
    #: outcomes folded, to be written with the next intents (or on their own)
    outcomes: list[Pending] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SendReport:
    """What :meth:`Sweeper.send_now` did with the notices it was given."""

    #: the notices whose claim was tried (all, unless the database failed first)
    asked: frozenset[str]
    #: the notices it claimed (the others were terminal, leased elsewhere or not due)
    claimed: frozenset[str]
    #: each notice it worked, in the phase this run last committed (or found) it in
    phases: Mapping[str, Phase]
    #: how each notice's latest submission call in this run ended
    calls: Mapping[str, OutcomeKind]
    #: notices whose call a transport took, with that outcome recorded
    submitted: frozenset[str]
    #: notices whose call was made but whose outcome was never recorded: the provider
    #: may have it; the attempt stays in doubt until a sweep recovers it
    in_doubt: frozenset[str]
    #: why the run ended early (the database failed), or None
    failure: str | None = None
    #: notices whose call the provider throttled (nothing was created; cron sends them)
    throttled: frozenset[str] = frozenset()
    #: shadow notices this run ended at their would-send (nothing was sent)
    shadowed: frozenset[str] = frozenset()


class SendProgress:
    """What send_now reports per notice, as it happens. A plain sweep keeps none of it
    (over a long run it would only pile up)."""

    __slots__ = ("calls", "steps", "throttled")

    def __init__(self) -> None:
        self.calls: dict[str, OutcomeKind] = {}
        #: notices a provider throttled (a 429): not sent, handed back to cron
        self.throttled: set[str] = set()
        #: each notice's latest committed step: its kind, and the notice as held after it
        self.steps: dict[str, tuple[str, Held]] = {}

    def report(
        self,
        ids: Sequence[str],
        asked: frozenset[str],
        claimed: frozenset[str],
        submitted: set[str],
        failure: str | None,
    ) -> SendReport:
        """What send_now did with ``ids``."""
        # A call's intent is committed before it is made; if that intent is the last step
        # committed, the call's outcome never was.
        in_doubt = {
            notice_id
            for notice_id, kind in self.calls.items()
            if kind is not OutcomeKind.DECLINED
            and self.steps.get(notice_id, (StepKind.INTENT,))[0] == StepKind.INTENT
        }
        return SendReport(
            asked=asked,
            claimed=claimed,
            phases={nid: held.state.phase for nid, (_, held) in self.steps.items()},
            calls=dict(self.calls),
            submitted=frozenset((submitted & set(ids)) - in_doubt),
            in_doubt=frozenset(in_doubt),
            failure=failure,
            throttled=frozenset(self.throttled - submitted),
            shadowed=frozenset(n for n, (kind, _) in self.steps.items() if kind == StepKind.SHADOW),
        )


def check_lease(transports: Iterable[tuple[str, str, Transport]], lease: float) -> None:
    """ConfigError when a lease cannot cover one call of some instance: such a sweep
    could never start a call (every call would be declined)."""
    for channel, instance, transport in transports:
        needed = call_timeout(transport)
        if needed >= lease:
            raise ConfigError(
                f"lease: {format_duration(lease)} cannot cover one {channel} call"
                f" ({instance} time-outs add up to {format_duration(needed)});"
                " use a longer lease or shorter time-outs"
            )
