"""Replay de-identified timing traces through the real machine under a simulated clock.

Each trace is one reset: when it arrived, how long its link lived, and per channel what
the reads saw. A read shows a status some time after it happened, so a version-2 trace
gives each status change as an interval (after the last read that did not show it, up to
the first that did) and each channel's end of observation; a version-1 trace gives single
times, read as zero-width intervals observed for ever.

A discrete-event simulation models cron's cadence and phase, the in-minute
``--max-runtime`` loop (and its one-second look for new work), batch size, leases, the
time transport calls take and how late reads come after they fall due, and drives every
notice with the same transition function ``sweep`` uses. It has no rules of its own and
writes no database.

What the traces cannot say is reported rather than guessed: every figure comes as an
optimistic value (each change at its interval's start), a pessimistic one (at its end,
and nothing more after the end of observation) and a point estimate (changes drawn from
delay distributions fitted to all intervals of that channel, region and transport). A
channel a notice never used is unknown, not silent: its timeline is borrowed from the
observed ones of the same channel, region and transport, and the count is reported.
"""

from __future__ import annotations

import functools
import gc
import heapq
import itertools
import json
import math
import random
import statistics
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
TRACE_FIELDS = frozenset(
    {"version", "trace_id", "region", "arrived_at", "ttl", "transport", *CHANNELS}
)
HEADER_FIELDS = frozenset({"timings", "sweep_interval", "first_sweep_at", "read_lag"})
#: Expiry reasons that mean the link ran out of time before the next action could happen:
#: the notices an on-call engineer would have been paged about.
PAGING_REASONS = frozenset(
    {Reason.FALLBACK_RESERVE_NOT_MET, Reason.NO_USEFUL_TIME, Reason.LINK_EXPIRED}
)
#: The three readings of every trace: each change at its interval's start, at its end,
#: and drawn from the fitted delay distributions.
OPTIMISTIC, PESSIMISTIC, POINT = 0, 1, 2
SCENARIOS = ("optimistic", "pessimistic", "point")
ALL_SCENARIOS = 0b111
#: Statuses after which a channel has nothing more to say (it may still say "accepted"
#: then "delivered", so only these close a timeline).
FINAL = frozenset({Status.DELIVERED, Status.FAILED})
#: FINAL in a fixed order: fitting draws from a seeded stream, so the order it visits
#: statuses in must not depend on the interpreter's hash seed.
FINAL_ORDER = (Status.DELIVERED, Status.FAILED)
#: An as-yet-unobserved change placed at an interval's start sits this far after the read
#: that did not show it (that read itself must still not see it).
JUST_AFTER = 0.001
#: Per fitted key, at most this many intervals (a seeded reservoir) feed the estimator,
#: and at most this many observed timelines are kept to borrow from.
FIT_SAMPLE = 2000
BORROW_POOL = 500
#: An idle sweep with --max-runtime looks for newly due work this often (sweep.IDLE_POLL).
IDLE_POLL = 1.0


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
#: (optimistic, pessimistic, point) timelines of one channel
Timelines = tuple[Timeline, Timeline, Timeline]
NEVER_ANSWERS_3: Timelines = (NEVER_ANSWERS, NEVER_ANSWERS, NEVER_ANSWERS)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the reads of one channel saw: each status change as (after, by, status) in
    seconds from the submission, and the end of observation (math.inf: for ever)."""

    changes: tuple[tuple[float, float, Status], ...]
    end: float
    transport: str

    @property
    def exact(self) -> bool:
        """True when every change time is known (a version-1 timeline)."""
        return math.isinf(self.end) and all(lo == hi for lo, hi, _ in self.changes)

    @property
    def open(self) -> bool:
        """True when the channel might still change after its end of observation."""
        return not math.isinf(self.end) and (not self.changes or self.changes[-1][2] not in FINAL)


@dataclass(frozen=True, slots=True)
class Trace:
    """One reset's timing, with no notice id, account, contact data or URL."""

    line: int
    trace_id: str
    region: str
    arrived_at: float
    ttl: float
    #: per channel: (optimistic, pessimistic, point) timelines
    timelines: Mapping[str, Timelines]
    #: channels the notice never used whose timeline was borrowed
    borrowed: frozenset[str] = frozenset()
    #: the observations as read (before timelines are resolved)
    observations: Mapping[str, Observation] = field(default_factory=dict)
    #: 1 (single times, complete timelines) or 2 (intervals, ends of observation)
    version: int = 1
    #: per channel, the transport named for it
    transports: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Header:
    """A trace file's header: what export-timings measured about production's reads."""

    #: seconds between cron starts
    sweep_interval: float | None = None
    #: seconds from the first arrival to the first cron start
    first_sweep_at: float | None = None
    #: median and 90th percentile of the lag from a read's due time to the read
    read_lag_p50: float | None = None
    read_lag_p90: float | None = None


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


