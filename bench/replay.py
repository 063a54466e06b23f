"""Benchmark ``resetctl replay`` on production-shaped traces.

Generates a deterministic trace file (Poisson arrivals with bursts, log-normal receipt
latencies, a few percent bounces and never-answered messages), then times
``python -m resetctl replay FILE --json`` as a child process, once with the current
policy and once with ``--set email.poll_delays=10,30,90`` added (two policies in one
pass). Speed is reported as traces per second per policy and as a ratio to the target
(10,000 traces/s/policy on 2 cores); peak memory as the child's peak RSS against 300 MB.
Beside each, the time just to read the file and ``json.loads`` each line, so a reader
sees how much of replay's time is simulation.

Examples:

    python bench/replay.py                              # 100,000 traces, 3 runs each
    python bench/replay.py --traces 1000000 --memory    # peak RSS for 1,000,000 traces
    python bench/replay.py --traces 100000 --profile    # cProfile of one replay run
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import io
import json
import math
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGET_TRACES_PER_SECOND = 10_000  # per policy, on a 2-core machine
TARGET_PEAK_RSS_MB = 300  # for 1,000,000 traces
SECOND_POLICY = "email.poll_delays=10,30,90"
REPO = Path(__file__).resolve().parent.parent
SIMULATION_FRAMES = r"resetctl/(replay|machine|config|transports)|dataclasses"


@dataclass(frozen=True, slots=True)
class ChannelShape:
    """How one channel's provider answers, as shares and log-normal latencies."""

    #: share of messages that end delivered
    delivered: float
    #: share that bounce (a final "failed")
    failed: float
    #: share that never answer (no timeline, or only "pending")
    silent: float
    #: median and sigma of the delivery latency, seconds (the rest end "unknown")
    delivered_median: float
    delivered_sigma: float
    #: median and sigma of the bounce latency, seconds
    failed_median: float
    failed_sigma: float
    #: chance of an explicit "pending" at submission
    pending_first: float
    #: chance of an "accepted" receipt before the final status
    accepted_first: float


EMAIL = ChannelShape(
    delivered=0.90,
    failed=0.03,
    silent=0.05,
    delivered_median=8.0,
    delivered_sigma=1.1,
    failed_median=20.0,
    failed_sigma=1.0,
    pending_first=0.4,
    accepted_first=0.15,
)
SMS = ChannelShape(
    delivered=0.95,
    failed=0.02,
    silent=0.025,
    delivered_median=5.0,
    delivered_sigma=0.9,
    failed_median=10.0,
    failed_sigma=0.8,
    pending_first=0.3,
    accepted_first=0.1,
)
#: base arrivals per second, and the bursts on top of them
ARRIVAL_RATE = 3.0
BURST_GAP_MEAN = 240.0
BURST_SIZE = (200, 600)
BURST_SPAN = (5.0, 30.0)
#: providers slow down while a burst is being delivered
BURST_LATENCY_FACTOR = 2.0
#: link lifetimes in seconds, by share
TTLS = ((600, 0.85), (900, 0.10), (300, 0.05))


def arrivals(rng: random.Random, count: int) -> Iterator[tuple[float, bool]]:
    """``count`` arrival times in order, each flagged True when it is part of a burst."""
    bursting: list[float] = []
    base = rng.expovariate(ARRIVAL_RATE)
    next_burst = rng.expovariate(1 / BURST_GAP_MEAN)
    emitted = 0
    while emitted < count:
        # Expand a burst only once nothing earlier is left, so the output stays sorted.
        if next_burst <= base and (not bursting or next_burst <= bursting[0]):
            span = rng.uniform(*BURST_SPAN)
            for _ in range(rng.randint(*BURST_SIZE)):
                heapq.heappush(bursting, next_burst + rng.random() * span)
            next_burst += rng.expovariate(1 / BURST_GAP_MEAN)
            continue
        if bursting and bursting[0] < base:
            yield heapq.heappop(bursting), True
        else:
            yield base, False
            base += rng.expovariate(ARRIVAL_RATE)
        emitted += 1


def timeline(rng: random.Random, shape: ChannelShape, slow: bool) -> list[list[Any]] | None:
    """One channel's receipts as whole-second offsets (as export-timings writes them)."""
    scale = BURST_LATENCY_FACTOR if slow else 1.0
    roll = rng.random()
    entries: list[list[Any]] = []
    if rng.random() < shape.pending_first:
        entries.append([0, "pending"])
    if roll >= shape.delivered + shape.failed:
        if roll < shape.delivered + shape.failed + shape.silent:
            if not entries and rng.random() < 0.5:
                return None
            later = math.floor(rng.lognormvariate(math.log(30), 1.0))
            return [*entries, [later, "pending"]] if rng.random() < 0.5 else entries
        final = "unknown"
        latency = rng.lognormvariate(math.log(shape.delivered_median), shape.delivered_sigma)
    elif roll < shape.delivered:
        final = "delivered"
        latency = rng.lognormvariate(math.log(shape.delivered_median), shape.delivered_sigma)
    else:
        final = "failed"
        latency = rng.lognormvariate(math.log(shape.failed_median), shape.failed_sigma)
    latency *= scale
    if final != "unknown" and rng.random() < shape.accepted_first:
        entries.append([math.floor(latency * rng.uniform(0.05, 0.5)), "accepted"])
    entries.append([math.floor(latency), final])
    return entries


