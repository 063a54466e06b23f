"""Fitting: from what the reads saw to the timelines a simulation reads.

Every figure comes as an optimistic value (each change at its interval's start), a
pessimistic one (at its end, and nothing more after the end of observation) and a point
estimate (changes drawn from delay distributions fitted to all intervals of that channel,
region and transport). A channel a notice never used is unknown, not silent: its timeline
is borrowed from the observed ones of the same channel, region and transport, and a few
more are borrowed beside it for the range (``Trace.alternatives``).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from resetctl.machine import Status
from resetctl.replay.readings import BORROW_DRAWS
from resetctl.replay.traces import (
    CHANNELS,
    FINAL,
    FINAL_ORDER,
    POINT,
    Header,
    Observation,
    Timeline,
    Timelines,
    Trace,
    normalized_status,
    parse_traces,
    readable_lines,
)

#: An as-yet-unobserved change placed at an interval's start sits this far after the read
#: that did not show it (that read itself must still not see it).
JUST_AFTER = 0.001
#: Per fitted key, at most this many intervals (a seeded reservoir) feed the estimator,
#: and at most this many observed timelines are kept to borrow from.
FIT_SAMPLE = 2000
BORROW_POOL = 500
#: The curves the tail extrapolates with: mu and sigma this far either way of the best
#: fit's, in these steps (log seconds).
TAIL_SPAN, TAIL_STEP = 0.4, 0.1
_NONE_BORROWED: frozenset[str] = frozenset()


def read_traces(
    lines: Iterable[str],
    unknown: Counter[tuple[str, str, str]],
    resolver: Resolver | None = None,
    headers: list[Header] | None = None,
) -> Iterator[Trace]:
    """Parse a trace file lazily, checking arrival order; blank lines are skipped, a
    header line (first) goes to ``headers``. Timelines are resolved by ``resolver``
    (default: no fitted distributions and nothing to borrow from)."""
    return map((resolver or Resolver())._resolve_own, parse_traces(lines, unknown, headers))


class DelayFit:
    """The delay distribution of one status on one channel, region and transport: a
    log-normal with a share that never comes (a cure model), fitted by interval-censored
    maximum likelihood (a coarse grid, then a finer one around the best) to every
    interval of that key, right-censored ones ("not by the last read") included.

    Why not Turnbull's non-parametric estimate: with reads on one schedule plus a little
    jitter its innermost intervals are milliseconds wide, and it may put all of a change
    in (45 s, 105 s] at 45.1 s: a candidate reading at 90 s then looks far better than it
    is. It also says nothing past the last read anyone made, where the point estimate must
    extrapolate (the range never depends on it). The maintained implementations bring
    numpy, scipy and pandas (lifelines) for what is forty lines here.

    Past the last read, the point estimate extrapolates with every curve the intervals
    allow, weighted by how well each fits them (a grid around the best, TAIL_SPAN either
    way): reads that stop at 105 s barely tell a late delivery from one that never comes,
    and the single best curve is then, more often than not, the one with the thinner
    tail (bench/fidelity.py: 3 late successes where there were 15).
    """

    __slots__ = ("_afters", "_cdfs", "_tail", "mu", "never", "sigma")

    def __init__(self, intervals: Sequence[tuple[float, float]]) -> None:
        # Whole seconds are plenty for a shape: group the intervals so the grid is cheap.
        groups: Counter[tuple[float, float]] = Counter(
            (float(max(math.floor(lo), 0)), math.inf if math.isinf(hi) else max(math.ceil(hi), 1.0))
            for lo, hi in intervals
        )
        self.mu, self.sigma, self.never = 0.0, 1.0, 1.0
        # The fitted CDF by time: reads on one schedule bring the same bounds back often.
        self._cdfs: dict[float, float] = {}
        #: (weight, mu, sigma, never) of each curve the tail extrapolates with
        self._tail: tuple[tuple[float, float, float, float], ...] = ((1.0, 0.0, 1.0, 1.0),)
        #: per end of observation (to 0.1 s): the chance anything still comes, and the
        #: curves' cumulative shares of it
        self._afters: dict[float, tuple[float, list[float]]] = {}
        if not any(not math.isinf(hi) for _, hi in groups):
            return
        best = (-math.inf, 0.0, 1.0, 1.0)
        grid = [(m / 5, s / 5) for m in range(0, 36) for s in range(1, 16)]
        for _ in range(2):
            for mu, sigma in grid:
                likelihood, never = self._profile(groups, mu, sigma)
                if likelihood > best[0]:
                    best = (likelihood, mu, sigma, never)
            _, mu0, sigma0 = best[:3]
            grid = [
                (mu0 + m / 20, sigma0 + s / 20)
                for m in range(-4, 5)
                for s in range(-4, 5)
                if sigma0 + s / 20 > 0.05
            ]
        _, self.mu, self.sigma, self.never = best
        self._tail = self._curves(groups, best[0])

    def _curves(
        self, groups: Mapping[tuple[float, float], int], best: float
    ) -> tuple[tuple[float, float, float, float], ...]:
        """Every curve on a grid around the best one, weighted by its likelihood (a flat
        prior on mu and sigma; the never-share at its best for each)."""
        steps = round(TAIL_SPAN / TAIL_STEP)
        curves = []
        for m in range(-steps, steps + 1):
            for s in range(-steps, steps + 1):
                mu, sigma = self.mu + m * TAIL_STEP, self.sigma + s * TAIL_STEP
                if sigma <= 0.05:
                    continue
                likelihood, never = self._profile(groups, mu, sigma)
                if likelihood - best > -20:
                    curves.append((math.exp(likelihood - best), mu, sigma, never))
        total = sum(weight for weight, *_ in curves)
        return tuple((weight / total, mu, sigma, never) for weight, mu, sigma, never in curves)

    @staticmethod
    def _cdf(t: float, mu: float, sigma: float) -> float:
        if t <= 0:
            return 0.0
        if math.isinf(t):
            return 1.0
        return 0.5 * math.erfc(-(math.log(t) - mu) / (sigma * math.sqrt(2)))

    def _profile(
        self, groups: Mapping[tuple[float, float], int], mu: float, sigma: float
    ) -> tuple[float, float]:
        """The log-likelihood at (mu, sigma), maximised over the never-share by EM."""
        cdf = self._cdf
        cells = [
            (cdf(lo, mu, sigma), cdf(hi, mu, sigma), math.isinf(hi), n)
            for (lo, hi), n in groups.items()
        ]
        total = sum(n for *_, n in cells)
        never = 0.2
        for _ in range(8):
            expected = 0.0
            for f_lo, _, censored, n in cells:
                if censored:
                    alive = never + (1 - never) * (1 - f_lo)
                    expected += n * never / alive if alive > 0 else n
            never = min(max(expected / total, 1e-6), 1 - 1e-6)
        likelihood = 0.0
        for f_lo, f_hi, censored, n in cells:
            came = (1 - never) * (f_hi - f_lo)
            value = never + (1 - never) * (1 - f_lo) if censored else came
            likelihood += n * math.log(max(value, 1e-300))
        return likelihood, never

    def _fitted_cdf(self, t: float) -> float:
        cdfs = self._cdfs
        value = cdfs.get(t)
        if value is None:
            if len(cdfs) >= 65536:
                cdfs.clear()
            value = cdfs[t] = self._cdf(t, self.mu, self.sigma)
        return value

    def sample(self, lo: float, hi: float, u: float) -> float:
        """A time in (lo, hi] drawn from the fit conditioned on it (uniform when the fit
        gives the interval no weight)."""
        f_lo, f_hi = self._fitted_cdf(lo), self._fitted_cdf(hi)
        if f_hi - f_lo < 1e-9:
            return lo + u * (hi - lo)
        u = min(max(f_lo + u * (f_hi - f_lo), 1e-12), 1 - 1e-12)
        at = math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(u))
        return min(max(at, lo), hi)

    def sample_after(self, end: float, u: float, v: float) -> float | None:
        """A time after ``end`` given nothing happened by then, or None for never: it
        comes with the chance the weighted curves give it (``u`` below that), on the
        curve ``v`` picks in proportion to its share of that chance."""
        key = round(end, 1)
        entry = self._afters.get(key)
        if entry is None:
            if len(self._afters) >= 65536:
                self._afters.clear()
            comes = 0.0
            shares = []
            for weight, mu, sigma, never in self._tail:
                later = (1 - never) * (1 - self._cdf(key, mu, sigma))
                alive = never + later
                comes += weight * later / alive if alive > 0 else 0.0
                shares.append(comes)
            entry = self._afters[key] = (comes, shares)
        comes, shares = entry
        if comes <= 0 or u >= comes:
            return None
        target = v * comes
        index = min(bisect_right(shares, target), len(shares) - 1)
        below = shares[index - 1] if index else 0.0
        share = shares[index] - below
        v = (target - below) / share if share > 0 else 0.5
        _, mu, sigma, _ = self._tail[index]
        low = self._cdf(end, mu, sigma)
        w = min(low + v * (1 - low), 1 - 1e-12)
        return max(end, math.exp(mu + sigma * _NORMAL.inv_cdf(max(w, 1e-12))))


_NORMAL = statistics.NormalDist()
_GOLDEN = (math.sqrt(5) - 1) / 2


class Resolver:
    """Turns a trace's observations into its three timelines per channel: fitted delay
    distributions for the point estimate, observed timelines to borrow for a channel the
    notice never used, and a seeded random stream so a replay is reproducible."""

    def __init__(
        self,
        fits: Mapping[tuple[str, str, str, Status], DelayFit] | None = None,
        pools: Mapping[tuple[str, str, str], Sequence[Observation]] | None = None,
        seed: int = 0,
        tail_grace: float = 1.0,
    ) -> None:
        self.fits = fits or {}
        self.pools = pools or {}
        self.seed = seed
        self.rng = random.Random(seed)
        self._strata: dict[tuple[Any, ...], float] = {}
        self.tail_grace = tail_grace

    @classmethod
    def fitted_lines(cls, lines: Iterable[str], seed: int = 0, tail_grace: float = 1.0) -> Resolver:
        """Fit every (channel, region, transport, status) over the version-2 lines (the
        first pass over the file, read without the second pass's checks) and keep a
        seeded sample of observed timelines to borrow. One loop: no Trace per line, and an
        Observation only for a timeline the pool keeps (the first pass reads every line,
        so its per-line cost counts)."""
        rng = random.Random(seed)
        # randrange(n) for an int n > 0 is _randbelow(n): these bits, drawn the same way.
        getrandbits = rng.getrandbits
        pools: dict[tuple[str, str, str], list[Observation]] = {}
        # per (channel, region, transport): [timelines seen, pool, per status
        # [intervals seen, sample]]
        kept: dict[tuple[str, str, str], list[Any]] = {}
        inf = math.inf
        isinf = math.isinf
        channels: list[tuple[str, tuple[tuple[float, float, Status], ...], float, str]] = []
        fed: list[tuple[Status, tuple[float, float]]] = []
        for text in readable_lines(lines):
            if '"version":' not in text:
                continue
            channels.clear()
            try:
                data = json.loads(text)
                if data.get("version") != 2:
                    continue
                region = data.get("region", "default")
                transports = data.get("transport", {})
                for channel in CHANNELS:
                    raw_channel = data.get(channel)
                    if raw_channel is None:
                        continue
                    name = transports.get(channel, "outbox")
                    changes = tuple(
                        [
                            (after / 1000, by / 1000, normalized_status(name, raw))
                            for after, by, raw in raw_channel["seen"]
                        ]
                    )
                    channels.append((channel, changes, raw_channel["end_ms"] / 1000, name))
            except (ValueError, TypeError, KeyError, AttributeError, AssertionError):
                continue
            for channel, changes, end, name in channels:
                where = (channel, region, name)
                entry = kept.get(where)
                if entry is None:
                    entry = kept[where] = [0, [], {}]
                    pools[where] = entry[1]
                seen = entry[0] = entry[0] + 1
                pool = entry[1]
                if len(pool) < BORROW_POOL:
                    pool.append(Observation(changes, end, name))
                else:
                    bits = seen.bit_length()
                    slot = getrandbits(bits)
                    while slot >= seen:
                        slot = getrandbits(bits)
                    if slot < BORROW_POOL:
                        pool[slot] = Observation(changes, end, name)
                # Each status's first change, and for a final status never reached,
                # "after its end of observation" (right-censored), in a fixed order.
                first: dict[Status, tuple[float, float]] = {}
                for lo, hi, status in changes:
                    if status not in first:
                        first[status] = (lo, hi)
                fed.clear()
                for status, (lo, hi) in first.items():
                    fed.append((status, (lo, hi) if hi > lo else (hi - JUST_AFTER, hi)))
                missing = [status for status in FINAL_ORDER if status not in first]
                if missing:
                    is_open = not isinf(end) and (not changes or changes[-1][2] not in FINAL)
                    for status in missing:
                        if is_open:
                            fed.append((status, (end, inf)))
                        elif changes:
                            fed.append((status, (changes[-1][1], inf)))
                statuses = entry[2]
                for status, interval in fed:
                    counted = statuses.get(status)
                    if counted is None:
                        counted = statuses[status] = [0, []]
                    seen = counted[0] = counted[0] + 1
                    sample = counted[1]
                    if len(sample) < FIT_SAMPLE:
                        sample.append(interval)
                    else:
                        bits = seen.bit_length()
                        slot = getrandbits(bits)
                        while slot >= seen:
                            slot = getrandbits(bits)
                        if slot < FIT_SAMPLE:
                            sample[slot] = interval
        fits = {
            (*where, status): DelayFit(counted[1])
            for where, entry in kept.items()
            for status, counted in entry[2].items()
        }
        return cls(fits, pools, seed, tail_grace)

    def resolve(self, trace: Trace) -> Trace:
        """``trace`` with its timelines (and borrowed channels) filled in."""
        timelines, borrowed = self._resolved(trace)
        return Trace(
            trace.line,
            trace.trace_id,
            trace.region,
            trace.arrived_at,
            trace.ttl,
            timelines,
            borrowed,
            trace.observations,
            trace.version,
            trace.transports,
            trace.cancelled,
            _Alternatives(self, trace) if borrowed else _NO_ALTERNATIVES,
        )

    def _resolve_own(self, trace: Trace) -> Trace:
        """``resolve`` for a trace just parsed, that nothing else holds yet: filled in
        place rather than copied (a frozen dataclass copy costs a call per field)."""
        timelines, borrowed = self._resolved(trace)
        object.__setattr__(trace, "timelines", timelines)
        object.__setattr__(trace, "borrowed", borrowed)
        if borrowed:
            object.__setattr__(trace, "alternatives", _Alternatives(self, trace))
        return trace

    def _resolved(self, trace: Trace) -> tuple[_Resolved, frozenset[str]]:
        timelines: dict[str, Timelines | _Drawn] = {}
        borrowed: set[str] = set()
        for channel in CHANNELS:
            observed = trace.observations.get(channel)
            if observed is None:
                if trace.version == 1:
                    continue  # version 1: a channel without a timeline never answers
                borrowed.add(channel)
                observed = self._borrow(channel, trace)
                if observed is None:
                    # Nothing of this channel was ever observed: unknown, not silent.
                    observed = Observation((), 0.0, trace.transports.get(channel, "outbox"))
            timelines[channel] = self._draw(channel, trace.region, observed)
        return _Resolved(timelines), frozenset(borrowed) if borrowed else _NONE_BORROWED

    def _spread(self, stratum: tuple[Any, ...]) -> float:
        """The next uniform draw for changes like this one (same key, same interval to
        the second): a seeded golden-ratio sequence, so that over a few dozen intervals
        the share placed in any part of them is close to the fit's, not one lucky draw."""
        start = self._strata.get(stratum)
        if start is None:
            start = self.rng.random()
        self._strata[stratum] = (start + _GOLDEN) % 1.0
        return start

    def _pool(
        self, channel: str, region: str, transports: Mapping[str, str]
    ) -> Sequence[Observation] | None:
        """The observed timelines a trace of ``region`` borrows ``channel``'s from: its
        region's and transport's, else its region's, else the largest."""
        pool = self.pools.get((channel, region, transports.get(channel, "outbox")))
        if not pool:
            candidates = [
                p for (c, r, _), p in self.pools.items() if c == channel and r == region
            ] or [p for (c, _, _), p in self.pools.items() if c == channel]
            pool = max(candidates, key=len, default=None)
        return pool

    def _borrow(self, channel: str, trace: Trace) -> Observation | None:
        pool = self._pool(channel, trace.region, trace.transports)
        return self.rng.choice(pool) if pool else None

    def alternatives(
        self, channel: str, line: int, region: str, transports: Mapping[str, str]
    ) -> tuple[Timeline, ...]:
        """BORROW_DRAWS - 1 more borrowed timelines for the unused ``channel`` of the
        trace on ``line``, each the point estimate's reading of another observation.
        Drawn from a stream of their own, seeded by the line, so the main stream (and so
        every other figure) is the same whether or not they are ever asked for."""
        pool = self._pool(channel, region, transports)
        if not pool:
            return ()
        rng = random.Random(f"{self.seed}:{line}:{channel}")
        drawn = []
        for _ in range(BORROW_DRAWS - 1):
            observed = rng.choice(pool)
            if observed.exact:
                drawn.append(self.timelines(channel, region, observed)[POINT])
                continue
            draws = [rng.random() for lo, hi, _ in observed.changes if hi > lo]
            tail = None
            if observed.open:
                tail = []
                for status in (Status.DELIVERED, Status.FAILED):
                    fit = self.fits.get((channel, region, observed.transport, status))
                    if fit is not None:
                        tail.append((fit, status, rng.random(), rng.random()))
            built = _Drawn(
                self.fits, channel, region, observed, draws, tail, self.tail_grace
            ).build()
            drawn.append(built[POINT])
        return tuple(drawn)

    def timelines(self, channel: str, region: str, observed: Observation) -> Timelines:
        """(optimistic, pessimistic, point) timelines of one observed channel."""
        drawn = self._draw(channel, region, observed)
        return drawn if isinstance(drawn, tuple) else drawn.build()

    def _draw(self, channel: str, region: str, observed: Observation) -> Timelines | _Drawn:
        """The timelines of one observed channel, or for an inexact one the draws its
        point estimate takes: drawn now, in file order, so the random stream is the same
        whichever channels the simulation reads; the rest is worked out on first use
        (most fallback channels are never read)."""
        changes = observed.changes
        if observed.exact:
            exact = Timeline(
                tuple([change[1] for change in changes]), tuple([change[2] for change in changes])
            )
            return (exact, exact, exact)
        transport = observed.transport
        strata = self._strata
        draws: list[float] = []
        for lo, hi, status in changes:
            if hi > lo:
                # _spread, inline.
                stratum = (channel, region, transport, status, int(lo), int(hi))
                u = strata.get(stratum)
                if u is None:
                    u = self.rng.random()
                strata[stratum] = (u + _GOLDEN) % 1.0
                draws.append(u)
        tail: list[tuple[DelayFit, Status, float, float]] | None = None
        if observed.open:
            # What the fitted distributions say happens after the end of observation:
            # the earlier of a delivery and a failure, or nothing.
            tail = []
            for status in (Status.DELIVERED, Status.FAILED):
                fit = self.fits.get((channel, region, transport, status))
                if fit is None:
                    continue
                u = self._spread((channel, region, transport, status, "after"))
                tail.append((fit, status, u, self.rng.random()))
        return _Drawn(self.fits, channel, region, observed, draws, tail, self.tail_grace)


class _Drawn:
    """One inexact channel's draws, and its three timelines once asked for."""

    __slots__ = ("channel", "draws", "fits", "observed", "region", "tail", "tail_grace")

    def __init__(
        self,
        fits: Mapping[tuple[str, str, str, Status], DelayFit],
        channel: str,
        region: str,
        observed: Observation,
        draws: list[float],
        tail: list[tuple[DelayFit, Status, float, float]] | None,
        tail_grace: float,
    ) -> None:
        self.fits = fits
        self.channel = channel
        self.region = region
        self.observed = observed
        self.draws = draws
        self.tail = tail
        self.tail_grace = tail_grace

    def build(self) -> Timelines:
        observed = self.observed
        changes = observed.changes
        statuses = tuple([change[2] for change in changes])
        optimistic = [lo + JUST_AFTER if hi > lo else lo for lo, hi, _ in changes]
        pessimistic = tuple([change[1] for change in changes])
        point: list[float] = []
        fits = self.fits
        channel, region, transport = self.channel, self.region, observed.transport
        draws = iter(self.draws)
        for lo, hi, status in changes:
            at = hi
            if hi > lo:
                fit = fits.get((channel, region, transport, status))
                u = next(draws)
                at = fit.sample(lo, hi, u) if fit else lo + u * (hi - lo)
            point.append(max(at, point[-1]) if point else at)
        optimistic_statuses = point_statuses = statuses
        if self.tail is not None:
            # After the last read anything may happen: at best, success right away.
            optimistic.append(max(observed.end + self.tail_grace, *optimistic, 0.0))
            optimistic_statuses = (*statuses, Status.DELIVERED)
            best: tuple[float, Status] | None = None
            for fit, status, u, v in self.tail:
                after = fit.sample_after(observed.end, u, v)
                if after is not None and (best is None or after < best[0]):
                    best = (after, status)
            if best is not None:
                at, status = best
                point.append(max(at, point[-1]) if point else at)
                point_statuses = (*statuses, status)
        return (
            Timeline(tuple(optimistic), optimistic_statuses),
            Timeline(pessimistic, statuses),
            Timeline(tuple(point), point_statuses),
        )


class _Alternatives(Mapping[str, tuple[Timeline, ...]]):
    """A trace's other borrowed timelines by channel, drawn on first use (most notices
    never reach the channel they would borrow). It keeps what drawing them reads of the
    trace, not the trace: a trace that held this and was held by it would live on as a
    cycle until the garbage collector came by."""

    __slots__ = ("_drawn", "_key", "_resolver")

    def __init__(self, resolver: Resolver, trace: Trace) -> None:
        self._resolver = resolver
        self._key = (trace.line, trace.region, trace.transports, trace.borrowed)
        self._drawn: dict[str, tuple[Timeline, ...]] = {}

    def __getitem__(self, channel: str) -> tuple[Timeline, ...]:
        drawn = self._drawn.get(channel)
        if drawn is None:
            line, region, transports, borrowed = self._key
            if channel not in borrowed:
                raise KeyError(channel)
            drawn = self._resolver.alternatives(channel, line, region, transports)
            self._drawn[channel] = drawn
        return drawn

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._key[3]))

    def __len__(self) -> int:
        return len(self._key[3])


_NO_ALTERNATIVES: Mapping[str, tuple[Timeline, ...]] = {}


class _Resolved(Mapping[str, Timelines]):
    """A trace's timelines by channel, each worked out on first use."""

    __slots__ = ("_parts",)

    def __init__(self, parts: dict[str, Timelines | _Drawn]) -> None:
        self._parts = parts

    def __getitem__(self, channel: str) -> Timelines:
        part = self._parts[channel]
        if type(part) is _Drawn:
            part = self._parts[channel] = part.build()
        return part  # type: ignore[return-value]

    def get(self, channel: str, default: Any = None) -> Any:
        part = self._parts.get(channel)
        if part is None:
            return default
        if type(part) is _Drawn:
            part = self._parts[channel] = part.build()
        return part

    def __contains__(self, channel: object) -> bool:
        return channel in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __repr__(self) -> str:
        return repr(dict(self.items()))
