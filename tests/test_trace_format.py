"""The trace format both ways: whatever export-timings writes, replay reads back as written."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resetctl.machine import CANCEL_REASONS, Reason
from resetctl.replay import CHANNELS, TRACE_VERSION, parse_header, parse_trace
from resetctl.replay.traces import header_record, trace_record
from resetctl.transports import BUILT_IN

#: Where a database's clock might be: large epoch seconds, where rounding bites.
EPOCH = 1.7e9
RAW_STATUSES = st.sampled_from(["queued", "sent", "delivered", "accepted", "failed", "mystery"])


@st.composite
def attempts(draw: st.DrawFn) -> dict[str, Any]:
    """One attempt as the store's timings read gives it: reads in time order, some before
    the submission was recorded (a callback can be), or no submission at all."""
    submitted = draw(st.none() | st.floats(0, 3600).map(lambda at: EPOCH + at))
    base = EPOCH if submitted is None else submitted
    offsets = sorted(draw(st.lists(st.floats(-5, 1800), max_size=6)))
    seen = [
        (base + offset, draw(RAW_STATUSES), draw(st.sampled_from(["poll", "callback"])))
        for offset in offsets
    ]
    last_read = draw(st.none() | st.floats(-5, 1800).map(lambda at: base + at))
    return {
        "transport": draw(st.sampled_from(sorted(BUILT_IN))),
        "submitted_at": submitted,
        "last_read_at": last_read,
        "seen": seen,
    }


#: How a finished notice ended: (phase, reason), a cancel's reasons included.
ENDINGS = st.sampled_from(
    [
        ("accepted", "accepted"),
        ("expired", "link_expired"),
        ("failed", "channels_exhausted"),
        *(("cancelled", reason.value) for reason in CANCEL_REASONS),
    ]
)
ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "region": st.sampled_from(["default", "apac"]),
            "created_at": st.floats(0, 86_400).map(lambda at: EPOCH + at),
            "ttl": st.sampled_from([300.0, 600.0]) | st.floats(1, 86_400),
            "ending": ENDINGS,
            "ended_after": st.floats(0, 90_000),
            "channels": st.dictionaries(st.sampled_from(CHANNELS), attempts(), max_size=2),
        }
    ),
    min_size=1,
    max_size=4,
)


@settings(deadline=None)
@given(rows=ROWS)
def test_every_trace_export_timings_writes_is_read_back_as_written(
    rows: list[dict[str, Any]],
) -> None:
    """Exported traces parse without a complaint, in order, with their intervals as
    written, and a cancelled notice with its cancel's time after arrival and reason."""
    rows.sort(key=lambda row: row["created_at"])
    for row in rows:
        row["expires_at"] = row["created_at"] + row.pop("ttl")
        row["phase"], row["reason"] = row.pop("ending")
        row["phase_since"] = row["created_at"] + row.pop("ended_after")
    first = rows[0]["created_at"]
    previous = 0.0
    for number, row in enumerate(rows, start=1):
        written = trace_record(number, row, first)
        trace = parse_trace(json.dumps(written, separators=(",", ":")), number, previous, Counter())
        previous = trace.arrived_at
        assert trace.version == TRACE_VERSION
        assert (trace.trace_id, trace.region, trace.arrived_at, trace.ttl) == (
            written["trace_id"],
            row["region"],
            written["arrived_at"],
            written["ttl"],
        )
        assert set(trace.observations) == set(row["channels"])
        if row["phase"] == "cancelled":
            after_ms, word = written["cancelled"]
            assert after_ms == round((row["phase_since"] - row["created_at"]) * 1000)
            assert (
                trace.cancelled
                == (after_ms / 1000, Reason(word))
                == (after_ms / 1000, row["reason"])
            )
        else:
            assert "cancelled" not in written
            assert trace.cancelled is None
        for channel, observed in trace.observations.items():
            assert observed.transport == row["channels"][channel]["transport"]
            assert [(lo, hi) for lo, hi, _ in observed.changes] == [
                (after / 1000, by / 1000) for after, by, _ in written[channel]["seen"]
            ]
            assert observed.end == written[channel]["end_ms"] / 1000


@given(
    first=st.none() | st.floats(0, 1e10),
    lags=st.lists(st.floats(0, 600), max_size=20),
)
def test_the_header_export_timings_writes_is_read_back(
    first: float | None, lags: list[float]
) -> None:
    """The header's cron phase and read lag come back from parse_header as written."""
    written = header_record(first, lags)
    header = parse_header(json.loads(json.dumps(written)), 1)
    assert header.sweep_interval == written["sweep_interval"]
    assert header.first_sweep_at == written.get("first_sweep_at")
    assert header.read_lag_p50 == written.get("read_lag", {}).get("p50")
    assert header.read_lag_p90 == written.get("read_lag", {}).get("p90")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("reason", ["completed", "superseded", "withdrawn"])
def test_a_cancel_reads_back_in_seconds_after_arrival(version: int, reason: str) -> None:
    """`"cancelled": [after_ms, reason]` is the cancel's time after arrival and its reason,
    in either version; a trace without it was never cancelled."""
    line = {"version": version, "trace_id": "a", "arrived_at": 7, "ttl": 600}
    assert parse_trace(json.dumps(line), 1, 0.0, Counter()).cancelled is None
    line["cancelled"] = [42_500, reason]
    trace = parse_trace(json.dumps(line), 1, 0.0, Counter())
    assert trace.cancelled == (42.5, Reason(reason))
