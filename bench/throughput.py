"""Throughput under provider latency: one resetctl sweep against huey's consumer, same job.

Issue 22: at 50 ms and 200 ms per provider call, 2,000 notices, concurrency 1, 8, 32 and 64,
notices per second, beside huey's consumer doing the same job with the same number of
threads, in the same run. Targets: at 32, resetctl >= 1.0x huey; at 50 ms and 64, resetctl
>= 600 notices/s.

For each cell (latency, concurrency) both systems run on fresh files in a temporary
directory, one after the other, in an order that alternates from cell to cell (the machine
is shared and noisy: compare the ratio, not the absolute rates between runs):

* **resetctl**: ``resetctl.open(db, settings)`` with ``[outbox] latency`` (the outbox
  sleeps that long per submit, a simulated provider call), ``[sweep] concurrency = N``,
  ``[outbox] max_in_flight = N`` and ``[policy.default] batch_size`` (500 by default, so
  that claiming is not the bottleneck) and ``lease = "5m"`` (so that a sequential batch
  never outlives its lease). N notices are enqueued in one ``handle.enqueue`` call (not
  timed); the time is one ``handle.sweep(0.0, concurrency=N)`` pass, from its call to its
  return, by which every notice's first submission is made: the outbox's default email
  status ``accepted`` ends each notice there (email first, the built-in policy).
* **huey**: huey's own consumer (``huey.consumer.Consumer``, ``workers=N``,
  ``worker_type="thread"``, started in this process) on a ``SqliteHuey`` file (WAL,
  ``synchronous = NORMAL`` like resetctl's Store, as in bench/lifecycle.py). N ``send``
  tasks are enqueued first (not timed), each with the notice's contact data as its
  arguments; a task renders the email with the product's own functions, exactly the calls
  the sweep makes (``resetctl.render.render_email`` on a ``RenderModel`` with
  ``minutes_until_expiry``), sleeps the latency (the provider call), then writes an
  outbox-like row (the rendered message as JSON, as the outbox stores it) and marks the
  notice accepted in one commit of the application's own SQLite file (WAL, NORMAL, one
  connection per worker thread). The time runs from ``consumer.start()`` until the N-th
  task has committed. No leases, intents, events or scrubbing: huey's at-least-once tasks
  are all it has.

At concurrency 1 the rate is bound by the latency (at most 1 / latency), so both systems
use fewer notices there (``--notices-at-1``, default 200); the table says so.

Until the concurrent engine lands, ``Handle.sweep`` has no ``concurrency`` keyword: the
script then runs resetctl's sequential engine at concurrency 1 only and prints "engine
without concurrency" in the other cells (huey still runs there).

    python bench/throughput.py                                   # the issue's grid (long)
    python bench/throughput.py --notices 300 --latency 50ms --concurrency 1,8
    python bench/throughput.py --rounds 3 --latency 50ms --concurrency 32,64

Run from the checkout being measured, with its resetctl first on the path
(``PYTHONPATH=. .venv/bin/python bench/throughput.py``); the first line names the resetctl
imported. huey is a bench-only dependency: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import secrets
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import resetctl
from resetctl.config import Settings, settings_from_mapping
from resetctl.durations import parse_duration
from resetctl.errors import ConfigError
from resetctl.render import RenderModel, minutes_until_expiry, render_email

HUEY_MISSING = "huey is not installed: pip install 'huey>=2.5' (or: pip install -e '.[bench]')"
TEMPLATE_VERSION = "v1"  # the built-in policy's
LEASE = "5m"
#: a cell must end well inside the built-in policy's 10-minute links (30 s send reserve)
LINK_SECONDS = 540.0
NO_ENGINE = "engine without concurrency"


def requests(n: int) -> list[dict[str, str]]:
    return [
        {
            "idempotency_key": f"bench-{i}",
            "email": f"user{i}@example.com",
            "phone": "+14155550123",
            "reset_url": f"https://shop.example/reset/{secrets.token_hex(8)}",
        }
        for i in range(n)
    ]


def engine_has_concurrency() -> bool:
    """Whether this resetctl's ``Handle.sweep`` takes ``concurrency=`` (the new engine).

    Read from the signature, so that a TypeError raised inside a sweep is never taken
    for a missing keyword."""
    return "concurrency" in inspect.signature(resetctl.Handle.sweep).parameters


class Resetctl:
    """resetctl's side of every cell; remembers which configuration keys the engine took."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.concurrent = engine_has_concurrency()
        #: whether ``[sweep] concurrency`` and ``[outbox] max_in_flight`` are accepted
        #: (None: not tried yet)
        self.config_keys: bool | None = None

    def settings(self, latency: str, concurrency: int) -> Settings:
        base: dict[str, Any] = {
            "outbox": {"latency": latency},
            "policy": {"default": {"batch_size": self.batch_size, "lease": LEASE}},
        }
        if self.concurrent and self.config_keys is not False:
            full = {
                **base,
                "outbox": {"latency": latency, "max_in_flight": concurrency},
                "sweep": {"concurrency": concurrency},
            }
            try:
                settings = settings_from_mapping(full, "bench")
            except ConfigError as exc:
                if self.config_keys is None:
                    print(f"resetctl: {exc}; concurrency given to sweep() only")
                self.config_keys = False
            else:
                self.config_keys = True
                return settings
        return settings_from_mapping(base, "bench")

    def run(self, where: Path, n: int, latency: str, concurrency: int) -> float:
        """Seconds of one sweep pass that makes the first submission of ``n`` notices."""
        db = where / "resetctl.db"
        with resetctl.open(db, self.settings(latency, concurrency)) as handle:
            results = handle.enqueue(requests(n))
            assert len(results) == n, len(results)
            assert all(r.created for r in results)
            started = time.perf_counter()
            if self.concurrent:
                summary = handle.sweep(0.0, concurrency=concurrency)  # type: ignore[call-arg]
            else:
                assert concurrency == 1, concurrency
                summary = handle.sweep(0.0)
            elapsed = time.perf_counter() - started
        assert summary.submitted == n, summary
        assert summary.accepted == n, summary
        conn = sqlite3.connect(db)
        try:
            (messages,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
        finally:
            conn.close()
        assert messages == n, (messages, n)
        return elapsed


def have_huey() -> bool:
    try:
        import huey  # noqa: F401
    except ImportError:
        return False
    return True


def open_huey(path: Path) -> Any:
    """A SqliteHuey on ``path`` in WAL mode at ``synchronous = NORMAL`` (resetctl's
    durability), as bench/lifecycle.py opens it."""
    from huey import SqliteHuey  # type: ignore[import-untyped]
    from huey.storage import SqliteStorage  # type: ignore[import-untyped]

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> sqlite3.Connection:
            conn: sqlite3.Connection = super()._create_connection()
            conn.execute("PRAGMA synchronous = NORMAL")
            return conn

    huey = SqliteHuey("bench", filename=str(path), storage_class=Storage, journal_mode="wal")
    mode = huey.storage.conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal", mode
    return huey


APP_SCHEMA = """
CREATE TABLE notices (id TEXT PRIMARY KEY, phase TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE outbox (message_id TEXT PRIMARY KEY, notice_id TEXT NOT NULL UNIQUE,
  status TEXT NOT NULL, submitted_at REAL NOT NULL, content TEXT NOT NULL);
"""


class _Done:
    """Counts finished tasks; records when the last one committed, or the first error."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.finished_at: float | None = None
        self.error: BaseException | None = None
        self.event = threading.Event()
        self.lock = threading.Lock()

    def one(self) -> None:
        with self.lock:
            self.count += 1
            if self.count == self.n:
                self.finished_at = time.perf_counter()
                self.event.set()

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = exc
        self.event.set()


def run_huey(where: Path, n: int, latency: float, threads: int, support_label: str) -> float:
    """Seconds for huey's consumer with ``threads`` worker threads to run ``n`` send tasks:
    render the email, wait ``latency`` (the provider call), write the outbox row."""
    from huey.consumer import Consumer  # type: ignore[import-untyped]

    huey = open_huey(where / "huey.db")
    app_path = where / "app.db"
    setup = sqlite3.connect(app_path, isolation_level=None)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.executescript(APP_SCHEMA)
    local = threading.local()
    connections: list[sqlite3.Connection] = []
    connections_lock = threading.Lock()

    def app() -> sqlite3.Connection:
        """This worker thread's connection to the application's database."""
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                app_path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA synchronous = NORMAL")
            local.conn = conn
            with connections_lock:
                connections.append(conn)
        return conn

    done = _Done(n)

    @huey.task()  # type: ignore[untyped-decorator]
    def send(notice_id: str, email: str, reset_url: str, expires_at: float) -> None:
        try:
            now = time.time()
            model = RenderModel(reset_url, minutes_until_expiry(expires_at, now), support_label)
            rendered = render_email(model, TEMPLATE_VERSION)
            time.sleep(latency)  # the provider call
            content = json.dumps(
                {
                    "to": email,
                    "subject": rendered.subject,
                    "text": rendered.text,
                    "html": rendered.html,
                }
            )
            conn = app()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO outbox VALUES (?, ?, 'accepted', ?, ?)",
                    ("obx_" + secrets.token_hex(8), notice_id, time.time(), content),
                )
                conn.execute("UPDATE notices SET phase = 'accepted' WHERE id = ?", (notice_id,))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except BaseException as exc:
            done.fail(exc)
            raise
        done.one()

    now = time.time()
    expires_at = now + 600  # the built-in policy's 10-minute link
    setup.execute("BEGIN IMMEDIATE")
    setup.executemany(
        "INSERT INTO notices VALUES (?, 'queued', ?)", ((f"n{i}", expires_at) for i in range(n))
    )
    setup.execute("COMMIT")
    for i, request in enumerate(requests(n)):
        send(f"n{i}", request["email"], request["reset_url"], expires_at)
    assert huey.pending_count() == n

    consumer = Consumer(
        huey, workers=threads, worker_type="thread", periodic=False, check_worker_health=False
    )
    handlers = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    saved = {signum: signal.getsignal(signum) for signum in handlers}
    started = time.perf_counter()
    consumer.start()  # sets its own signal handlers: restored below
    try:
        finished = done.event.wait(timeout=n * latency / threads * 3 + 120)
    finally:
        consumer.stop(graceful=True)
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    if done.error is not None:
        raise RuntimeError(f"huey task failed: {done.error!r}") from done.error
    assert finished, f"huey: {done.count} of {n} tasks done"
    assert done.finished_at is not None
    elapsed = done.finished_at - started
    (accepted,) = setup.execute("SELECT count(*) FROM notices WHERE phase = 'accepted'").fetchone()
    (messages,) = setup.execute("SELECT count(*) FROM outbox").fetchone()
    assert accepted == messages == n, (accepted, messages, n)
    for conn in [*connections, setup]:
        conn.close()
    huey.storage.close()
    return elapsed


def check_rendering(support_label: str) -> None:
    """Untimed: the huey task stores the message resetctl's outbox stores for the same
    notice (same templates, same data), compared on a one-notice resetctl run that keeps
    the outbox's content."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "check.db"
        settings = settings_from_mapping({"outbox": {"keep_content": True}}, "bench")
        (request,) = requests(1)
        with resetctl.open(db, settings) as handle:
            handle.enqueue([request])
            handle.sweep(0.0)
        conn = sqlite3.connect(db)
        try:
            (expires_at,) = conn.execute("SELECT expires_at FROM notices").fetchone()
            content, submitted_at = conn.execute(
                "SELECT content, submitted_at FROM outbox"
            ).fetchone()
        finally:
            conn.close()
    stored = json.loads(content)
    model = RenderModel(
        request["reset_url"], minutes_until_expiry(expires_at, submitted_at), support_label
    )
    theirs = render_email(model, TEMPLATE_VERSION)
    assert (stored["subject"], stored["text"], stored["html"]) == (
        theirs.subject,
        theirs.text,
        theirs.html,
    ), "the huey task's rendering differs from resetctl's"


def rate(n: int, seconds: float | None) -> float | None:
    return None if seconds is None else n / seconds


def fmt(value: float | None, width: int, spec: str = ".1f") -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def csv_of(parse: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse_all(text: str) -> list[Any]:
        values = [parse(part.strip()) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return values

    return parse_all


def latency_text(text: str) -> str:
    try:
        seconds = parse_duration(text, "--latency")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("a latency must be positive")
    return text


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notices", type=positive, default=2000, help="notices per cell")
    parser.add_argument(
        "--notices-at-1",
        type=positive,
        default=200,
        help="notices per cell at concurrency 1 (latency-bound there)",
    )
    parser.add_argument("--latency", type=csv_of(latency_text), default=["50ms", "200ms"])
    parser.add_argument("--concurrency", type=csv_of(positive), default=[1, 8, 32, 64])
    parser.add_argument(
        "--batch-size", type=positive, default=500, help="resetctl's policy batch_size"
    )
    parser.add_argument(
        "--rounds", type=positive, default=1, help="runs of each cell (medians of rates)"
    )
    parser.add_argument("--no-huey", action="store_true", help="leave huey out")
    args = parser.parse_args()

    with_huey = not args.no_huey and have_huey()
    if not args.no_huey and not with_huey:
        print(HUEY_MISSING)
    ours = Resetctl(args.batch_size)
    support_label = settings_from_mapping({}, "bench").support_label  # the product default
    cells = [
        (lat, parse_duration(lat, "--latency"), c, args.notices_at_1 if c == 1 else args.notices)
        for lat in args.latency
        for c in args.concurrency
    ]
    for lat, seconds, c, n in cells:
        if n * seconds / c > LINK_SECONDS:
            parser.error(
                f"{n} notices at {lat} and concurrency {c} take {n * seconds / c:.0f} s:"
                " longer than the 10-minute links allow; use fewer notices"
            )
    bound = sum(n * s / c for _, s, c, n in cells) * args.rounds * (2 if with_huey else 1)
    print(f"resetctl {resetctl.__file__}; load average {load_average()}")
    print(
        f"engine: {'concurrent' if ours.concurrent else 'sequential (' + NO_ENGINE + ')'};"
        f" policy batch_size {args.batch_size}, lease {LEASE}; huey:"
        f" {'Consumer, thread workers' if with_huey else 'left out'};"
        f" at least {bound:.0f} s of provider latency to wait"
    )
    if 1 in args.concurrency:
        print(
            f"at concurrency 1: {args.notices_at_1} notices per cell, not {args.notices}"
            " (the rate is latency-bound there)"
        )
    check_rendering(support_label)

    # One small untimed run of each: phonenumbers' metadata, CLDR data, template tokens
    # and modules load once per process, for all.
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp)
        (warm / "r").mkdir()
        ours.run(warm / "r", 20, "1ms", 2 if ours.concurrent else 1)
        if with_huey:
            (warm / "h").mkdir()
            run_huey(warm / "h", 20, 0.001, 2, support_label)

    results: list[dict[str, Any]] = []
    print()
    print(
        f"{'latency':>8} {'conc.':>5} {'notices':>7} {'resetctl/s':>11} {'huey/s':>9}"
        f" {'ratio':>6} {'ceiling/s':>9}  first"
    )
    for index, (lat, seconds, c, n) in enumerate(cells):
        ours_s: list[float] = []
        huey_s: list[float] = []
        firsts = []
        runs_ours = ours.concurrent or c == 1
        for round_ in range(args.rounds):
            order = ["resetctl", "huey"] if (index + round_) % 2 == 0 else ["huey", "resetctl"]
            firsts.append(order[0])
            for name in order:
                with tempfile.TemporaryDirectory() as tmp:
                    if name == "resetctl" and runs_ours:
                        ours_s.append(ours.run(Path(tmp), n, lat, c))
                    elif name == "huey" and with_huey:
                        huey_s.append(run_huey(Path(tmp), n, seconds, c, support_label))
        ours_rate = statistics.median(n / s for s in ours_s) if ours_s else None
        huey_rate = statistics.median(n / s for s in huey_s) if huey_s else None
        ratio = ours_rate / huey_rate if ours_rate and huey_rate else None
        print(
            f"{lat:>8} {c:>5} {n:>7} {fmt(ours_rate, 11)} {fmt(huey_rate, 9)}"
            f" {fmt(ratio, 6, '.2f')} {c / seconds:>9.0f}"
            f"  {firsts[0] if args.rounds == 1 else 'alternating'}"
            + ("" if runs_ours else f"  (resetctl: {NO_ENGINE})")
        )
        results.append(
            {
                "latency": lat,
                "latency_s": seconds,
                "concurrency": c,
                "notices": n,
                "resetctl_per_s": ours_rate,
                "huey_per_s": huey_rate,
                "ratio": ratio,
                "resetctl_s": ours_s,
                "huey_s": huey_s,
                "first": firsts,
                "ceiling_per_s": c / seconds,
                "resetctl_status": "ok" if runs_ours else NO_ENGINE,
            }
        )

    targets: list[dict[str, Any]] = []
    for cell in results:
        if cell["concurrency"] == 32:
            value = cell["ratio"]
            targets.append(
                {
                    "target": f"{cell['latency']}, 32: resetctl >= 1.0x huey",
                    "value": value,
                    "met": None if value is None else value >= 1.0,
                }
            )
        if cell["concurrency"] == 64 and math.isclose(cell["latency_s"], 0.05):
            value = cell["resetctl_per_s"]
            targets.append(
                {
                    "target": "50ms, 64: resetctl >= 600 notices/s",
                    "value": value,
                    "met": None if value is None else value >= 600,
                }
            )
    if targets:
        print()
        for target in targets:
            verdict = {None: "not measured", True: "met", False: "not met"}[target["met"]]
            value = "-" if target["value"] is None else f"{target['value']:.2f}"
            print(f"target {target['target']}: {value} ({verdict})")
    print(
        "ratio = resetctl's notices/s ÷ huey's (above 1: resetctl is faster);"
        " ceiling = concurrency ÷ latency"
    )
    print(
        json.dumps(
            {
                "benchmark": "throughput",
                "resetctl": resetctl.__file__,
                "engine": "concurrent" if ours.concurrent else "sequential",
                "config_keys": ours.config_keys,
                "batch_size": args.batch_size,
                "lease": LEASE,
                "rounds": args.rounds,
                "load_average": load_average(),
                "cells": results,
                "targets": targets,
            }
        )
    )


if __name__ == "__main__":
    main()
