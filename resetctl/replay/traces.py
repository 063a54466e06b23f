"""The trace format: reading a trace file, and writing one from the database.

A trace holds a reset's region, arrival (seconds from the first exported notice), link
lifetime and, per channel its notice used, what the reads saw. A read shows a status some
time after it happened, so a version-2 trace gives each status change as the interval it
is known to lie in: after the last read that did not show it, up to the first read that
did, in milliseconds from that channel's submission, not rounded. Each channel also
carries its end of observation (the last read): after it, nothing is known. A channel the
notice never used is absent, which replay treats as unknown, never as silent. A version-1
trace gives single times, read as zero-width intervals observed for ever. A notice the
application cancelled says when, in milliseconds from its arrival, and why (either
version): that time is exact, as the cancel's own write recorded it.

The first line is a header with what replay needs to place its reads where production
made them: when the first cron minute came after the first arrival, how long after its
minute a sweep started, and how late reads were after they fell due. Trace ids are
sequence numbers: nothing maps them back to notices.
"""

from __future__ import annotations

import functools
import json
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resetctl.errors import InputError, label
from resetctl.machine import CANCEL_REASONS, Phase, Reason, Status
from resetctl.policy import MAX_LIFETIME, Policy
from resetctl.transports import StatusVocabulary, status_vocabulary

if TYPE_CHECKING:
    # Only read from, by export_timings: replay never opens or writes a database.
    from resetctl.store import Store

CHANNELS = ("email", "sms")
TRACE_FIELDS = frozenset(
    {"version", "trace_id", "region", "arrived_at", "ttl", "transport", "cancelled", *CHANNELS}
)
#: A cancel's reason by the word a trace gives it.
CANCEL_WORDS: Mapping[str, Reason] = {reason.value: reason for reason in CANCEL_REASONS}
HEADER_FIELDS = frozenset(
    {"timings", "sweep_interval", "first_sweep_at", "read_lag", "sweep_start"}
)
_SWEEP_START_FIELDS = frozenset({"p50", "p90", "sweeps"})

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
    #: when the application cancelled the notice (seconds after arrival) and why, if it did
    cancelled: tuple[float, Reason] | None = None
    #: per borrowed channel, more borrowed timelines (the point estimate's readings of
    #: other observations), that the range's envelope runs over
    alternatives: Mapping[str, tuple[Timeline, ...]] = field(default_factory=dict)


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
    #: median and 90th percentile of how long after its cron minute a sweep started
    sweep_start_p50: float | None = None
    sweep_start_p90: float | None = None