def pick_ttl(rng: random.Random) -> int:
    """A link lifetime drawn from TTLS."""
    roll = rng.random()
    for ttl, share in TTLS:
        if roll < share:
            return ttl
        roll -= share
    return TTLS[0][0]


#: Reads export-timings would have made (seconds after submission): the submission's own
#: reply, then the default poll schedule.
READS = (0.0, 15.0, 45.0, 105.0)


def as_observed(entries: list[list[Any]] | None, rng: random.Random) -> dict[str, Any] | None:
    """A timeline as format 2 records it: each change between the read before it and the
    read that showed it (ms, with up to 200 ms of lag), up to the last read."""
    if entries is None:
        return None
    lag = [0] + [round(at * 1000) + rng.randrange(200) for at in READS[1:]]
    seen: list[list[Any]] = []
    end = 0
    for offset, raw in entries:
        index = next((i for i, at in enumerate(READS) if offset <= at), None)
        if index is None:
            break  # after the last read: never observed
        by = lag[index]
        after = lag[index - 1] if index else 0
        if seen and seen[-1][1] == by:
            seen[-1][2] = raw  # two changes between the same reads: the later one shows
            continue
        seen.append([after, by, raw])
        end = by
        if raw in ("delivered", "failed"):
            break
    else:
        end = lag[-1]
    return {"seen": seen, "end_ms": max(end, seen[-1][1] if seen else 0)}


def generate(path: Path, count: int, seed: int, version: int = 2) -> None:
    """Write ``count`` traces to ``path`` as JSON Lines, sorted by arrival."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        if version == 2:
            header = {"timings": 2, "sweep_interval": 60.0, "first_sweep_at": 20.0}
            out.write(json.dumps(header) + "\n")
        for number, (at, burst) in enumerate(arrivals(rng, count), start=1):
            trace: dict[str, Any] = {
                "trace_id": f"t{number:07d}",
                "region": "default",
                "arrived_at": round(at, 3),
                "ttl": pick_ttl(rng),
            }
            if version == 2:
                trace["version"] = 2
            for channel, shape in (("email", EMAIL), ("sms", SMS)):
                entries = timeline(rng, shape, burst)
                if version == 2:
                    observed = as_observed(entries, rng)
                    # Half the unused SMS are absent, as an export writes them: borrowed.
                    if observed is not None and not (channel == "sms" and rng.random() < 0.5):
                        trace[channel] = observed
                elif entries is not None:
                    trace[channel] = entries
            out.write(json.dumps(trace, separators=(",", ":")) + "\n")


@dataclass(frozen=True, slots=True)
class ChildRun:
    """One child process: wall and CPU seconds, peak RSS and what it printed."""

    seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    stdout: str


def run_child(argv: list[str]) -> ChildRun:
    """Run ``argv``, timing its wall clock and reading its own peak RSS via wait4."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, cwd=REPO)
        assert process.stderr is not None
        errors = process.stderr.read()
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        process.stderr.close()
        if process.returncode != 0:
            sys.exit(f"{' '.join(argv)} exited {process.returncode}:\n{errors.decode()}")
        out.seek(0)
        cpu = usage.ru_utime + usage.ru_stime
        # ru_maxrss is in kilobytes on Linux.
        return ChildRun(seconds, cpu, usage.ru_maxrss / 1024, out.read())


def replay_argv(path: Path, policies: int) -> list[str]:
    """The command line replaying ``path`` under one or two policies."""
    argv = [sys.executable, "-m", "resetctl", "replay", str(path), "--json"]
    return [*argv, "--set", SECOND_POLICY] if policies == 2 else argv


def parse_floor(path: Path) -> float:
    """Seconds to read ``path`` and json.loads every line, and nothing else."""
    started = time.perf_counter()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            json.loads(line)
    return time.perf_counter() - started


def startup_floor() -> float:
    """Seconds for the child to start and replay an empty file (imports, config)."""
    with tempfile.TemporaryDirectory() as directory:
        empty = Path(directory) / "empty.jsonl"
        empty.touch()
        return run_child(replay_argv(empty, 1)).seconds


def check(run: ChildRun, traces: int, policies: int) -> list[dict[str, Any]]:
    """The child's reports, after checking each saw every trace."""
    reports: list[dict[str, Any]] = json.loads(run.stdout)
    if len(reports) != policies or any(r["notices"] != traces for r in reports):
        sys.exit(f"unexpected replay output: {run.stdout[:500]}")
    return reports