@functools.lru_cache(maxsize=4096)
def _normalized(name: str, raw: str) -> Status:
    # The transport's own mapping, once per (transport, raw status), not once per change;
    # read as the live path records it, so an exported unknown:<length> is unknown.
    vocabulary = _vocabulary(name)
    assert vocabulary is not None
    return vocabulary.reading(raw)[1]


#: the C scanner json.loads runs, and the whitespace it skips around a document
_SCAN: Callable[[str, int], tuple[Any, int]] = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009
_SPACE: Callable[[str, int], Any] = getattr(json.decoder, "WHITESPACE").match  # noqa: B009


def _loads(text: str) -> Any:
    """``json.loads`` of one line without its per-call wrappers (both passes read every
    line); anything unusual is read by ``json.loads`` itself, errors and all."""
    try:
        value, end = _SCAN(text, _SPACE(text, 0).end())
    except Exception:
        return json.loads(text)
    if _SPACE(text, end).end() != len(text):
        return json.loads(text)
    return value


def parse_header(data: Mapping[str, Any], line: int) -> Header:
    """The header line export-timings writes first; raises InputError on a bad field."""

    def seconds(key: str, value: object) -> float:
        number = _number(value)
        if number is None or number < 0:
            raise InputError([f"line {line}: {key}: expected seconds (≥ 0)"])
        return number

    for key in data:
        if key not in HEADER_FIELDS:
            raise InputError([f"line {line}: {label(key)}: unknown header field"])
    if data.get("timings") not in (1, 2):
        raise InputError([f"line {line}: timings: unsupported trace format version"])
    interval = data.get("sweep_interval")
    first = data.get("first_sweep_at")
    lag = data.get("read_lag", {})
    if not isinstance(lag, dict):
        raise InputError([f"line {line}: read_lag: expected an object"])
    p50, p90 = lag.get("p50"), lag.get("p90")
    return Header(
        None if interval is None else seconds("sweep_interval", interval) or None,
        None if first is None else seconds("first_sweep_at", first),
        None if p50 is None else seconds("read_lag.p50", p50),
        None if p90 is None else seconds("read_lag.p90", p90),
    )