#: ints below this convert to float exactly (and never overflow)
_EXACT = 2**53
#: Bounds on what a trace may say: a file spans at most this long (arrivals, seconds),
#: a link lives at most MAX_LIFETIME, and a cron interval or a read lag is between
#: these. Past them a number is a mistake or an attack (1e300 stalls the simulated clock).
MAX_SPAN = 400 * 86400.0
MIN_SWEEP_INTERVAL = 1.0
MAX_SWEEP_INTERVAL = 3600.0
MAX_READ_LAG = 3600.0
#: A sweep starts at most this long after its cron minute (seconds): cron's own latency.
MAX_SWEEP_START = 60.0


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None: JSON numbers (never booleans) that fit."""
    # Floats and small ints first: nearly every number a trace holds is one.
    if type(value) is float:
        return value if value - value == 0.0 else None
    if type(value) is int and -_EXACT < value < _EXACT:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


_V2_KEYS = frozenset({"seen", "end_ms"})


def _bad(line: int, field_name: str, problem: str) -> InputError:
    return InputError([f"line {line}: {field_name}: {problem}"])


@functools.lru_cache(maxsize=64)
def _vocabulary(name: str) -> StatusVocabulary | None:
    # Looked up once per transport name, not once per line.
    return status_vocabulary(name)


@functools.lru_cache(maxsize=4096)
def normalized_status(name: str, raw: str) -> Status:
    """The transport's own reading of ``raw``, as the live path records it (so an
    exported ``unknown:<length>`` is unknown); once per (transport, raw status)."""
    vocabulary = _vocabulary(name)
    assert vocabulary is not None
    return vocabulary.reading(raw)[1]


def parse_header(data: Mapping[str, Any], line: int) -> Header:
    """The header line export-timings writes first; raises InputError on a bad field."""

    def seconds(key: str, value: object, low: float = 0.0, high: float = MAX_SPAN) -> float:
        number = _number(value)
        if number is None or not low <= number <= high:
            raise InputError([f"line {line}: {key}: expected seconds from {low:g} to {high:g}"])
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
    start = data.get("sweep_start", {})
    if not isinstance(start, dict):
        raise InputError([f"line {line}: sweep_start: expected an object"])
    for key in start:
        if key not in _SWEEP_START_FIELDS:
            raise InputError([f"line {line}: sweep_start.{label(key)}: unknown field"])
    sweeps = start.get("sweeps", 0)
    if type(sweeps) is not int or sweeps < 0:
        raise InputError([f"line {line}: sweep_start.sweeps: expected a whole number ≥ 0"])
    start_p50, start_p90 = start.get("p50"), start.get("p90")
    return Header(
        None
        if interval is None
        else seconds("sweep_interval", interval, MIN_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL),
        None if first is None else seconds("first_sweep_at", first, high=MAX_SWEEP_INTERVAL),
        None if p50 is None else seconds("read_lag.p50", p50, high=MAX_READ_LAG),
        None if p90 is None else seconds("read_lag.p90", p90, high=MAX_READ_LAG),
        None if start_p50 is None else seconds("sweep_start.p50", start_p50, high=MAX_SWEEP_START),
        None if start_p90 is None else seconds("sweep_start.p90", start_p90, high=MAX_SWEEP_START),
    )


def parse_trace(
    text: str,
    line: int,
    previous_arrival: float,
    unknown: Counter[tuple[str, str, str]],
    data: Any = None,
) -> Trace:
    """One JSON line of a trace file (versions 1 and 2), with its observations read but
    its timelines not yet resolved; raises InputError naming the line and field.

    The checks run in the order their errors are reported, the first failing one wins.
    Replay reads every line here, so a message is only built once a check has failed."""
    if data is None:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _bad(line, "(line)", f"not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError):
            raise _bad(line, "(line)", "a number or nesting too large to read") from None
    if not isinstance(data, dict):
        raise _bad(line, "(line)", "expected a JSON object")
    if not TRACE_FIELDS.issuperset(data):
        for key in data:
            if key not in TRACE_FIELDS:
                shown = label(key)
                if shown == key:
                    raise _bad(line, key, "unknown field")
                raise _bad(line, "(field)", f"unknown field {shown}")
    get = data.get
    version = get("version", 1)
    if version not in (1, 2) or isinstance(version, bool):
        raise _bad(line, "version", "expected 1 or 2")
    trace_id = get("trace_id")
    if not isinstance(trace_id, str) or not trace_id:
        raise _bad(line, "trace_id", "expected a non-empty string")
    region = get("region", "default")
    if not isinstance(region, str) or not region:
        raise _bad(line, "region", "expected a non-empty string")
    arrived_at = _number(get("arrived_at"))
    if arrived_at is None or not 0 <= arrived_at <= MAX_SPAN:
        raise _bad(
            line,
            "arrived_at",
            f"expected seconds from 0 to {MAX_SPAN:g} from the start of the trace",
        )
    if arrived_at < previous_arrival:
        raise _bad(line, "arrived_at", "traces must be sorted by arrival")
    ttl = _number(get("ttl"))
    if ttl is None or not 0 < ttl <= MAX_LIFETIME:
        raise _bad(line, "ttl", f"expected a positive number of seconds up to {MAX_LIFETIME:g}")
    transports = get("transport", {})
    if not isinstance(transports, dict):
        raise _bad(line, "transport", 'expected an object such as {"email": "postmark"}')
    raw_cancel = get("cancelled")
    cancelled = None if raw_cancel is None else _cancelled(raw_cancel, line)
    observations: dict[str, Observation] = {}
    names: dict[str, str] = {}
    for channel in CHANNELS:
        name = transports.get(channel, "outbox")
        vocabulary = _vocabulary(name) if isinstance(name, str) else None
        if vocabulary is None:
            raise _bad(line, f"transport.{channel}", f"unknown transport {name!r}")
        names[channel] = name
        raw_timeline = get(channel)
        if raw_timeline is None:
            continue
        if version == 1:
            changes = _v1_changes(raw_timeline, line, channel, vocabulary, name, unknown)
            observations[channel] = Observation(changes, math.inf, name)
        else:
            observations[channel] = _v2_observation(
                raw_timeline, line, channel, vocabulary, name, unknown
            )
    return Trace(
        line,
        trace_id,
        region,
        arrived_at,
        ttl,
        {},
        frozenset(),
        observations,
        version,
        names,
        cancelled,
    )


def _cancelled(raw: object, line: int) -> tuple[float, Reason]:
    """``[after_ms, reason]``: milliseconds from arrival to the cancel, and its reason."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise _bad(line, "cancelled", "expected [after_ms, reason]")
    after = _number(raw[0])
    if after is None or after < 0:
        raise _bad(line, "cancelled[0]", "expected milliseconds (≥ 0) after arrival")
    reason = CANCEL_WORDS.get(raw[1]) if isinstance(raw[1], str) else None
    if reason is None:
        choices = ", ".join(CANCEL_WORDS)
        raise _bad(line, "cancelled[1]", f"expected a cancel reason: one of {choices}")
    return after / 1000, reason


