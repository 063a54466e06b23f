"""Does ``replay`` give the right answer? A ground truth run for real, exported, replayed.

A few hundred resets with true provider delays chosen in advance (log-normal delivery
times, bounces, messages that never answer, SMS handed to the carrier before delivery)
are run through the real sweep: crontab-style ``sweep --max-runtime 55s`` every minute of
an injected clock, each starting 0.2 to 0.5 s after its minute as cron's do, notices
enqueued at their arrival (no ``--send``), and a scripted transport that reports each
message's true status by its true delay, each call taking ``--call-time`` seconds of that
clock. The run under the current policy is exported with
``export-timings`` and replayed under the current policy and three candidates (earlier
reads, later reads, a larger fallback reserve); each candidate is also run for real on
the same ground truth. For every figure it checks that the real value lies inside
replay's range and that the point estimate moves the same way as reality. For contrast
it also replays the same export read the old way (each status at the read that first
showed it, a channel without a timeline never answering).

Examples:

    python bench/fidelity.py                     # 300 notices, seed 1
    python bench/fidelity.py --notices 500 --seed 7 --json
    python bench/fidelity.py --seeds 1-10        # one line per seed and candidate
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resetctl.config import Settings, settings_from_mapping, with_overrides
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.ops import health
from resetctl.replay import (
    Candidate,
    SimulationOptions,
    percentile,
    read_header,
    replay,
    with_header,
)
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.timings import export_timings
from resetctl.transports import Message, ProviderStatus
from resetctl.work import SweepOptions

#: 2026-01-01T00:00:00Z: cron fires on this clock's minutes.
EPOCH = 1767225600.0
MAX_RUNTIME = 55.0
#: Cron starts each sweep this long after its minute (seconds, uniform), as measured.
CRON_START = (0.2, 0.5)
CANDIDATES: dict[str, list[str]] = {
    "current": [],
    "earlier reads": ["email.poll_delays=10,30,90"],
    "later reads": ["email.poll_delays=20,60,150"],
    "reserve 8m10s": ["fallback_reserve=8m10s"],
}
#: A change of at most this share of the notices counts as no change (either way).
FLAT_SHARE = 0.01
#: The figures compared (messages per channel are two more).
FIGURES = (
    "accepted",
    "accepted_primary",
    "escalated",
    "expired",
    "failed",
    "both_channels",
    "late_primary_after_fallback",
    "status_reads",
    "would_page",
)


@dataclass(frozen=True, slots=True)
class TrueTimeline:
    """One message's true statuses by seconds after its submission."""

    changes: tuple[tuple[float, str], ...]

    def status_at(self, offset: float) -> str:
        current = "pending"
        for at, status in self.changes:
            if at <= offset:
                current = status
        return current

    def first(self, statuses: frozenset[str]) -> float | None:
        return next((at for at, status in self.changes if status in statuses), None)


@dataclass(frozen=True, slots=True)
class Truth:
    """One reset's ground truth."""

    key: str
    arrival: float
    email: TrueTimeline
    sms: TrueTimeline


def ground_truth(count: int, seed: int) -> list[Truth]:
    """``count`` resets over about 20 s apart, with their true provider timelines."""
    rng = random.Random(seed)
    at = EPOCH + rng.uniform(0, 60)
    truths = []
    for number in range(count):
        at += rng.expovariate(1 / 20)
        roll = rng.random()
        if roll < 0.78:
            email = TrueTimeline(((rng.lognormvariate(math.log(25), 1.0), "delivered"),))
        elif roll < 0.83:
            email = TrueTimeline(((rng.lognormvariate(math.log(20), 0.8), "failed"),))
        else:
            email = TrueTimeline(())  # never answers
        roll = rng.random()
        sent = rng.uniform(0.5, 4.0)
        if roll < 0.92:
            final = (sent + rng.lognormvariate(math.log(10), 0.8), "delivered")
            sms = TrueTimeline(((sent, "accepted"), final))
        elif roll < 0.95:
            sms = TrueTimeline(((sent, "accepted"), (sent + rng.uniform(5, 40), "failed")))
        else:
            sms = TrueTimeline(((sent, "accepted"),))  # handed over, never confirmed
        truths.append(Truth(f"reset-{number}", at, email, sms))
    return truths


@dataclass
class World:
    """The injected clock: sleeping moves time and lets resets arrive on the way."""

    now: float
    arrivals: list[Truth]
    on_arrival: Callable[[Truth], None]
    call_time: float

    def clock(self) -> float:
        return self.now

    def move_to(self, moment: float) -> None:
        while self.arrivals and self.arrivals[0].arrival <= moment:
            truth = self.arrivals.pop(0)
            self.now = max(self.now, truth.arrival)
            self.on_arrival(truth)
        self.now = max(self.now, moment)

    def sleep(self, seconds: float) -> None:
        self.move_to(self.now + seconds)


