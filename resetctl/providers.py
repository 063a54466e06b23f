"""The provider instances one run calls: each channel's instances in order, the built
transports, and the health every process shares through the database.

A sweep asks which instance a call goes to (:func:`resetctl.machine.routing.route`
decides, from the health read here) and tells this module how each call ended; the
rows that say an instance is out of use are written by whichever process saw its
failures and read by all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from resetctl.failover import InstanceHealth, InstanceState, success_changes
from resetctl.instances import Failover
from resetctl.telemetry import LOGGER
from resetctl.transports.base import (
    AmbiguousError,
    ThrottledError,
    TransientError,
    Transport,
    TransportError,
)

if TYPE_CHECKING:
    from resetctl.config import Settings
    from resetctl.policy import Policy
    from resetctl.store import Store

#: Seconds a run trusts its copy of the health rows before reading them again (another
#: host's failures reach this one within about this long).
HEALTH_REFRESH = 1.0
#: ``[failover]`` as built in, for providers built without settings.
DEFAULT_FAILOVER = Failover()


def counts_as_failure(error: BaseException | None) -> bool | None:
    """How one call's ending reads for its instance's health: True a failure (a
    transient error or a time-out: the provider did not answer as it should), False a
    success (it answered, a refusal of one message included), None neither (a throttle
    says the instance is up and busy; anything else says nothing about the provider)."""
    if error is None:
        return False
    if isinstance(error, ThrottledError):
        return None
    if isinstance(error, TransientError | AmbiguousError):
        return True
    return False if isinstance(error, TransportError) else None


class Providers(Mapping[str, Transport]):
    """Each channel's provider instances, built, and their shared health.

    As a mapping it is each channel's first instance (what code written before
    instances reads); :meth:`each` gives every (channel, instance, transport).
    """

    def __init__(
        self,
        built: Mapping[tuple[str, str], Transport],
        chains: Mapping[str, tuple[str, ...]],
        *,
        settings: Settings | None = None,
        store: Store | None = None,
        failover: Failover = DEFAULT_FAILOVER,
    ) -> None:
        #: each (channel, instance) this run may call
        self.built = dict(built)
        #: each channel's instances in order (``[transport]``)
        self.chains = dict(chains)
        self._settings = settings
        self._store = store
        self.failover = failover
        self._health: dict[str, InstanceHealth] = {}
        self._read_at: float | None = None

    @classmethod
    def of_channels(cls, transports: Mapping[str, Transport]) -> Providers:
        """One instance per channel, named as the transport names itself (what a caller
        that builds its own transports passes)."""
        return cls(
            {(channel, t.name): t for channel, t in transports.items()},
            {channel: (t.name,) for channel, t in transports.items()},
        )

    def transport(self, channel: str, instance: str | None) -> Transport | None:
        """The built transport of ``instance`` on ``channel`` (None when not configured)."""
        if instance is None:
            return None
        return self.built.get((channel, instance))

    def first(self, channel: str) -> Transport | None:
        """The first instance of ``channel``'s chain."""
        chain = self.chains.get(channel, ())
        return self.transport(channel, chain[0]) if chain else None

    def chain(self, channel: str, policy: Policy | None = None) -> tuple[str, ...]:
        """The instances ``channel`` goes through for ``policy``'s notices, in order."""
        if self._settings is not None and policy is not None and policy.providers:
            return self._settings.chain(channel, policy)
        return self.chains.get(channel, ())

    def __getitem__(self, channel: str) -> Transport:
        found = self.first(channel)
        if found is None:
            raise KeyError(channel)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter([c for c in self.chains if self.first(c) is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def each(self) -> Iterator[tuple[str, str, Transport]]:
        """Every (channel, instance, transport) built."""
        for (channel, instance), transport in self.built.items():
            yield channel, instance, transport

    def distinct(self) -> list[Transport]:
        """Each built transport once (one may serve both channels)."""
        return list({id(t): t for t in self.built.values()}.values())

    # Health, shared through the database.

    def refresh(self, now: float, *, force: bool = False) -> None:
        """Read the health rows again when the copy is older than HEALTH_REFRESH."""
        if self._store is None:
            return
        if not force and self._read_at is not None and now - self._read_at < HEALTH_REFRESH:
            return
        self._health = self._store.instance_health()
        self._read_at = now

    def health(self, instance: str) -> InstanceHealth | None:
        """The latest health row read for ``instance`` (None: it never failed)."""
        return self._health.get(instance)

    def state(self, instance: str, now: float) -> InstanceState:
        """``instance``'s state as last read."""
        found = self._health.get(instance)
        return InstanceState.CLOSED if found is None else found.state(now)

    def healthy(self, names: Sequence[str], now: float) -> frozenset[str]:
        """Those of ``names`` that may take a new call now: in use, or half open (the
        call that lands there first is its probe)."""
        usable = (InstanceState.CLOSED, InstanceState.HALF_OPEN)
        return frozenset(n for n in names if self.state(n, now) in usable)

    def record(
        self, endings: Sequence[tuple[str, BaseException | None]], now: float
    ) -> dict[str, InstanceHealth]:
        """Count how calls ended; the rows that changed. A success on an instance with
        no streak and no opening writes nothing."""
        if self._store is None:
            return {}
        counted: list[tuple[str, bool]] = []
        for instance, error in endings:
            failed = counts_as_failure(error)
            if failed is None:
                continue
            if failed or success_changes(self._health.get(instance)):
                counted.append((instance, failed))
        if not counted:
            return {}
        before = {name: self.state(name, now) for name, _ in counted}
        rows = self._store.record_instance_calls(counted, now, self.failover)
        self._health.update(rows)
        for name, row in rows.items():
            after = row.state(now)
            if after is InstanceState.OPEN and before[name] is not InstanceState.OPEN:
                LOGGER.warning(
                    "provider instance %s is out of use for %gs after %d failures in a row",
                    name,
                    self.failover.cooldown,
                    row.failures,
                )
            elif after is InstanceState.CLOSED and before[name] is not InstanceState.CLOSED:
                LOGGER.warning("provider instance %s answers again: back in use", name)
        return rows

    def claim_probe(self, instance: str, now: float, until: float) -> bool:
        """True when this run makes the one probe call of half-open ``instance``."""
        if self._store is None:
            return True
        won = self._store.claim_probe(instance, now, until)
        self.refresh(now, force=True)
        return won