def _v1_changes(
    raw_timeline: object,
    line: int,
    channel: str,
    vocabulary: StatusVocabulary,
    name: str,
    unknown: Counter[tuple[str, str, str]],
) -> tuple[tuple[float, float, Status], ...]:
    if not isinstance(raw_timeline, list):
        raise _bad(line, channel, "expected a list of [seconds, status] pairs")
    known = vocabulary.known
    changes: list[tuple[float, float, Status]] = []
    for index, pair in enumerate(raw_timeline):
        if not isinstance(pair, list) or len(pair) != 2:
            where = f"{channel}[{index}]"
            raise _bad(line, where, "expected [seconds_after_submission, raw_status]")
        offset, raw = _number(pair[0]), pair[1]
        if offset is None or offset < 0:
            raise _bad(line, f"{channel}[{index}]", "expected seconds (≥ 0) after submission")
        if changes and offset < changes[-1][1]:
            raise _bad(line, f"{channel}[{index}]", "timeline offsets must not decrease")
        if not isinstance(raw, str):
            raise _bad(line, f"{channel}[{index}]", "expected a raw status string")
        if raw not in known:
            unknown[(name, channel, raw)] += 1
        changes.append((offset, offset, normalized_status(name, raw)))
    return tuple(changes)


def _v2_observation(
    raw_channel: object,
    line: int,
    channel: str,
    vocabulary: StatusVocabulary,
    name: str,
    unknown: Counter[tuple[str, str, str]],
) -> Observation:
    if not isinstance(raw_channel, dict) or not _V2_KEYS.issuperset(raw_channel):
        problem = 'expected {"seen": [[after_ms, by_ms, raw_status], …], "end_ms": …}'
        raise _bad(line, channel, problem)
    seen = raw_channel.get("seen", [])
    if not isinstance(seen, list):
        problem = "expected a list of [after_ms, by_ms, raw_status]"
        raise _bad(line, f"{channel}.seen", problem)
    known = vocabulary.known
    changes: list[tuple[float, float, Status]] = []
    by: Any = 0.0
    for index, item in enumerate(seen):
        if not isinstance(item, list) or len(item) != 3:
            raise _bad(line, f"{channel}.seen[{index}]", "expected [after_ms, by_ms, raw_status]")
        after, by, raw = item
        # _number, inline for what exports hold: milliseconds are mostly ints.
        if type(after) is int and -_EXACT < after < _EXACT:
            after = float(after)
        elif type(after) is not float or after - after != 0.0:
            after = _number(after)
        if type(by) is int and -_EXACT < by < _EXACT:
            by = float(by)
        elif type(by) is not float or by - by != 0.0:
            by = _number(by)
        if after is None or by is None or after < 0 or by < after:
            problem = "expected milliseconds 0 ≤ after_ms ≤ by_ms"
            raise _bad(line, f"{channel}.seen[{index}]", problem)
        # (Milliseconds against the previous change's seconds, as this check always was.)
        if changes and by < changes[-1][1]:
            raise _bad(line, f"{channel}.seen[{index}]", "timeline offsets must not decrease")
        if not isinstance(raw, str):
            raise _bad(line, f"{channel}.seen[{index}]", "expected a raw status string")
        if raw not in known:
            unknown[(name, channel, raw)] += 1
        changes.append((after / 1000, by / 1000, normalized_status(name, raw)))
    end = _number(raw_channel.get("end_ms"))
    if end is None or end < 0 or end < by:
        raise _bad(line, f"{channel}.end_ms", "expected milliseconds ≥ the last by_ms")
    return Observation(tuple(changes), end / 1000, name)


