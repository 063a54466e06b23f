"""Enqueue-to-first-submission latency: how long the person waits for the first message.

Two ways in, each over N notices enqueued one by one (default 1,000):

- ``--send``: the application calls ``enqueue(..., send=True)``, which submits before it
  returns;
- cron's sweep: a real ``resetctl sweep --max-runtime`` process runs beside the
  enqueuing one, idle between notices, and picks each one up.

Latency is the outbox's ``submitted_at`` minus the notice's ``created_at``, both stamped
by the process that wrote them (one machine, one clock). Prints p50, p99 and max.

    python bench/latency.py            # 1,000 notices each way
    python bench/latency.py -n 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from resetctl.config import settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store


def _request(n: int) -> dict[str, str]:
    return {
        "idempotency_key": f"latency-{n}",
        "email": f"user{n}@example.com",
        "reset_url": f"https://shop.example/reset/{n}",
    }


def _latencies(db: Path) -> list[float]:
    with Store(db) as store:
        rows = store.conn.execute(
            "SELECT o.submitted_at - n.created_at FROM outbox o JOIN notices n"
            " ON n.id = o.notice_id"
        ).fetchall()
    return sorted(float(r[0]) for r in rows)


def _report(name: str, values: list[float], expected: int) -> None:
    if len(values) != expected:
        print(f"{name}: only {len(values)} of {expected} notices were submitted")
    p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
    print(
        f"{name:<28} p50 {statistics.median(values) * 1000:8.1f} ms"
        f"   p99 {p99 * 1000:8.1f} ms   max {values[-1] * 1000:8.1f} ms   (n={len(values)})"
    )


def with_send(db: Path, count: int) -> list[float]:
    settings = settings_from_mapping({}, "bench")
    with Store(db) as store:
        for n in range(count):
            enqueue(store, settings, [_request(n)], time.time(), send=True)
    return _latencies(db)


def with_sweep(db: Path, count: int, gap: float) -> list[float]:
    settings = settings_from_mapping({}, "bench")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env.update({"RESETCTL_DB": str(db), "RESETCTL_LOG_LEVEL": "warning"})
    with Store(db):
        pass  # the schema exists before the sweep starts
    runtime = int(count * gap + 30)
    sweep = subprocess.Popen(
        [sys.executable, "-m", "resetctl", "sweep", "--max-runtime", f"{runtime}s"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        with Store(db) as store:
            for n in range(count):
                enqueue(store, settings, [_request(n)], time.time())
                time.sleep(gap)  # notices arrive one by one, as resets do
            deadline = time.time() + 30
            while len(store.outbox_messages()) < count and time.time() < deadline:
                time.sleep(0.1)
    finally:
        sweep.terminate()
        sweep.wait(timeout=60)
    return _latencies(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--notices", type=int, default=1000)
    parser.add_argument(
        "--gap", type=float, default=0.05, help="seconds between enqueues (sweep case)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _report("enqueue --send", with_send(Path(tmp) / "send.db", args.notices), args.notices)
        _report(
            "idle sweep --max-runtime",
            with_sweep(Path(tmp) / "sweep.db", args.notices, args.gap),
            args.notices,
        )


if __name__ == "__main__":
    main()