def measure(path: Path, traces: int, repeats: int) -> None:
    """Time replay under one and two policies; print the table and the outcomes."""
    floors = [parse_floor(path) for _ in range(repeats)]
    floor = statistics.median(floors)
    startup = statistics.median(startup_floor() for _ in range(repeats))
    print(f"child start-up (empty file), median of {repeats}: {startup:.2f} s")
    rows = []
    outcomes: list[dict[str, Any]] = []
    for policies in (1, 2):
        runs = [run_child(replay_argv(path, policies)) for _ in range(repeats)]
        outcomes = check(runs[0], traces, policies)
        seconds = statistics.median(r.seconds for r in runs)
        cpu = statistics.median(r.cpu_seconds for r in runs)
        rss = max(r.peak_rss_mb for r in runs)
        rows.append((policies, seconds, cpu, rss, [r.seconds for r in runs]))
    header = (
        f"{'traces':>9} {'policies':>8} {'seconds':>8} {'cpu s':>6} {'traces/s/policy':>15}"
        f" {'ratio to 10k':>12} {'parse floor s':>13} {'floor share':>11} {'peak RSS MB':>11}"
    )
    print(f"\nmedian of {repeats} runs; target {TARGET_TRACES_PER_SECOND:,} traces/s/policy")
    print(header)
    for policies, seconds, cpu, rss, _ in rows:
        rate = traces * policies / seconds
        print(
            f"{traces:>9,} {policies:>8} {seconds:>8.2f} {cpu:>6.2f} {rate:>15,.0f}"
            f" {rate / TARGET_TRACES_PER_SECOND:>12.2f} {floor:>13.2f}"
            f" {floor / seconds:>11.1%} {rss:>11.0f}"
        )
    for policies, *_, samples in rows:
        print(f"  {policies} policies, all runs: {', '.join(f'{s:.2f}' for s in samples)} s")
    print(f"  parse floor, all runs: {', '.join(f'{s:.2f}' for s in floors)} s")
    print("\noutcomes (shape check)")
    for report in outcomes:
        keys = ("accepted", "accepted_primary", "escalated", "expired", "failed", "would_page")
        shares = ", ".join(f"{key} {report[key] / traces:.1%}" for key in keys)
        print(f"  {report['policy']}: {shares}")


def measure_memory(path: Path, traces: int) -> None:
    """One replay child per policy count; its peak RSS against the target."""
    print(f"\npeak RSS target: {TARGET_PEAK_RSS_MB} MB for 1,000,000 traces")
    print(
        f"{'traces':>9} {'policies':>8} {'seconds':>8} {'cpu s':>6} {'traces/s/policy':>15}"
        f" {'peak RSS MB':>11}"
    )
    for policies in (1, 2):
        run = run_child(replay_argv(path, policies))
        check(run, traces, policies)
        rate = traces * policies / run.seconds
        print(
            f"{traces:>9,} {policies:>8} {run.seconds:>8.2f} {run.cpu_seconds:>6.2f}"
            f" {rate:>15,.0f} {run.peak_rss_mb:>11.0f}"
            f"  ({run.peak_rss_mb / TARGET_PEAK_RSS_MB:.2f} of target)"
        )


def profile(path: Path, top: int) -> None:
    """cProfile one in-process replay under two policies; print the top functions."""
    from resetctl.cli import app

    argv = ["replay", str(path), "--json", "--set", SECOND_POLICY]
    profiler = cProfile.Profile()
    stdout = sys.stdout
    sys.stdout = io.StringIO()
    try:
        profiler.runcall(app, argv, standalone_mode=False)
    finally:
        sys.stdout = stdout
    stats = pstats.Stats(profiler, stream=sys.stdout)
    print(f"\ntop {top} by tottime")
    stats.sort_stats("tottime").print_stats(top)
    # The CLI's frames wrap the whole run; below them, only the simulation's own parts.
    print(f"\ntop {top} by cumulative time, resetctl's simulation and dataclasses only")
    stats.sort_stats("cumulative").print_stats(SIMULATION_FRAMES, top)
    stats.print_callers(r"\(replace\)|\(decide\)")


def main() -> None:
    """Parse options, generate the trace file and measure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=100_000, help="traces to generate")
    parser.add_argument("--seed", type=int, default=1, help="random seed (deterministic)")
    parser.add_argument(
        "--format", type=int, choices=(1, 2), default=2, help="trace format version"
    )
    parser.add_argument("--out", type=Path, help="trace file to write [default: a temp dir]")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    parser.add_argument("--memory", action="store_true", help="measure peak RSS only")
    parser.add_argument("--profile", action="store_true", help="cProfile one replay run")
    parser.add_argument("--top", type=int, default=10, help="functions shown by --profile")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="resetctl-bench-") as directory:
        path = options.out or Path(directory) / f"traces-{options.traces}.jsonl"
        started = time.perf_counter()
        generate(path, options.traces, options.seed, options.format)
        size = path.stat().st_size / 1e6
        elapsed = time.perf_counter() - started
        print(
            f"generated {options.traces:,} traces, format {options.format} ({size:.1f} MB)"
            f" in {elapsed:.1f} s: {path}"
        )
        # Other work on the machine shows up as wall time above CPU time.
        load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load}")
        if options.profile:
            profile(path, options.top)
        elif options.memory:
            measure_memory(path, options.traces)
        else:
            measure(path, options.traces, options.repeats)


if __name__ == "__main__":
    main()
