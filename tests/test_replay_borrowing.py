"""A channel a notice never used is borrowed several times over: the point estimate keeps
one borrowed timeline, and the range covers what every one of them would have done."""

from __future__ import annotations

import json
from typing import Any

from conftest import make_settings

from resetctl.replay import BORROW_DRAWS, Candidate, SimulationOptions, replay

DEFAULT = make_settings()
BOUNCED = {"seen": [[0, 0, "pending"], [14000, 15050, "failed"]], "end_ms": 15050}


def _trace(trace_id: str, arrived_at: float, **channels: Any) -> str:
    return json.dumps(
        {"version": 2, "trace_id": trace_id, "arrived_at": arrived_at, "ttl": 600, **channels}
    )


def _sms(raw: str) -> dict[str, Any]:
    return {"seen": [[0, 0, "pending"], [0, 15050, raw]], "end_ms": 15050}


#: Twelve resets whose email bounced: two used their SMS (delivered once, failed once),
#: ten never did and borrow it.
LINES = [
    _trace("sms-delivered", 0, email=BOUNCED, sms=_sms("delivered")),
    _trace("sms-failed", 10, email=BOUNCED, sms=_sms("failed")),
    *[_trace(f"never-used-sms-{n}", 20 + 10 * n, email=BOUNCED) for n in range(10)],
]


def _summary(seed: int) -> dict[str, Any]:
    options = SimulationOptions()
    (report,) = replay(LINES, [Candidate("current", DEFAULT.policies)], options, seed=seed).reports
    return report.to_json()


def test_the_range_covers_every_borrowed_timeline_a_notice_might_get() -> None:
    """The range of accepted and failed covers every borrowed SMS timeline each notice might get."""
    # From the two that used their SMS alone (1 each) to all but one: not one draw's count.
    assert BORROW_DRAWS > 1
    summary = _summary(seed=0)
    assert summary["borrowed"]["sms"] == 10
    for figure in ("accepted", "failed"):
        low, high = summary["range"][figure]
        assert (low, high) == (1, 11), figure
        assert low <= summary[figure] <= high
    assert summary["range"]["escalated"] == [12, 12]  # every email bounced: no doubt there
    assert summary["accepted"] + summary["failed"] == 12


def test_the_other_borrowed_timelines_leave_the_point_estimate_as_it_was() -> None:
    """The other borrowed timelines leave the point estimate as one draw gives it."""
    for seed in (0, 1, 2):
        summary = _summary(seed)
        for reading in ("optimistic", "pessimistic"):
            assert summary[reading]["accepted"] == summary["accepted"]
            assert summary[reading]["failed"] == summary["failed"]
    assert {_summary(seed)["accepted"] for seed in (0, 1, 2)} == {4, 5, 6}