@dataclass
class TruthTransport:
    """Reports each message's true status by its true delay; every call takes time."""

    channel: str
    world: World
    truth_of: dict[str, Truth]
    name: str = "outbox"
    recovers_by_key: bool = True
    #: 0: the sweep calls it on its own thread. On the pool's threads, calls moved the one
    #: shared clock in whatever order they ran (a seed did not replay the same run twice),
    #: and an arrival during a call was enqueued from that thread on the sweep's
    #: connection (which once broke a run with OperationalError).
    call_timeout: float = 0.0
    sent: dict[str, tuple[TrueTimeline, float]] = field(default_factory=dict)

    def _reply(self, message_id: str) -> ProviderStatus:
        timeline, submitted = self.sent[message_id]
        raw = timeline.status_at(self.world.now - submitted)
        return ProviderStatus(message_id, raw, Status(raw))

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        self.world.sleep(self.world.call_time)
        truth = self.truth_of[message.notice_id]
        timeline = truth.email if self.channel == "email" else truth.sms
        message_id = f"{self.channel}-{message.notice_id}"
        self.sent.setdefault(message_id, (timeline, self.world.now))
        return self._reply(message_id)

    def status(self, message_id: str) -> ProviderStatus:
        self.world.sleep(self.world.call_time)
        return self._reply(message_id)

    def close(self) -> None:
        pass


def settings_for(overrides: list[str]) -> Settings:
    data = with_overrides({}, overrides) if overrides else {}
    return settings_from_mapping(data, "fidelity")


def cron_starts(seed: int, minutes: int = 100_000) -> list[float]:
    """Seconds after each minute that cron starts that minute's sweep (one per minute)."""
    rng = random.Random(f"cron-{seed}")
    return [rng.uniform(*CRON_START) for _ in range(minutes)]


def run_for_real(
    truths: list[Truth],
    settings: Settings,
    path: Path,
    call_time: float,
    starts: list[float] | None = None,
) -> tuple[Store, dict[str, Any]]:
    """The ground truth through real cron sweeps, each started ``starts[n]`` seconds after
    its minute (default: on it); the store and its real figures."""
    store = Store(path)
    truth_of: dict[str, Truth] = {}

    def arrive(truth: Truth) -> None:
        request = {
            "idempotency_key": truth.key,
            "email": f"{truth.key}@example.com",
            "phone": "+14155550123",
            "reset_url": "https://shop.example/r/x",
        }
        (result,) = enqueue(store, settings, [request], world.now)
        truth_of[result.notice_id] = truth

    world = World(EPOCH, list(truths), arrive, call_time)
    transports = {c: TruthTransport(c, world, truth_of) for c in ("email", "sms")}
    sweeper = Sweeper(store, settings, transports, clock=world.clock, sleep=world.sleep)
    tick = EPOCH
    minute = 0
    while world.arrivals or store.next_due_at() is not None:
        world.move_to(tick + (starts[minute] if starts else 0.0))
        sweeper.run(SweepOptions(f"cron-{tick:.0f}", 50, 60.0, MAX_RUNTIME))
        tick += 60
        minute += 1
    return store, real_figures(store, truth_of)


def real_figures(store: Store, truth_of: dict[str, Truth]) -> dict[str, Any]:
    """The figures replay reports, counted from the database and the ground truth."""
    figures: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    rows = store.conn.execute(
        "SELECT id, phase, reason, created_at, expires_at, phase_since FROM notices"
    ).fetchall()
    to_accept: list[float] = []
    for notice_id, phase, reason, created_at, expires_at, phase_since in rows:
        attempts = {
            channel: (started, submitted)
            for channel, started, submitted in store.conn.execute(
                "SELECT channel, started_at, submitted_at FROM attempts WHERE notice_id = ?",
                (notice_id,),
            )
        }
        sent.update(attempts.keys())
        figures[phase] += 1
        if phase == "accepted":
            to_accept.append(phase_since - created_at)
        if phase == "accepted" and "sms" not in attempts:
            figures["accepted_primary"] += 1
        if "sms" in attempts:
            figures["escalated"] += 1
            figures["both_channels"] += 1
            success = truth_of[notice_id].email.first(frozenset({"accepted", "delivered"}))
            started, _ = attempts["sms"]
            email_at = attempts["email"][1]
            if success is not None and started < email_at + success < expires_at:
                figures["late_primary_after_fallback"] += 1
        if phase == "expired" and reason in (
            "fallback_reserve_not_met",
            "no_useful_time",
            "link_expired",
        ):
            figures["would_page"] += 1
    (reads,) = store.conn.execute(
        "SELECT COUNT(*) FROM observations WHERE source = 'poll'"
    ).fetchone()
    result: dict[str, Any] = {key: figures[key] for key in FIGURES if key != "status_reads"}
    result["status_reads"] = int(reads)
    result["messages_sent"] = {"email": sent["email"], "sms": sent["sms"]}
    result["time_to_acceptance"] = {"p95": percentile(sorted(to_accept), 0.95)}
    return result


