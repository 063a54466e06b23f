"""``resetctl export-timings``: de-identified traces from the database, for ``replay``.

A trace holds a reset's region, arrival (seconds from the first exported notice), link
lifetime and, per channel its notice used, what the reads saw (format version 2). A read
shows a status some time after it happened, so each status change is exported as the
interval it is known to lie in: after the last read that did not show it, up to the first
read that did, in milliseconds from that channel's submission, not rounded. Each channel
also carries its end of observation (the last read): after it, nothing is known. A channel
the notice never used is absent, which replay treats as unknown, never as silent.

The first line is a header with what replay needs to place its reads where production
made them: when the first cron sweep came after the first arrival, and how late reads
were after they fell due. Trace ids are sequence numbers: nothing maps them back to
notices.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from resetctl.config import Policy
from resetctl.store import Store

#: The trace format export-timings writes; replay also reads version 1 (single times).
TRACE_VERSION = 2
#: Cron starts `resetctl sweep` on the minute of the database's clock.
CRON_INTERVAL = 60.0


def export_timings(store: Store, since: float, until: float) -> Iterator[dict[str, Any]]:
    """The header, then one trace record per finished notice created in [since, until)."""
    lags: list[float] = []
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
    yield header(first, lags)
    for number, row in enumerate(store.terminal_timings(since, until), start=1):
        assert first is not None
        yield trace_record(number, row, first)


def header(first_arrival: float | None, lags: list[float]) -> dict[str, Any]:
    """The file's first line: format version, cron phase and the observed read lag."""
    lags.sort()
    record: dict[str, Any] = {"timings": TRACE_VERSION, "sweep_interval": CRON_INTERVAL}
    if first_arrival is not None:
        # Seconds from the first arrival (time zero of the file) to the next cron start.
        record["first_sweep_at"] = round(-first_arrival % CRON_INTERVAL, 3)
    if lags:
        record["read_lag"] = {
            "p50": round(lags[len(lags) // 2], 3),
            "p90": round(lags[min(len(lags) - 1, math.ceil(0.9 * len(lags)) - 1)], 3),
            "reads": len(lags),
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


def trace_record(number: int, row: Mapping[str, Any], first: float) -> dict[str, Any]:
    """One notice as a version-2 trace: intervals per status change, ends of observation."""
    trace: dict[str, Any] = {
        "version": TRACE_VERSION,
        "trace_id": f"t{number:07d}",
        "region": row["region"],
        "arrived_at": round(row["created_at"] - first, 3),
        "ttl": round(row["expires_at"] - row["created_at"], 3),
    }
    transports: dict[str, str] = {}
    for channel, attempt in sorted(row["channels"].items()):
        transports[channel] = attempt["transport"]
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
