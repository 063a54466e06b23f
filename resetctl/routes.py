"""A sweep's routes to its provider instances: which instance each call goes to, the lane
it waits in there, and what an instance's health lets start.

Each (channel, instance) has its own lane, so a slow or failing instance holds only its
own slots. An instance out of use holds its lanes until its cooldown ends; then one
call, by whichever process claims the probe, decides whether it is back.
"""

from __future__ import annotations

from collections.abc import Sequence

from resetctl import calls
from resetctl.config import LaneLimits, Settings
from resetctl.failover import InstanceState
from resetctl.folds import deadline_of
from resetctl.lanes import Lane, lane_counts
from resetctl.machine import ActionKind, Decision
from resetctl.machine.routing import Route, route
from resetctl.providers import Providers
from resetctl.store import StepKind
from resetctl.telemetry import LOGGER
from resetctl.transports.base import ThrottledError
from resetctl.work import Held, Job, lane_key

#: Seconds a lane pauses after a throttle that did not say how long (no Retry-After).
DEFAULT_THROTTLE_PAUSE = 1.0
#: How many of a transport's in-place calls one pass may make (they never overlap).
IN_PLACE_CAP = 1_000_000
#: Seconds a lane held for another process's probe waits before it looks again.
PROBE_RECHECK = 1.0


