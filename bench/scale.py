"""Throughput of 1, 2, 4 and 8 sweep processes on PostgreSQL and on SQLite, with a
simulated provider latency per call ([outbox] latency, 50 ms by default).

Each run enqueues N notices due now (email first, accepted at once: one transport call
each) into a fresh database, starts P `resetctl sweep` processes with distinct worker ids
together, and times until all have exited (a one-pass sweep exits once nothing is due).
PostgreSQL runs in a throwaway cluster on a Unix socket with its default durability
(fsync and synchronous_commit on), or in RESETCTL_TEST_PG's cluster when that is set.

    .venv/bin/python bench/scale.py [--notices 400] [--latency 50ms] [--processes 1,2,4,8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import multihost
import pgcluster


def _run(db: str, tmp: Path, notices: int, processes: int, latency: str) -> multihost.Outcome:
    hosts = [multihost.Host(f"host-{n}") for n in range(processes)]
    outcome = multihost.simulate(db, tmp, notices, hosts, latency, lease="60s", batch_size=10)
    assert outcome.terminal == notices, outcome
    assert outcome.duplicate_calls == 0, outcome
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notices", type=int, default=400)
    parser.add_argument("--latency", default="50ms")
    parser.add_argument("--processes", default="1,2,4,8")
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]
    os.environ.setdefault("RESETCTL_HASH_KEY", multihost.HASH_KEY)
    started = None
    admin = os.environ.get("RESETCTL_TEST_PG")
    if not admin:
        started = pgcluster.start(settings=())
        admin = pgcluster.uri(started)
    results: dict[tuple[str, int], tuple[float, float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="resetctl-scale-") as tmp:
            for processes in counts:
                for backend in ("postgresql", "sqlite"):
                    work = Path(tmp) / f"{backend}-{processes}"
                    work.mkdir()
                    if backend == "sqlite":
                        db = str(work / "resetctl.db")
                    else:
                        name = f"scale_{uuid.uuid4().hex[:8]}"
                        db = pgcluster.create_database(admin, name)
                    outcome = _run(db, work, args.notices, processes, args.latency)
                    # Working: from the sweeps' first transition to their last, without the
                    # interpreters' start-up (seconds each on a loaded 2-core machine).
                    working = outcome.per_working_second
                    results[(backend, processes)] = (outcome.per_second, working)
                    print(
                        f"{backend:<10} P={processes}  wall {outcome.seconds:6.2f} s"
                        f" {outcome.per_second:7.1f}/s  working {outcome.working:6.2f} s"
                        f" {working:7.1f}/s",
                        flush=True,
                    )
                    if backend == "postgresql":
                        pgcluster.drop_database(admin, name)
    finally:
        if started is not None:
            pgcluster.stop(started)
    print(f"\nN = {args.notices} notices, {args.latency} per provider call\n")
    print("notices/s: wall clock (with start-up) / working (first to last transition)")
    print("| processes | PostgreSQL | x one | SQLite | x one |")
    print("|---|---|---|---|---|")
    for processes in counts:
        cells = []
        for backend in ("postgresql", "sqlite"):
            wall, inside = results[(backend, processes)]
            wall1, inside1 = results[(backend, counts[0])]
            cells.append(f"{wall:.1f} / {inside:.1f} | {wall / wall1:.2f} / {inside / inside1:.2f}")
        print(f"| {processes} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