def as_version_1(lines: list[str]) -> list[str]:
    """The same export read the old way: each status at the read that first showed it,
    whole seconds, no end of observation (a channel without a timeline never answers)."""
    old = []
    for text in lines:
        data = json.loads(text)
        if "timings" in data:
            continue
        data.pop("version")
        for channel in ("email", "sms"):
            if channel in data:
                seen = data[channel]["seen"]
                data[channel] = [[math.floor(by / 1000), raw] for _, by, raw in seen]
        old.append(json.dumps(data))
    return old


def flat(figures: dict[str, Any]) -> dict[str, float]:
    values = {key: figures[key] for key in FIGURES}
    for channel in ("email", "sms"):
        values[f"messages_sent.{channel}"] = figures["messages_sent"][channel]
    return values


def move(value: float, flat: float) -> int:
    """Up (1), down (-1) or flat (0): a change within ``flat`` is noise, not a direction."""
    return 0 if abs(value) <= flat else (value > 0) - (value < 0)


def compare(notices: int, seed: int, replay_seed: int, call_time: float) -> dict[str, Any]:
    """One ground truth run for real under every candidate, exported, replayed: a row per
    candidate and figure, the failures, and what the export's header measured."""
    truths = ground_truth(notices, seed)
    starts = cron_starts(seed)
    real: dict[str, dict[str, float]] = {}
    real_p95: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="resetctl-fidelity-") as directory:
        exported: list[str] = []
        for name, overrides in CANDIDATES.items():
            path = Path(directory) / f"{len(real)}.db"
            store, figures = run_for_real(truths, settings_for(overrides), path, call_time, starts)
            real[name] = flat(figures)
            real_p95[name] = figures["time_to_acceptance"]["p95"]
            if name == "current":
                exported = [json.dumps(t) for t in export_timings(store, 0, math.inf)]
                observed_late = health(store, EPOCH + 10**6, 10**7)["late_primary_after_fallback"]
            store.close()

    candidates = [Candidate(name, settings_for(o).policies) for name, o in CANDIDATES.items()]
    base = SimulationOptions(max_runtime=MAX_RUNTIME, call_time=call_time)
    options_v2 = with_header(base, read_header(exported))
    result = replay(exported, candidates, options_v2, seed=replay_seed)
    old = replay(as_version_1(exported), candidates, base)
    reports = {r.policy: r for r in result.reports}
    old_reports = {r.policy: flat(r.to_json()) for r in old.reports}

    rows = []
    failures = []
    p95s = []
    for name in CANDIDATES:
        report = reports[name]
        point = flat(report.to_json())
        ranges = report.ranges()
        for figure, value in real[name].items():
            low, high = ranges[figure]
            inside = low <= value <= high
            direction = None
            if name != "current":
                noise = max(1.0, FLAT_SHARE * notices)
                real_move = move(value - real["current"][figure], noise)
                current_point = flat(reports["current"].to_json())[figure]
                point_move = move(point[figure] - current_point, noise)
                direction = real_move == point_move
            rows.append(
                {
                    "policy": name,
                    "figure": figure,
                    "real": value,
                    "low": low,
                    "high": high,
                    "point": point[figure],
                    "old_replay": old_reports[name][figure],
                    "inside": inside,
                    "direction": direction,
                }
            )
            if not inside or direction is False:
                failures.append(rows[-1])
        readings = [report.stats, report.optimistic, report.pessimistic]
        values = [percentile(sorted(s.time_to_acceptance), 0.95) or 0.0 for s in readings]
        p95s.append(
            {
                "policy": name,
                "real": real_p95[name],
                "low": min(values),
                "high": max(values),
                "point": values[0],
            }
        )
    return {
        "seed": seed,
        "rows": rows,
        "failures": failures,
        "time_to_acceptance_p95": p95s,
        "header": result.header,
        "observed_late": observed_late,
        "borrowed": {r.policy: dict(r.stats.borrowed) for r in result.reports},
    }