class Routes:
    """One run's lanes over its provider instances, and the health that opens them."""

    def __init__(
        self,
        providers: Providers,
        settings: Settings,
        concurrency: int,
    ) -> None:
        self.providers = providers
        self.settings = settings
        self.concurrency = concurrency
        #: each (channel, instance)'s lane, made when work first goes there
        self.lanes: dict[str, Lane[Job]] = {}
        #: lanes whose calls wait on nothing: made on the sweep's thread
        self.in_place: set[str] = set()
        self._names: dict[str, str] = {}
        self._deferred: list[tuple[Job, float]] = []
        for channel, instance, _ in providers.each():
            self.lane(channel, instance)

    def lane(self, channel: str, instance: str) -> Lane[Job]:
        """The lane of ``instance`` on ``channel``, with that instance's limits."""
        key = lane_key(channel, instance)
        found = self.lanes.get(key)
        if found is not None:
            return found
        transport = self.providers.transport(channel, instance)
        limits = self.settings.lane_limits.get(instance, LaneLimits())
        cap = min(self.concurrency, limits.max_in_flight or self.concurrency)
        if transport is not None and calls.runs_in_place(transport):
            self.in_place.add(key)
            if limits.max_in_flight is None:
                cap = IN_PLACE_CAP  # its calls end as they start: none waits on another
        lane: Lane[Job] = Lane(key, cap, limits.max_rate)
        self.lanes[key] = lane
        self._names[key] = instance
        return lane

    def place(self, job: Job, held: Held, decision: Decision, now: float) -> Route:
        """Choose ``job``'s instance (health as last read) and bind it there."""
        assert decision.channel is not None
        channel = decision.channel
        attempt = held.state.attempt(channel)
        chain = self.providers.chain(channel, held.policy)
        self.providers.refresh(now)
        names = [*chain, *([attempt.instance] if attempt and attempt.instance else [])]
        healthy = self.providers.healthy(names, now)
        found = route(
            decision,
            attempt,
            attempt.instance if attempt is not None else None,
            chain,
            healthy,
            failover_on_doubt=held.policy.failover_on_doubt,
        )
        job.instance = found.instance
        job.transport = self.providers.transport(channel, found.instance)
        return found

    def lane_of(self, job: Job) -> Lane[Job]:
        """The lane ``job`` waits in (made on first use)."""
        return self.lane(job.channel, job.instance or "")

    def out_of_use_until(self, job: Job, now: float) -> float | None:
        """When ``job``'s instance comes back, if it is out of use now (open): its work
        is handed back due then, not held in a lane while the sweep waits."""
        if job.instance is None:
            return None
        health = self.providers.health(job.instance)
        if health is None or health.state(now) is not InstanceState.OPEN:
            return None
        return health.open_until

    def throttled(self, job: Job, error: ThrottledError, now: float) -> None:
        """The provider asked us to slow down: ``job``'s lane pauses as long as it said."""
        wait_for = DEFAULT_THROTTLE_PAUSE if error.retry_after is None else error.retry_after
        self.lane_of(job).pause(now + wait_for)
        LOGGER.warning("%s throttled a call; its lane pauses %s", job.channel, wait_for)

    def requeue(self, jobs: list[Job], now: float) -> None:
        """Reads the provider refused unread go back to their lane: no poll spent."""
        for job in jobs:
            self.lane_of(job).put(job, deadline_of(job.held, job.decision), now)

    def take_deferred(self) -> list[tuple[Job, float]]:
        """Work taken out of the lanes of instances that just opened and could not move:
        each with when its instance comes back."""
        deferred, self._deferred = self._deferred, []
        return deferred

    def in_use(self, job: Job, now: float) -> bool:
        """True when ``job``'s instance is in use (closed): its calls need no probe."""
        return job.instance is None or (
            self.providers.state(job.instance, now) is InstanceState.CLOSED
        )

    def may_start(self, job: Job, now: float, margin: float) -> bool:
        """True when ``job``'s call may start now as its instance's health says: in use,
        or half open and this run claimed its probe (its lanes then hold the rest until
        the probe's answer). False: the lane is held and the job goes back to it."""
        if job.instance is None:
            return True
        state = self.providers.state(job.instance, now)
        if state is InstanceState.CLOSED:
            return True
        health = self.providers.health(job.instance)
        assert health is not None
        if state is InstanceState.HALF_OPEN:
            until = now + margin
            if self.providers.claim_probe(job.instance, now, until):
                job.probe = True
                self._hold(job.instance, until)
                return True
            state = self.providers.state(job.instance, now)
            health = self.providers.health(job.instance) or health
        if state is InstanceState.OPEN and health.open_until is not None:
            self._hold(job.instance, health.open_until)
        else:
            self._hold(job.instance, now + PROBE_RECHECK)
        return False

    def ended(self, endings: Sequence[tuple[Job, BaseException | None]], now: float) -> None:
        """Count how calls ended for their instances' health; an instance that opened
        holds its lanes, one that answered again releases them."""
        counted = [(job.instance, error) for job, error in endings if job.instance is not None]
        rows = self.providers.record(counted, now)
        for instance, row in rows.items():
            state = row.state(now)
            if state is InstanceState.OPEN:
                assert row.open_until is not None
                self._hold(instance, row.open_until)
                self._reroute(instance, row.open_until, now)
            elif state is InstanceState.CLOSED:
                self._hold(instance, 0.0)
        for job, _ in endings:
            if job.probe and (job.instance not in rows):
                # The probe said nothing either way (a throttle): let the next call probe.
                self._hold(job.instance or "", 0.0)

    def _reroute(self, instance: str, until: float, now: float) -> None:
        """``instance`` just went out of use until ``until``: the new submissions waiting
        in its lanes go to the next healthy instance now; what cannot move (reads and
        doubts belong to the messages it holds) is handed back due when it returns."""
        for key, lane in list(self.lanes.items()):
            if self._names.get(key) != instance or not len(lane):
                continue
            for job in lane.drain():
                if job.kind is StepKind.INTENT:
                    before = (job.instance, job.transport)
                    found = self.place(job, job.held, job.decision, now)
                    if found.action is ActionKind.SUBMIT and job.instance != instance:
                        self.lane_of(job).put(job, deadline_of(job.held, job.decision), now)
                        continue
                    job.instance, job.transport = before
                self._deferred.append((job, until))

    def _hold(self, instance: str, until: float) -> None:
        for key, lane in self.lanes.items():
            if self._names.get(key) == instance:
                lane.hold(until)

    def counts(self) -> dict[str, dict[str, float]]:
        """This run's lane counts, by instance."""
        return lane_counts(self.lanes, self._names)
