"""Sweeps on many hosts over one PostgreSQL database, one of them with a clock 30 s fast:
every notice ends, nothing is sent twice, no live lease is taken over."""

from __future__ import annotations

from pathlib import Path

import pytest
from multihost import Host, simulate

#: Four hosts, the last one's clock 30 s fast. Leases are shorter than the skew, so a
#: host reading leases on its own clock would take over every lease the others hold.
HOSTS = (Host("host-a"), Host("host-b"), Host("host-c"), Host("host-fast", skew=30.0))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_hosts_one_30s_fast_send_10k_notices_once_each(db: str, tmp_path: Path) -> None:
    """4 sweep processes, distinct worker ids, one clock 30 s fast, 10k notices with a
    simulated provider latency: all terminal, 0 duplicate attempts or calls, 0 takeovers."""
    outcome = simulate(db, tmp_path, 10_000, HOSTS, "2ms", lease="20s", batch_size=25)
    assert outcome.terminal == 10_000
    assert outcome.duplicate_attempts == 0
    assert outcome.duplicate_calls == 0
    assert outcome.takeovers == 0
    assert outcome.live_takeovers == 0
    claimed = [s["claimed"] for s in outcome.summaries]
    assert sum(claimed) == 10_000
    assert all(c > 0 for c in claimed), claimed  # the fast host took its share, no more
    assert sum(s["errors"] for s in outcome.summaries) == 0