def print_one(notices: int, comparison: dict[str, Any]) -> None:
    """The comparison of one seed as a table, a row per candidate and figure."""
    header = comparison["header"]
    print(
        f"{notices} notices, seed {comparison['seed']}; header: first sweep"
        f" {header.first_sweep_at} s after the first arrival, sweeps start"
        f" {header.sweep_start_p50} s after the minute (p50), read lag p50"
        f" {header.read_lag_p50} s / p90 {header.read_lag_p90} s; late primary"
        f" successes observed in production (health): {comparison['observed_late']}"
    )
    print(
        "| policy | figure | real | replay range | point | direction | old replay |\n"
        "|---|---|---|---|---|---|---|"
    )
    for row in comparison["rows"]:
        mark = "" if row["inside"] else " **outside**"
        moved = {None: "", True: "same", False: "**opposite**"}[row["direction"]]
        print(
            f"| {row['policy']} | {row['figure']} | {row['real']:g} |"
            f" {row['low']:g} to {row['high']:g}{mark} | {row['point']:g} | {moved} |"
            f" {row['old_replay']:g} |"
        )
    for p95 in comparison["time_to_acceptance_p95"]:
        inside = "" if p95["low"] <= p95["real"] <= p95["high"] else " **outside**"
        print(
            f"| {p95['policy']} | time_to_acceptance.p95 (s) | {p95['real']:.2f} |"
            f" {p95['low']:.2f} to {p95['high']:.2f}{inside} | {p95['point']:.2f} | | |"
        )
    print(f"\nborrowed timelines (point estimate): {comparison['borrowed']}")
    print(f"{len(comparison['failures'])} failures")


#: The figures the per-seed table shows (every figure is checked).
SUMMARY = (
    "accepted",
    "escalated",
    "expired",
    "failed",
    "would_page",
    "late_primary_after_fallback",
)


def print_seeds(comparisons: list[dict[str, Any]]) -> None:
    """A row per seed and candidate: real value and replay's range for the main figures,
    and how many of all the figures fell outside or moved the other way."""
    names = [name.replace("_after_fallback", "") for name in SUMMARY]
    print(
        "| seed | policy | "
        + " | ".join(names)
        + " | time to accept p95 (s) | outside | opposite |\n"
        + "|---" * (len(SUMMARY) + 5)
        + "|"
    )
    for comparison in comparisons:
        for name in CANDIDATES:
            rows = {r["figure"]: r for r in comparison["rows"] if r["policy"] == name}
            cells = []
            for figure in SUMMARY:
                row = rows[figure]
                mark = "" if row["inside"] else " ✗"
                cells.append(f"{row['real']:g} ({row['low']:g}-{row['high']:g}){mark}")
            (p95,) = [p for p in comparison["time_to_acceptance_p95"] if p["policy"] == name]
            mark = "" if p95["low"] <= p95["real"] <= p95["high"] else " ✗"
            cells.append(f"{p95['real']:.1f} ({p95['low']:.1f}-{p95['high']:.1f}){mark}")
            outside = sum(not r["inside"] for r in rows.values())
            opposite = sum(r["direction"] is False for r in rows.values())
            print(
                f"| {comparison['seed']} | {name} | "
                + " | ".join(cells)
                + f" | {outside} | {opposite} |"
            )


def seed_range(text: str) -> list[int]:
    """``1-10`` or ``1,4,7``: the seeds to run."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notices", type=int, default=300, help="resets in the ground truth")
    parser.add_argument("--seed", type=int, default=1, help="ground truth seed")
    parser.add_argument("--seeds", type=seed_range, help="several ground truth seeds: 1-10")
    parser.add_argument("--replay-seed", type=int, default=0, help="replay's --seed")
    parser.add_argument("--call-time", type=float, default=0.05, help="seconds per call")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    options = parser.parse_args()

    seeds = options.seeds or [options.seed]
    comparisons = [
        compare(options.notices, seed, options.replay_seed, options.call_time) for seed in seeds
    ]
    failures = [f for c in comparisons for f in c["failures"]]
    if options.json:
        shown = [
            {k: c[k] for k in ("seed", "rows", "failures", "time_to_acceptance_p95")}
            for c in comparisons
        ]
        json.dump(shown if options.seeds else shown[0], sys.stdout, indent=1)
        print()
    elif options.seeds:
        print_seeds(comparisons)
        print(f"\n{len(failures)} failures over {len(seeds)} seeds")
    else:
        print_one(options.notices, comparisons[0])
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
