"""Claim cost as the table grows: one sweep of a batch of 50 due notices in a table of
1,000 notices versus 1,000,000 (the rest finished), measured in the same run.

    python bench/claim.py                      # 1,000 vs 1,000,000, 5 rounds
    python bench/claim.py --large 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from resetctl.config import settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports
from resetctl.work import SweepOptions

T0 = 1_767_225_600.0
BATCH = 50
SETTINGS = settings_from_mapping({"outbox": {"email_status": "pending"}})


def build(path: Path, total: int) -> Store:
    """A database holding ``total`` notices: all finished except the batches to come."""
    store = Store(path)
    finished = total - BATCH
    with store.transaction() as conn:
        conn.executemany(
            "INSERT INTO notices (id, idempotency_key, request_digest, region, policy_name,"
            " policy_version, channels, created_at, expires_at, phase, phase_since, due_at)"
            " VALUES (?, ?, 'd', 'default', 'default', 1, 'email,sms', ?, ?, 'accepted', ?, NULL)",
            ((f"old{i}", f"old{i}", T0 - 86400, T0 - 85800, T0 - 86000) for i in range(finished)),
        )
    store.conn.execute("ANALYZE")
    return store


def one_batch(store: Store, round_number: int) -> float:
    """Enqueue 50 notices due now, then time the sweep that claims and submits them."""
    now = T0 + round_number * 0.01  # earlier rounds wait for their 15 s poll: not due
    requests = [
        {
            "idempotency_key": f"r{round_number}-{i}",
            "email": f"u{i}@example.com",
            "reset_url": "https://shop.example/r/x",
        }
        for i in range(BATCH)
    ]
    enqueue(store, SETTINGS, requests, now)

    def clock() -> float:
        return now

    sweeper = Sweeper(store, SETTINGS, build_transports(SETTINGS, store, clock), clock=clock)
    started = time.perf_counter()
    summary = sweeper.run(SweepOptions("bench", BATCH, 60.0))
    elapsed = time.perf_counter() - started
    assert summary.claimed == BATCH, summary
    assert summary.submitted == BATCH, summary
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        built = time.perf_counter()
        small = build(Path(tmp) / "small.db", args.small)
        large = build(Path(tmp) / "large.db", args.large)
        print(f"built both tables in {time.perf_counter() - built:.1f} s")
        print("plan:", " | ".join(large.explain_claim()))
        timings: dict[str, list[float]] = {"small": [], "large": []}
        for round_number in range(args.rounds):  # alternate, so noise hits both alike
            timings["small"].append(one_batch(small, round_number))
            timings["large"].append(one_batch(large, round_number))
        small.close()
        large.close()
    a = statistics.median(timings["small"])
    b = statistics.median(timings["large"])
    print(f"{'notices':>10} {'sweep of 50 (median s)':>24}")
    print(f"{args.small:>10,} {a:>24.4f}")
    print(f"{args.large:>10,} {b:>24.4f}")
    print(f"ratio large/small: {b / a:.2f}   target ≤ 1.50")


if __name__ == "__main__":
    main()