def parse_trace(
    text: str,
    line: int,
    previous_arrival: float,
    unknown: Counter[tuple[str, str, str]],
    data: Any = None,
) -> Trace:
    """One JSON line of a trace file (versions 1 and 2), with its observations read but
    its timelines not yet resolved; raises InputError naming the line and field."""

    def bad(field_name: str, problem: str) -> InputError:
        return InputError([f"line {line}: {field_name}: {problem}"])

    if data is None:
        try:
            data = _loads(text)
        except json.JSONDecodeError as exc:
            raise bad("(line)", f"not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError):
            raise bad("(line)", "a number or nesting too large to read") from None
    trace = _parse_well_formed(data, line, previous_arrival, unknown)
    if trace is not None:
        return trace
    if not isinstance(data, dict):
        raise bad("(line)", "expected a JSON object")
    for key in data:
        if key not in TRACE_FIELDS:
            shown = label(key)
            if shown == key:
                raise bad(key, "unknown field")
            raise bad("(field)", f"unknown field {shown}")
    version = data.get("version", 1)
    if version not in (1, 2) or isinstance(version, bool):
        raise bad("version", "expected 1 or 2")
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
    observations: dict[str, Observation] = {}
    names: dict[str, str] = {}
    for channel in CHANNELS:
        name = transports.get(channel, "outbox")
        vocabulary = _vocabulary(name) if isinstance(name, str) else None
        if vocabulary is None:
            raise bad(f"transport.{channel}", f"unknown transport {name!r}")
        assert isinstance(name, str)
        names[channel] = name
        raw_timeline = data.get(channel)
        if raw_timeline is None:
            continue
        if version == 1:
            changes = _v1_changes(raw_timeline, channel, bad, vocabulary, name, unknown)
            observations[channel] = Observation(changes, math.inf, name)
        else:
            observations[channel] = _v2_observation(
                raw_timeline, channel, bad, vocabulary, name, unknown
            )
    return Trace(
        line, trace_id, region, arrived_at, ttl, {}, frozenset(), observations, version, names
    )


def _plain_number(value: object) -> float | None:
    """``_number`` for the plain ints and floats JSON gives (None for anything else)."""
    kind = type(value)
    if kind is float:
        return value if value - value == 0.0 else None  # type: ignore[operator,return-value]
    if kind is int:
        try:
            return float(value)  # type: ignore[arg-type]
        except OverflowError:
            return None
    return None


_V2_KEYS = frozenset({"seen", "end_ms"})
_NONE_BORROWED: frozenset[str] = frozenset()
#: ints below this convert to float exactly (and never overflow)
_EXACT = 2**53


def _parse_well_formed(
    data: object, line: int, previous_arrival: float, unknown: Counter[tuple[str, str, str]]
) -> Trace | None:
    """``parse_trace``'s result for a line with nothing wrong with it, in plain JSON types;
    None (having counted nothing) for anything else, which the full checks then read and
    report. The second pass reads every line, so the common case is kept short."""
    if type(data) is not dict or not TRACE_FIELDS.issuperset(data):
        return None
    get = data.get
    version = get("version", 1)
    if type(version) is not int or (version != 1 and version != 2):
        return None
    trace_id = get("trace_id")
    region = get("region", "default")
    if type(trace_id) is not str or not trace_id or type(region) is not str or not region:
        return None
    arrived_at = _plain_number(get("arrived_at"))
    if arrived_at is None or arrived_at < 0 or arrived_at < previous_arrival:
        return None
    ttl = _plain_number(get("ttl"))
    if ttl is None or ttl <= 0:
        return None
    transports = get("transport", {})
    if type(transports) is not dict:
        return None
    observations: dict[str, Observation] = {}
    names: dict[str, str] = {}
    unrecognized: list[tuple[str, str, str]] = []
    for channel in CHANNELS:
        name = transports.get(channel, "outbox")
        if type(name) is not str:
            return None
        vocabulary = _vocabulary(name)
        if vocabulary is None:
            return None
        names[channel] = name
        raw_timeline = get(channel)
        if raw_timeline is None:
            continue
        known = vocabulary.known
        changes: list[tuple[float, float, Status]] = []
        if version == 1:
            if type(raw_timeline) is not list:
                return None
            for pair in raw_timeline:
                if type(pair) is not list or len(pair) != 2:
                    return None
                offset = _plain_number(pair[0])
                raw = pair[1]
                if offset is None or offset < 0 or type(raw) is not str:
                    return None
                if changes and offset < changes[-1][1]:
                    return None
                if raw not in known:
                    unrecognized.append((name, channel, raw))
                changes.append((offset, offset, _normalized(name, raw)))
            observations[channel] = Observation(tuple(changes), math.inf, name)
            continue
        if type(raw_timeline) is not dict or not _V2_KEYS.issuperset(raw_timeline):
            return None
        seen = raw_timeline.get("seen", [])
        if type(seen) is not list:
            return None
        by: Any = 0.0
        for item in seen:
            if type(item) is not list or len(item) != 3:
                return None
            after, by, raw = item
            # _plain_number, inline: milliseconds are mostly ints.
            if type(after) is int and -_EXACT < after < _EXACT:
                after = float(after)
            elif type(after) is not float or after - after != 0.0:
                return None
            if type(by) is int and -_EXACT < by < _EXACT:
                by = float(by)
            elif type(by) is not float or by - by != 0.0:
                return None
            if after < 0 or by < after or type(raw) is not str:
                return None
            # (As _v2_observation compares: milliseconds against the previous seconds.)
            if changes and by < changes[-1][1]:
                return None
            if raw not in known:
                unrecognized.append((name, channel, raw))
            changes.append((after / 1000, by / 1000, _normalized(name, raw)))
        end = _plain_number(raw_timeline.get("end_ms"))
        if end is None or end < 0 or end < (by or 0.0):
            return None
        observations[channel] = Observation(tuple(changes), end / 1000, name)
    for key in unrecognized:
        unknown[key] += 1
    return Trace(
        line, trace_id, region, arrived_at, ttl, {}, frozenset(), observations, version, names
    )


def _v1_changes(
    raw_timeline: object,
    channel: str,
    bad: Callable[[str, str], InputError],
    vocabulary: StatusVocabulary,
    name: str,
    unknown: Counter[tuple[str, str, str]],
) -> tuple[tuple[float, float, Status], ...]:
    if not isinstance(raw_timeline, list):
        raise bad(channel, "expected a list of [seconds, status] pairs")
    changes: list[tuple[float, float, Status]] = []
    for index, pair in enumerate(raw_timeline):
        where = f"{channel}[{index}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise bad(where, "expected [seconds_after_submission, raw_status]")
        offset, raw = _number(pair[0]), pair[1]
        if offset is None or offset < 0:
            raise bad(where, "expected seconds (≥ 0) after submission")
        if changes and offset < changes[-1][1]:
            raise bad(where, "timeline offsets must not decrease")
        if not isinstance(raw, str):
            raise bad(where, "expected a raw status string")
        if raw not in vocabulary.known:
            unknown[(name, channel, raw)] += 1
        changes.append((offset, offset, _normalized(name, raw)))
    return tuple(changes)


def _v2_observation(
    raw_channel: object,
    channel: str,
    bad: Callable[[str, str], InputError],
    vocabulary: StatusVocabulary,
    name: str,
    unknown: Counter[tuple[str, str, str]],
) -> Observation:
    if not isinstance(raw_channel, dict) or set(raw_channel) - {"seen", "end_ms"}:
        raise bad(channel, 'expected {"seen": [[after_ms, by_ms, raw_status], …], "end_ms": …}')
    seen = raw_channel.get("seen", [])
    if not isinstance(seen, list):
        raise bad(f"{channel}.seen", "expected a list of [after_ms, by_ms, raw_status]")
    changes: list[tuple[float, float, Status]] = []
    for index, item in enumerate(seen):
        where = f"{channel}.seen[{index}]"
        if not isinstance(item, list) or len(item) != 3:
            raise bad(where, "expected [after_ms, by_ms, raw_status]")
        after, by, raw = _number(item[0]), _number(item[1]), item[2]
        if after is None or by is None or after < 0 or by < after:
            raise bad(where, "expected milliseconds 0 ≤ after_ms ≤ by_ms")
        if changes and by < changes[-1][1]:
            raise bad(where, "timeline offsets must not decrease")
        if not isinstance(raw, str):
            raise bad(where, "expected a raw status string")
        if raw not in vocabulary.known:
            unknown[(name, channel, raw)] += 1
        changes.append((after / 1000, by / 1000, _normalized(name, raw)))
    end = _number(raw_channel.get("end_ms"))
    last_by = _number(seen[-1][1]) if changes else 0.0
    if end is None or end < 0 or end < (last_by or 0.0):
        raise bad(f"{channel}.end_ms", "expected milliseconds ≥ the last by_ms")
    return Observation(tuple(changes), end / 1000, name)


def read_traces(
    lines: Iterable[str],
    unknown: Counter[tuple[str, str, str]],
    resolver: Resolver | None = None,
    headers: list[Header] | None = None,
) -> Iterator[Trace]:
    """Parse a trace file lazily, checking arrival order; blank lines are skipped, a
    header line (first) goes to ``headers``. Timelines are resolved by ``resolver``
    (default: no fitted distributions and nothing to borrow from)."""
    resolve = (resolver or Resolver())._resolve_own
    previous = 0.0
    source = iter(lines)
    number = 0
    first = True
    while True:
        number += 1
        try:
            text = next(source)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise InputError([f"line {number}: (line): not UTF-8 text"]) from None
        if not text or text.isspace():
            continue
        data = None
        if first and text.lstrip().startswith('{"timings"'):
            data = json.loads(text)
        if first and isinstance(data, dict) and "timings" in data:
            header = parse_header(data, number)
            if headers is not None:
                headers.append(header)
            first = False
            continue
        first = False
        trace = resolve(parse_trace(text, number, previous, unknown, data))
        previous = trace.arrived_at
        yield trace


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
    """

    __slots__ = ("_cdfs", "mu", "never", "sigma")

    def __init__(self, intervals: Sequence[tuple[float, float]]) -> None:
        # Whole seconds are plenty for a shape: group the intervals so the grid is cheap.
        groups: Counter[tuple[float, float]] = Counter(
            (float(max(math.floor(lo), 0)), math.inf if math.isinf(hi) else max(math.ceil(hi), 1.0))
            for lo, hi in intervals
        )
        self.mu, self.sigma, self.never = 0.0, 1.0, 1.0
        # The fitted CDF by time: reads on one schedule bring the same bounds back often.
        self._cdfs: dict[float, float] = {}
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
        """A time after ``end`` given nothing happened by then, or None for never."""
        survive = 1 - self._fitted_cdf(end)
        comes = (1 - self.never) * survive
        if comes <= 0 or u * (self.never + comes) >= comes:
            return None
        low = 1 - survive
        w = min(low + v * survive, 1 - 1e-12)
        return max(end, math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(max(w, 1e-12))))


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
        loads = _loads
        inf = math.inf
        isinf = math.isinf
        channels: list[tuple[str, tuple[tuple[float, float, Status], ...], float, str]] = []
        fed: list[tuple[Status, tuple[float, float]]] = []
        for text in _readable(lines):
            if '"version":' not in text:
                continue
            channels.clear()
            try:
                data = loads(text)
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
                            (after / 1000, by / 1000, _normalized(name, raw))
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
        )

    def _resolve_own(self, trace: Trace) -> Trace:
        """``resolve`` for a trace just parsed, that nothing else holds yet: filled in
        place rather than copied (a frozen dataclass copy costs a call per field)."""
        timelines, borrowed = self._resolved(trace)
        object.__setattr__(trace, "timelines", timelines)
        object.__setattr__(trace, "borrowed", borrowed)
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

    def _borrow(self, channel: str, trace: Trace) -> Observation | None:
        pool = self.pools.get((channel, trace.region, trace.transports.get(channel, "outbox")))
        if not pool:
            candidates = [
                p for (c, r, _), p in self.pools.items() if c == channel and r == trace.region
            ] or [p for (c, _, _), p in self.pools.items() if c == channel]
            pool = max(candidates, key=len, default=None)
        return self.rng.choice(pool) if pool else None

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


def _readable(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` up to the first that is not text: a pass that only looks ahead stops
    there, and the pass that checks every line reports it."""
    source = iter(lines)
    while True:
        try:
            yield next(source)
        except (StopIteration, UnicodeDecodeError):
            return


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
    #: seconds from the first arrival to the first cron start (the cron phase)
    first_sweep_at: float = 0.0
    #: seconds from a status read's due time to the read
    read_lag: float = 0.0


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted ``values`` (None when empty)."""
    if not values:
        return None
    rank = max(1, math.ceil(fraction * len(values)))
    return float(values[rank - 1])


@dataclass(slots=True)
class ReplayStats:
    """Counters and samples gathered over one candidate's simulation (one reading)."""

    notices: int = 0
    accepted: int = 0
    accepted_primary: int = 0
    escalated: int = 0
    expired: int = 0
    failed: int = 0
    both_channels: int = 0
    late_primary_after_fallback: int = 0
    #: of those, the ones every placement within the intervals agrees on, and the ones
    #: some placement (or what came after the last read) allows
    late_primary_certain: int = 0
    late_primary_possible: int = 0
    status_reads: int = 0
    would_page: int = 0
    sent: Counter[str] = field(default_factory=Counter)
    #: notices that submitted on a channel whose timeline was borrowed
    borrowed: Counter[str] = field(default_factory=Counter)
    remaining_at_fallback: array[float] = field(default_factory=lambda: array("d"))
    time_to_acceptance: array[float] = field(default_factory=lambda: array("d"))
    queue_delay: array[float] = field(default_factory=lambda: array("d"))


def _bits(mask: int) -> tuple[int, ...]:
    return _BITS[mask]


_BITS = tuple(tuple(s for s in range(3) if mask >> s & 1) for mask in range(8))


class _Live:
    """A notice in flight in the simulation, for the readings in ``mask``."""

    __slots__ = (
        "fallback_at",
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

    def fork(self, mask: int) -> _Live:
        """A copy for the readings in ``mask``, which saw something else from here on."""
        twin = _Live(self.trace, self.policy, self.state, mask)
        twin.submitted_at = dict(self.submitted_at)
        twin.fallback_at = self.fallback_at
        twin.reads = self.reads
        twin.sent = dict(self.sent)
        self.mask &= ~mask
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
        self._phase = options.first_sweep_at % options.sweep_interval
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
                # Idle: skip cron ticks that would find nothing to do.
                interval = self.options.sweep_interval
                tick = self._phase + math.ceil((limit - self._phase) / interval) * interval
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
            while due and due[0][0] <= clock and len(batch) < size:
                batch.append(pop(due)[2])
            lease_end = clock + self.lease
            for live in batch:
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
        while True:
            if not decision.due(clock) or clock >= stop:
                self._park(live, decision, clock)
                return clock
            channel = decision.channel
            assert channel is not None
            if decision.action is ActionKind.SUBMIT:
                clock, decision = self._submit(live, decision.phase, channel, clock)
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
            if decision.phase.terminal:
                self._park(twin, decision, clock)
            else:
                self._push(clock, twin)  # decides afresh, now, as the loop would
        return kept

    def _submit(
        self, live: _Live, phase: Phase, channel: str, clock: float
    ) -> tuple[float, Decision]:
        old = live.state
        state = NoticeState(old.notice_id, phase, old.expires_at, old.channels, old.attempts)
        readings = self._stats[live.mask]
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

    def _record_end(self, live: _Live, reason: Reason, clock: float) -> None:
        trace = live.trace
        phase = live.state.phase
        primary = live.state.channels[0]
        both = len(live.sent) > 1
        reads = live.reads
        if live.fallback_at is not None:
            success = live.policy.success[Channel(primary)]
            timelines = trace.timelines.get(primary, NEVER_ANSWERS_3)
            # (The same for every reading: it reads the intervals themselves.)
            certain, possible = late_primary(live, primary, success)
            for reading in _bits(live.mask):
                stats = self.readings[reading]
                stats.escalated += 1
                stats.remaining_at_fallback.append(live.state.expires_at - live.fallback_at)
                first_success = timelines[reading].first_success(success)
                if first_success is not None:
                    arrives = live.submitted_at[primary] + first_success
                    if live.fallback_at < arrives < live.state.expires_at:
                        stats.late_primary_after_fallback += 1
                stats.late_primary_certain += certain
                stats.late_primary_possible += possible
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
        if self.on_end is not None and live.mask >> POINT & 1:
            self.on_end(trace, live.state, Counter(live.sent))


def late_primary(live: _Live, primary: str, success: frozenset[str]) -> tuple[bool, bool]:
    """Whether the primary's success came after the fallback and before expiry: certainly
    (its whole interval lies there), and possibly (some of it does, or the primary was
    still open at its last read, before expiry). Not monotone in when changes happened,
    so neither reading alone bounds it."""
    assert live.fallback_at is not None
    observed = live.trace.observations.get(primary)
    if observed is None or primary in live.trace.borrowed:
        timeline = live.trace.timelines.get(primary, NEVER_ANSWERS_3)[POINT]
        at = timeline.first_success(success)
        late = at is not None and (
            live.fallback_at < live.submitted_at[primary] + at < live.state.expires_at
        )
        return late, late
    after = live.fallback_at - live.submitted_at[primary]
    before = live.state.expires_at - live.submitted_at[primary]
    for lo, hi, status in observed.changes:
        if status in success:
            return after <= lo and hi < before, lo < before and hi > after
        if status is Status.FAILED and hi <= after:
            return False, False
    return False, observed.open and observed.end < before


#: Figures reported as a range (optimistic to pessimistic, point estimate included).
COUNTS = (
    "accepted",
    "accepted_primary",
    "escalated",
    "expired",
    "failed",
    "both_channels",
    "late_primary_after_fallback",
    "status_reads",
    "would_page",
)


def _figures(s: ReplayStats) -> dict[str, Any]:
    remaining = sorted(s.remaining_at_fallback)
    accepted = sorted(s.time_to_acceptance)
    delays = sorted(s.queue_delay)
    return {
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
        "borrowed": {channel: s.borrowed.get(channel, 0) for channel in CHANNELS},
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
class PolicyReport:
    """One candidate's outcome over the whole trace file, under each reading."""

    policy: str
    stats: ReplayStats
    optimistic: ReplayStats = field(default_factory=ReplayStats)
    pessimistic: ReplayStats = field(default_factory=ReplayStats)

    def ranges(self) -> dict[str, list[float]]:
        """Per count figure (and messages per channel), [low, high] over the readings."""
        figures = [_figures(s) for s in (self.optimistic, self.pessimistic, self.stats)]
        ranges: dict[str, list[float]] = {}
        for key in COUNTS:
            values = [f[key] for f in figures]
            ranges[key] = [min(values), max(values)]
        readings = (self.optimistic, self.pessimistic, self.stats)
        ranges["late_primary_after_fallback"] = [
            min(s.late_primary_certain for s in readings),
            max(s.late_primary_possible for s in readings),
        ]
        for channel in CHANNELS:
            values = [f["messages_sent"][channel] for f in figures]
            ranges[f"messages_sent.{channel}"] = [min(values), max(values)]
        return ranges

    def to_json(self) -> dict[str, Any]:
        """The public ``--json`` shape (snake_case keys): the point estimate's figures,
        their ``range`` and each reading's figures under ``optimistic``/``pessimistic``."""
        return {
            "policy": self.policy,
            **_figures(self.stats),
            "range": self.ranges(),
            "optimistic": _figures(self.optimistic),
            "pessimistic": _figures(self.pessimistic),
        }


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Every candidate's report, plus the raw statuses no transport recognized."""

    reports: list[PolicyReport]
    unknown_statuses: Counter[tuple[str, str, str]]
    #: the trace file's header (defaults when it has none)
    header: Header = field(default_factory=Header)
    #: traces by format version
    versions: Counter[int] = field(default_factory=Counter)


def read_header(lines: Iterable[str]) -> Header:
    """The header of a trace file (its first non-blank line), or defaults."""
    for text in _readable(lines):
        if not text.strip():
            continue
        if text.lstrip().startswith('{"timings"'):
            try:
                data = json.loads(text)
            except ValueError:
                return Header()
            if isinstance(data, dict):
                return parse_header(data, 1)
        return Header()
    return Header()


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


def with_header(
    options: SimulationOptions, header: Header, **given: float | None
) -> SimulationOptions:
    """``options`` with the cron phase and read lag the header measured, unless given."""
    sweep_interval = given.get("sweep_interval") or header.sweep_interval or options.sweep_interval
    first = header.first_sweep_at if header.first_sweep_at is not None else options.first_sweep_at
    lag = given.get("read_lag")
    if lag is None:
        lag = header.read_lag_p50 if header.read_lag_p50 is not None else options.read_lag
    return SimulationOptions(
        sweep_interval=sweep_interval,
        max_runtime=options.max_runtime,
        call_time=options.call_time,
        batch_size=options.batch_size,
        lease=options.lease,
        first_sweep_at=first,
        read_lag=lag,
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
