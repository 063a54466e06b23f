"""The idle cron tick: `resetctl sweep` with nothing due, against `python -c "import sqlite3"`.

Both are started as fresh processes, alternately, and the medians compared (the ratio is
tick median / bare median); then `python -X importtime` lists what the tick imports,
heaviest first, and the import time each top-level package pays for its own modules.
The tick runs as cron would start it through the package, `python -m resetctl … sweep
--db FILE`, whatever the console script's entry point is.

    python bench/idle.py            # 15 runs each
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str]) -> tuple[float, float]:
    """Wall-clock seconds, and the child's CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "idle.db")
        tick = [sys.executable, "-m", "resetctl", "--log-level", "warning", "sweep", "--db", db]
        floor = [sys.executable, "-c", "import sqlite3"]
        init = [sys.executable, "-m", "resetctl", "db", "init", "--db", db]
        subprocess.run(init, check=True, capture_output=True)  # a sweep never creates it
        ticks, floors = [], []
        for _ in range(args.runs):
            ticks.append(timed(tick))
            floors.append(timed(floor))
        a, b = statistics.median(t[0] for t in ticks), statistics.median(f[0] for f in floors)
        c, d = statistics.median(t[1] for t in ticks), statistics.median(f[1] for f in floors)
        print(f"{'':12} {'wall ms':>8} {'CPU ms':>8}  (medians of {args.runs})")
        print(f"{'idle sweep':12} {a * 1000:8.1f} {c * 1000:8.1f}")
        print(f"{'floor':12} {b * 1000:8.1f} {d * 1000:8.1f}  python -c 'import sqlite3'")
        print(
            f"{'ratio':12} {a / b:7.1f}x {c / d:7.1f}x  (tick median / bare median;"
            " the target, ≤ 6x, is on wall time)"
        )
        report = subprocess.run(
            [sys.executable, "-X", "importtime", *tick[1:]], capture_output=True, text=True
        ).stderr
    rows = []
    for line in report.splitlines():
        if not line.startswith("import time:"):
            continue
        own_us, cumulative_us, name = line.split(":", 1)[1].split("|")
        if not cumulative_us.strip().isdigit():
            continue  # the header line
        nested = len(name) - len(name.lstrip()) > 1
        rows.append((int(cumulative_us), int(own_us), name.strip(), nested))
    top = sorted((row for row in rows if not row[3]), reverse=True)[:12]
    print("heaviest top-level imports (cumulative ms):")
    for cumulative, _own, name, _nested in top:
        print(f"  {cumulative / 1000:7.1f}  {name}")
    # Every module's own time, summed by distribution (its top-level package): who pays.
    by_package: dict[str, int] = {}
    for _cumulative, own, name, _nested in rows:
        root = name.split(".", 1)[0]
        by_package[root] = by_package.get(root, 0) + own
    total = sum(by_package.values())
    print(f"import time by top-level package (own ms, summed; {total / 1000:.1f} ms in all):")
    for root, own in sorted(by_package.items(), key=lambda item: -item[1])[:12]:
        print(f"  {own / 1000:7.1f}  {root}")


if __name__ == "__main__":
    main()
