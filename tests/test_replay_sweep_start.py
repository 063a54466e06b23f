"""Sweeps start after their cron minute: export-timings measures how long after, and replay
starts its simulated sweeps then (and keeps an idle --max-runtime sweep looking)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request

from resetctl.enqueue import enqueue
from resetctl.errors import InputError
from resetctl.machine import Status
from resetctl.replay import (
    Candidate,
    Header,
    SimulationOptions,
    parse_header,
    read_header,
    read_traces,
    replay,
    with_header,
)
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.timings import export_timings
from resetctl.transports import Message, ProviderStatus
from resetctl.work import SweepOptions

DEFAULT = make_settings()


class DeliversAtOnce:
    """An email transport whose every message is delivered by the time it is submitted."""

    name = "outbox"
    recovers_by_key = True
    call_timeout = 0.0

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        return ProviderStatus(f"m-{attempt_key}", "delivered", Status.DELIVERED)

    def status(self, message_id: str) -> ProviderStatus:
        return ProviderStatus(message_id, "delivered", Status.DELIVERED)

    def close(self) -> None:
        pass


def _swept(store: Store, clock: FakeClock, enqueued_at: float, swept_at: float) -> None:
    """One notice enqueued at ``enqueued_at``, then one sweep pass at ``swept_at``."""
    clock.now = enqueued_at
    enqueue(store, DEFAULT, [reset_request()], clock())
    clock.now = swept_at
    sweeper = Sweeper(store, DEFAULT, {"email": DeliversAtOnce()}, clock=clock, sleep=clock.sleep)
    sweeper.run(SweepOptions("cron", 50, 60.0, 0.0))


def test_export_measures_how_long_after_its_minute_a_sweep_started(tmp_path: Path) -> None:
    """A notice that waited through a cron minute dates that minute's sweep start."""
    clock = FakeClock()
    with Store(tmp_path / "starts.db") as store:
        _swept(store, clock, T0 + 55, T0 + 60.3)
        _swept(store, clock, T0 + 116, T0 + 120.45)
        _swept(store, clock, T0 + 130, T0 + 130.5)  # a running sweep's look: not a start
        header, *traces = export_timings(store, 0, math.inf)
    assert len(traces) == 3
    assert header["sweep_start"] == {"p50": 0.3, "p90": 0.45, "sweeps": 2}
    parsed = parse_header(header, 1)
    assert (parsed.sweep_start_p50, parsed.sweep_start_p90) == (0.3, 0.45)


def _trace(trace_id: str, arrived_at: float) -> str:
    """A version-1 trace whose email is delivered at its submission."""
    return json.dumps(
        {"trace_id": trace_id, "arrived_at": arrived_at, "ttl": 600, "email": [[0, "delivered"]]}
    )


def _replayed(lines: list[str], max_runtime: float = 0.0) -> dict[str, Any]:
    options = with_header(SimulationOptions(max_runtime=max_runtime), read_header(lines))
    (report,) = replay(lines, [Candidate("current", DEFAULT.policies)], options).reports
    return report.to_json()


def test_replay_starts_each_sweep_the_measured_time_after_its_minute() -> None:
    """Replay starts each sweep the header's median start after its minute, unless given one."""
    header = {"timings": 2, "first_sweep_at": 40.0, "sweep_start": {"p50": 0.4, "p90": 0.5}}
    lines = [json.dumps(header), _trace("a", 0)]
    assert _replayed(lines)["queue_delay_p95"] == pytest.approx(40.4)
    options = with_header(SimulationOptions(), read_header(lines), sweep_start=0.0)
    assert options.sweep_start == 0.0
    assert with_header(SimulationOptions(), read_header(lines)).sweep_start == 0.4


def test_an_idle_max_runtime_sweep_takes_an_arrival_at_its_next_look() -> None:
    """A --max-runtime sweep cron started with nothing due takes an arrival at its next look."""
    # Cron starts the sweep at 120 s although nothing is due; the reset arriving at
    # 130.5 s is taken at its look at 131 s, not by the next minute's sweep.
    lines = [_trace("first", 0), _trace("after-a-quiet-spell", 130.5)]
    assert _replayed(lines, max_runtime=55.0)["queue_delay_p95"] == pytest.approx(0.5)
    # Past the sweep's --max-runtime, the next minute's sweep takes it.
    late = [_trace("first", 0), _trace("after-the-sweep-ended", 176.0)]
    assert _replayed(late, max_runtime=55.0)["queue_delay_p95"] == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("sweep_start", "message"),
    [
        ([0.3], "line 1: sweep_start: expected an object"),
        ({"p50": -1}, "line 1: sweep_start.p50: expected seconds from 0 to 60"),
        ({"p90": 1e300}, "line 1: sweep_start.p90: expected seconds from 0 to 60"),
        ({"p50": True}, "line 1: sweep_start.p50: expected seconds from 0 to 60"),
        ({"sweeps": -2}, "line 1: sweep_start.sweeps: expected a whole number ≥ 0"),
        ({"p50": 0.3, "mean": 0.3}, "line 1: sweep_start.mean: unknown field"),
    ],
)
def test_a_bad_sweep_start_in_the_header_names_its_line_and_field(
    sweep_start: object, message: str
) -> None:
    """The header's sweep start is checked like any trace field: line and field named."""
    lines = [json.dumps({"timings": 2, "sweep_start": sweep_start}), _trace("a", 0)]
    with pytest.raises(InputError) as raised:
        list(read_traces(lines, Counter()))
    assert str(raised.value) == message


def test_the_range_covers_a_fallback_a_second_of_sweep_timing_decides() -> None:
    """A fallback a second of sweep timing lets through or refuses is in the range both ways."""
    # The last email read falls between two sweeps and is made at the next one's start
    # with 0.5 s more than the 491.5 s reserve left: the simulated sweep sends the SMS, one
    # a second later would not. With no slack the range is a point.
    settings = make_settings(policy={"default": {"fallback_reserve": "491.5s"}})
    line = json.dumps(
        {
            "trace_id": "knife-edge",
            "arrived_at": 72,
            "ttl": 600,
            "email": [[0, "pending"]],
            "sms": [[1, "delivered"]],
        }
    )
    candidate = Candidate("large reserve", settings.policies)
    for slack, expired in ((1.0, [0, 1]), (0.0, [0, 0])):
        options = SimulationOptions(max_runtime=55.0, timing_slack=slack)
        (report,) = replay([line], [candidate], options).reports
        summary = report.to_json()
        assert (summary["accepted"], summary["escalated"], summary["expired"]) == (1, 1, 0)
        assert summary["range"]["expired"] == expired
        assert summary["range"]["would_page"] == expired
        assert summary["range"]["escalated"] == [1 - expired[1], 1]


def test_the_timing_slack_is_one_look_or_the_measured_spread() -> None:
    """The timing slack is one idle look, or the sweep start's spread when wider."""
    wide = Header(sweep_start_p50=0.4, sweep_start_p90=2.9)
    assert with_header(SimulationOptions(max_runtime=55.0), Header()).timing_slack == 1.0
    assert with_header(SimulationOptions(max_runtime=55.0), wide).timing_slack == 2.5
    assert with_header(SimulationOptions(), Header()).timing_slack == 0.0
