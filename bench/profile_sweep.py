"""Where a sweep's time goes: cProfile of one sweep of N notices, to submission and then
to acceptance, as bench/lifecycle.py runs them (outbox transport, status pending, then
every message delivered and the clock past the first poll).

Enqueueing is not profiled, and the profile counts this process's CPU time (``--timer
wall`` for wall-clock time). Prints, for each stage and for both together, the top costs
by own time (any code: SQLite, chevron, JSON …) and, in resetctl's code, by own time and
by cumulative time (leaving out the entry points every call passes through). Then the
fair floor of bench/lifecycle.py is profiled the same way (its two sweep stages), and a
summary puts the two side by side: own time in SQLite, in chevron, in JSON, in
resetctl's (or the floor's) own code, and the rest.

cProfile slows Python calls, not SQLite's C code: chevron's many small calls and
resetctl's own code look costlier here than they are, SQLite cheaper.

    python bench/profile_sweep.py             # N = 5,000, top 5
    python bench/profile_sweep.py --n 1000 --top 10 --dump sweep.prof
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lifecycle import BATCH, T0, Clock, requests, run_fair_floor

from resetctl.config import settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports
from resetctl.work import SweepOptions

PACKAGE = os.sep + "resetctl" + os.sep
#: A function whose cumulative time is at least this share of the total is an entry point
#: every call passes through (Sweeper.run and the like): it says nothing about the cost.
SPINE = 0.95


def label(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":  # a builtin or a C method: name says it all
        return name
    where = filename.split(PACKAGE, 1)[1] if PACKAGE in filename else Path(filename).name
    return f"{name} ({where}:{line})"


#: Where own time is counted in the summary, first match wins: (category, test).
CATEGORIES: list[tuple[str, Any]] = [
    ("SQLite (sqlite3 calls)", lambda f, n: f == "~" and "sqlite3." in n),
    ("chevron (templates)", lambda f, n: f"{os.sep}chevron{os.sep}" in f),
    ("json", lambda f, n: f"{os.sep}json{os.sep}" in f or "_json" in n),
    ("resetctl's own code", lambda f, n: PACKAGE in f),
    ("bench/lifecycle.py (floor)", lambda f, n: f.endswith(f"bench{os.sep}lifecycle.py")),
]


def kind(key: tuple[str, int, str]) -> str:
    filename, _line, name = key
    return next((c for c, test in CATEGORIES if test(filename, name)), "everything else")


def categories(profile: pstats.Stats) -> dict[str, float]:
    """Own time summed by category (what is left over: the standard library, builtins)."""
    stats: dict[tuple[str, int, str], Any] = profile.stats  # type: ignore[attr-defined]
    totals = {name: 0.0 for name, _test in CATEGORIES} | {"everything else": 0.0}
    for key, entry in stats.items():
        totals[kind(key)] += entry[2]
    return totals


def by_kind(product: pstats.Stats, floor: pstats.Stats | None) -> None:
    ours, theirs = categories(product), categories(floor) if floor else None
    print("\n== summary: own time by kind, whole sweep ==")
    print(
        f"  {'':<28} {'resetctl s':>10} {'share':>6}"
        + (f" {'fair floor s':>12} {'share':>6}" if theirs else "")
    )
    total, other_total = sum(ours.values()), sum(theirs.values()) if theirs else 0.0
    for name in ours:
        line = f"  {name:<28} {ours[name]:>10.3f} {ours[name] / total:>6.1%}"
        if theirs:
            line += f" {theirs[name]:>12.3f} {theirs[name] / other_total:>6.1%}"
        print(line)
    line = f"  {'total profiled':<28} {total:>10.3f} {'':>6}"
    if theirs:
        line += f" {other_total:>12.3f}"
    print(line)
    stats: dict[tuple[str, int, str], Any] = product.stats  # type: ignore[attr-defined]
    rest = sorted(
        ((entry[2], key) for key, entry in stats.items() if kind(key) == "everything else"),
        reverse=True,
    )
    print(
        "  resetctl's 'everything else', largest: "
        + "; ".join(f"{label(key)} {own:.3f} s" for own, key in rest[:5])
    )


def report(title: str, profile: pstats.Stats, top: int) -> None:
    stats: dict[tuple[str, int, str], Any] = profile.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.values())
    print(f"\n== {title}: {total:.3f} s profiled ==")

    def show(heading: str, rows: list[tuple[tuple[str, int, str], Any]], column: int) -> None:
        print(heading)
        print(f"  {'s':>7} {'share':>6} {'calls':>8}  function")
        for key, (_cc, calls, own, cumulative, _callers) in rows[:top]:
            value = own if column == 2 else cumulative
            print(f"  {value:7.3f} {value / total:6.1%} {calls:8d}  {label(key)}")

    by_own = sorted(stats.items(), key=lambda item: -item[1][2])
    show("top by own time (tottime), any code:", by_own, 2)
    ours = [item for item in by_own if PACKAGE in item[0][0]]
    show("top by own time (tottime), resetctl code:", ours, 2)
    body = [item for item in ours if item[1][3] < SPINE * total]
    body.sort(key=lambda item: -item[1][3])
    show(
        f"top by cumulative time, resetctl code (entry points above {SPINE:.0%} left out):",
        body,
        3,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument(
        "--no-floor", action="store_true", help="leave out the fair floor's profile"
    )
    parser.add_argument(
        "--timer",
        choices=("cpu", "wall"),
        default="cpu",
        help="what the profile counts: this process's CPU time (default: a shared machine's"
        " wall time includes waiting for a core) or wall-clock time",
    )
    parser.add_argument("--dump", help="also write the combined profile to this file")
    args = parser.parse_args()
    settings = settings_from_mapping({"outbox": {"email_status": "pending"}})
    clock = Clock(T0)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "profile.db") as store:
        enqueue(store, settings, requests(args.n), T0)
        sweeper = Sweeper(store, settings, build_transports(settings, store, clock), clock=clock)
        options = SweepOptions("bench", BATCH, 60.0)
        # One profiler at a time (each replaces the interpreter's profile hook); the
        # whole sweep is the two stages' statistics added together.
        timer = time.process_time if args.timer == "cpu" else time.perf_counter
        submit, accept = cProfile.Profile(timer), cProfile.Profile(timer)

        started = time.perf_counter()
        submit.enable()
        summary = sweeper.run(options)
        submit.disable()
        submitted = time.perf_counter() - started
        assert summary.submitted == args.n, summary

        with store.transaction() as conn:  # the provider delivers everything (not profiled)
            conn.execute("UPDATE outbox SET status = 'delivered'")
        clock.now = T0 + 15

        started = time.perf_counter()
        accept.enable()
        summary = sweeper.run(options)
        accept.disable()
        accepted = time.perf_counter() - started
        assert summary.accepted == args.n, summary

    print(
        f"sweep of {args.n} notices under cProfile: to submitted {submitted:.2f} s,"
        f" to accepted {accepted:.2f} s wall; profiled by {args.timer} time (profiling"
        " slows Python code, chevron's many small calls most, not SQLite)"
    )
    report("sweep to submitted", pstats.Stats(submit), args.top)
    report("sweep to accepted", pstats.Stats(accept), args.top)
    both = pstats.Stats(submit).add(accept)
    report("whole sweep (both stages)", both, args.top)
    floor = None
    if not args.no_floor:
        profile = cProfile.Profile(timer)
        with tempfile.TemporaryDirectory() as tmp:
            run_fair_floor(Path(tmp) / "floor.db", args.n, profile)
        floor = pstats.Stats(profile)
    by_kind(both, floor)
    if args.dump:
        both.dump_stats(args.dump)
        print(f"\nwrote {args.dump} (python -m pstats {args.dump})")


if __name__ == "__main__":
    main()
