"""The idle cron tick: `resetctl sweep` with nothing due, against `python -c "import sqlite3"`.

Both are started as fresh processes, alternately, and the medians compared; then
`python -X importtime` lists what the tick imports, heaviest first.

    python bench/idle.py            # 15 runs each
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "idle.db")
        tick = [sys.executable, "-m", "resetctl", "--log-level", "warning", "sweep", "--db", db]
        floor = [sys.executable, "-c", "import sqlite3"]
        subprocess.run(tick, check=True, capture_output=True)  # create the file first
        ticks, floors = [], []
        for _ in range(args.runs):
            ticks.append(timed(tick))
            floors.append(timed(floor))
        a, b = statistics.median(ticks), statistics.median(floors)
        print(f"idle sweep   {a * 1000:7.1f} ms (median of {args.runs})")
        print(f"floor        {b * 1000:7.1f} ms  python -c 'import sqlite3'")
        print(f"ratio        {a / b:7.1f}x")
        report = subprocess.run(
            [sys.executable, "-X", "importtime", *tick[1:]], capture_output=True, text=True
        ).stderr
    rows = []
    for line in report.splitlines():
        if not line.startswith("import time:"):
            continue
        _self, cumulative, name = line.split(":", 1)[1].split("|")
        if not cumulative.strip().isdigit():
            continue  # the header line
        nested = len(name) - len(name.lstrip()) > 1
        rows.append((int(cumulative), name.strip(), nested))
    top = sorted((row for row in rows if not row[2]), reverse=True)[:12]
    print("heaviest top-level imports (cumulative ms):")
    for cumulative, name, _nested in top:
        print(f"  {cumulative / 1000:7.1f}  {name}")


if __name__ == "__main__":
    main()