def parse_traces(
    lines: Iterable[str],
    unknown: Counter[tuple[str, str, str]],
    headers: list[Header] | None = None,
) -> Iterator[Trace]:
    """Parse a trace file lazily, checking arrival order; blank lines are skipped, a
    header line (first) goes to ``headers``. Timelines are left to a resolver."""
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
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                raise InputError([f"line {number}: (header): not valid JSON"]) from None
        if first and isinstance(data, dict) and "timings" in data:
            header = parse_header(data, number)
            if headers is not None:
                headers.append(header)
            first = False
            continue
        first = False
        trace = parse_trace(text, number, previous, unknown, data)
        previous = trace.arrived_at
        yield trace


def read_header(lines: Iterable[str]) -> Header:
    """The header of a trace file (its first non-blank line), or defaults."""
    for text in readable_lines(lines):
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


def readable_lines(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` up to the first that is not text: a pass that only looks ahead stops
    there, and the pass that checks every line reports it."""
    source = iter(lines)
    while True:
        try:
            yield next(source)
        except (StopIteration, UnicodeDecodeError):
            return


#: The trace format export-timings writes; replay also reads version 1 (single times).
TRACE_VERSION = 2
#: Cron starts `resetctl sweep` on the minute of the database's clock.
CRON_INTERVAL = 60.0
#: A notice's first submission says when a sweep started only if the notice had waited
#: for one: longer than this from its creation (a running sweep looks for new work every
#: second, and `enqueue --send` submits within milliseconds).
WAITED_FOR_A_SWEEP = 2.0
#: A first submission this long after its minute says more about a busy sweep than
#: about when cron started it (seconds): such a minute is not counted.
MEASURED_START = 15.0


def export_timings(
    store: Store, since: float, until: float, kind_of: Callable[[str], str] = str
) -> Iterator[dict[str, Any]]:
    """The header, then one trace record per finished notice created in [since, until).

    ``kind_of`` gives the transport kind of a provider instance: a trace names the kind
    whose status vocabulary reads it, never an instance name (which may say whose
    account it is)."""
    lags: list[float] = []
    starts: dict[float, float] = {}
    first: float | None = None
    policies: dict[tuple[str, int], Policy] = {}
    for row in store.terminal_timings(since, until):
        if first is None:
            first = row["created_at"]
        key = row["policy"]
        if key not in policies:
            policies[key] = store.load_policy(*key)
        for channel, attempt in row["channels"].items():
            lags.extend(read_lags(policies[key], channel, attempt))
        sweep_start(row, starts)
    yield header_record(first, lags, list(starts.values()))
    for number, row in enumerate(store.terminal_timings(since, until), start=1):
        assert first is not None
        yield trace_record(number, row, first, kind_of)


def sweep_start(row: Mapping[str, Any], starts: dict[float, float]) -> None:
    """Note in ``starts`` (per cron minute, the earliest) how long after its minute the
    sweep that made this notice's first submission had started, if the notice waited for
    that sweep: it was due from before the minute, and the intent, committed before the
    call, is the first thing a sweep writes for it (a bound that is tight for the first
    notice that sweep took)."""
    intents = [a["started_at"] for a in row["channels"].values() if a.get("started_at") is not None]
    if not intents:
        return
    started = min(intents)
    minute = math.floor(started / CRON_INTERVAL) * CRON_INTERVAL
    after = started - minute
    waited = row["created_at"] < minute and started - row["created_at"] > WAITED_FOR_A_SWEEP
    if waited and after < min(MEASURED_START, starts.get(minute, math.inf)):
        starts[minute] = after


def _quantile(values: list[float], fraction: float) -> float:
    """Nearest-rank quantile of sorted ``values``, to the millisecond."""
    return round(values[min(len(values) - 1, max(0, math.ceil(fraction * len(values)) - 1))], 3)


def header_record(
    first_arrival: float | None, lags: list[float], starts: list[float] | None = None
) -> dict[str, Any]:
    """The file's first line: format version, cron phase, the observed read lag and how
    long after its minute a sweep started."""
    lags.sort()
    record: dict[str, Any] = {"timings": TRACE_VERSION, "sweep_interval": CRON_INTERVAL}
    if first_arrival is not None:
        # Seconds from the first arrival (time zero of the file) to the next cron minute.
        record["first_sweep_at"] = round(-first_arrival % CRON_INTERVAL, 3)
    if lags:
        record["read_lag"] = {
            "p50": round(lags[len(lags) // 2], 3),
            "p90": _quantile(lags, 0.9),
            "reads": len(lags),
        }
    if starts:
        starts = sorted(starts)
        record["sweep_start"] = {
            "p50": _quantile(starts, 0.5),
            "p90": _quantile(starts, 0.9),
            "sweeps": len(starts),
        }
    return record


def read_lags(policy: Policy, channel: str, attempt: Mapping[str, Any]) -> Iterator[float]:
    """Seconds from each scheduled read's due time to the read, as the machine schedules
    them (the first slot after the previous read; slots a late sweep missed collapse)."""
    submitted = attempt["submitted_at"]
    if submitted is None:
        return
    delays = policy.polls_for(channel)
    previous: float | None = None
    polls = 0
    for seen, _, source in attempt["seen"]:
        if source != "poll":
            continue
        for delay in delays[polls:]:
            if previous is None or submitted + delay > previous:
                yield max(0.0, seen - (submitted + delay))
                break
        polls += 1
        previous = seen


def trace_record(
    number: int, row: Mapping[str, Any], first: float, kind_of: Callable[[str], str] = str
) -> dict[str, Any]:
    """One notice as a version-2 trace: intervals per status change, ends of observation,
    and a cancel's time and reason."""
    trace: dict[str, Any] = {
        "version": TRACE_VERSION,
        "trace_id": f"t{number:07d}",
        "region": row["region"],
        "arrived_at": round(row["created_at"] - first, 3),
        "ttl": round(row["expires_at"] - row["created_at"], 3),
    }
    if row["phase"] == Phase.CANCELLED and row["reason"] in CANCEL_WORDS:
        # The cancel's write is the phase's start: an exact time, not an interval.
        trace["cancelled"] = [_ms(row["phase_since"] - row["created_at"]), row["reason"]]
    transports: dict[str, str] = {}
    for channel, attempt in sorted(row["channels"].items()):
        transports[channel] = kind_of(attempt["transport"])
        trace[channel] = observed_channel(attempt)
    if any(name != "outbox" for name in transports.values()):
        trace["transport"] = transports
    return trace


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def observed_channel(attempt: Mapping[str, Any]) -> dict[str, Any]:
    """``{"seen": [[after_ms, by_ms, raw], …], "end_ms": …}`` for one attempt.

    ``after_ms`` is the last read that did not show the status (the submission, for the
    first one), ``by_ms`` the first read that did. A submission the transport never took
    was observed for no time at all.
    """
    submitted = attempt["submitted_at"]
    if submitted is None:
        return {"seen": [], "end_ms": 0}
    changes: list[list[Any]] = []
    previous_raw: str | None = None
    previous_at = 0
    end = 0
    for seen, raw, _ in attempt["seen"]:
        at = _ms(seen - submitted)
        if raw != previous_raw:
            changes.append([min(previous_at, at), at, raw])
            previous_raw = raw
        previous_at = at
        end = max(end, at)
    if attempt["last_read_at"] is not None:
        end = max(end, _ms(attempt["last_read_at"] - submitted))
    return {"seen": changes, "end_ms": end}
