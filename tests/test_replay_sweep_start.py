"""Sweeps start after their cron minute: export-timings measures how long after, and replay
starts its simulated sweeps then (and keeps an idle --max-runtime sweep looking)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import make_settings

from resetctl.replay import Candidate, SimulationOptions, read_header, replay, with_header

DEFAULT = make_settings()


def _trace(trace_id: str, arrived_at: float) -> str:
    """A version-1 trace whose email is delivered at its submission."""
    return json.dumps(
        {"trace_id": trace_id, "arrived_at": arrived_at, "ttl": 600, "email": [[0, "delivered"]]}
    )


def _replayed(lines: list[str], max_runtime: float = 0.0) -> dict[str, Any]:
    options = with_header(SimulationOptions(max_runtime=max_runtime), read_header(lines))
    (report,) = replay(lines, [Candidate("current", DEFAULT.policies)], options).reports
    return report.to_json()


def test_an_idle_max_runtime_sweep_takes_an_arrival_at_its_next_look() -> None:
    """Cron starts a --max-runtime sweep at 120 s although nothing is due; a reset that
    arrives at 130.5 s is taken at that sweep's next one-second look (131 s), not by the
    next minute's sweep."""
    lines = [_trace("first", 0), _trace("after-a-quiet-spell", 130.5)]
    assert _replayed(lines, max_runtime=55.0)["queue_delay_p95"] == pytest.approx(0.5)
    # Past the sweep's --max-runtime, the next minute's sweep takes it.
    late = [_trace("first", 0), _trace("after-the-sweep-ended", 176.0)]
    assert _replayed(late, max_runtime=55.0)["queue_delay_p95"] == pytest.approx(4.0)
