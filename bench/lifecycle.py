"""Lifecycle throughput: resetctl against a plain-sqlite3 floor, measured side by side.

N notices are enqueued in one call, swept to submission on the outbox (status pending),
then, with the clock past the first poll and every message delivered, swept to
acceptance. The floor does the same transitions with the fewest statements a careful
hand-written worker would use: a claim with UPDATE … RETURNING, an intent commit, an
outcome commit, a compare-and-set and one event row per transition. Both run on a fresh
file in this process, alternately, so a noisy machine affects both alike.

    python bench/lifecycle.py                 # N = 5,000 and 20,000, 3 rounds each
    python bench/lifecycle.py --sizes 2000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import secrets
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from resetctl.config import settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.sweep import Sweeper, SweepOptions
from resetctl.transports import build_transports

T0 = 1_767_225_600.0
BATCH = 50


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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


def run_resetctl(path: Path, n: int) -> tuple[float, float, float]:
    """Seconds to enqueue, to sweep to submission, to sweep to acceptance."""
    settings = settings_from_mapping({"outbox": {"email_status": "pending"}})
    clock = Clock(T0)
    with Store(path) as store:
        started = time.perf_counter()
        enqueue(store, settings, requests(n), T0)
        enqueued = time.perf_counter()
        sweeper = Sweeper(store, settings, build_transports(settings, store, clock), clock=clock)
        options = SweepOptions("bench", BATCH, 60.0)
        summary = sweeper.run(options)
        submitted = time.perf_counter()
        assert summary.submitted == n, summary
        with store.transaction() as conn:  # the provider delivers everything (not timed)
            conn.execute("UPDATE outbox SET status = 'delivered'")
        clock.now = T0 + 15
        resumed = time.perf_counter()
        summary = sweeper.run(options)
        accepted = time.perf_counter()
        assert summary.accepted == n, summary
    return enqueued - started, submitted - enqueued, accepted - resumed


FLOOR_SCHEMA = """
CREATE TABLE notices (id TEXT PRIMARY KEY, phase TEXT NOT NULL, due_at REAL,
  lease_owner TEXT, lease_token TEXT, lease_expires_at REAL, version INTEGER NOT NULL,
  expires_at REAL NOT NULL);
CREATE INDEX notices_due ON notices (due_at) WHERE due_at IS NOT NULL;
CREATE TABLE secrets (notice_id TEXT PRIMARY KEY, email TEXT, reset_url TEXT);
CREATE TABLE attempts (key TEXT PRIMARY KEY, notice_id TEXT, channel TEXT, state TEXT,
  message_id TEXT, UNIQUE (notice_id, channel));
CREATE TABLE observations (id INTEGER PRIMARY KEY, key TEXT, status TEXT, at REAL);
CREATE TABLE events (id INTEGER PRIMARY KEY, notice_id TEXT, at REAL, kind TEXT,
  old_phase TEXT, new_phase TEXT);
CREATE TABLE outbox (message_id TEXT PRIMARY KEY, key TEXT UNIQUE, status TEXT, body TEXT);
"""


def rendered_payload() -> str:
    """A message as the outbox stores it (subject, text, HTML), rendered once, untimed:
    the floor writes the same bytes per message without paying for templates."""
    from resetctl.render import RenderModel, render_email

    email = render_email(RenderModel("https://shop.example/reset/" + "x" * 16, 10, "Support"), "v1")
    return json.dumps({"subject": email.subject, "text": email.text, "html": email.html})


def run_floor(path: Path, n: int) -> tuple[float, float, float]:
    """The same three stages, hand-written against sqlite3 with the fewest statements."""
    payload = rendered_payload()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executescript(FLOOR_SCHEMA)
    started = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    for i, request in enumerate(requests(n)):
        notice_id = f"n{i}"
        conn.execute(
            "INSERT INTO notices VALUES (?, 'queued', ?, NULL, NULL, NULL, 0, ?)",
            (notice_id, T0, T0 + 600),
        )
        conn.execute(
            "INSERT INTO secrets VALUES (?, ?, ?)",
            (notice_id, request["email"], request["reset_url"]),
        )
    conn.execute("COMMIT")
    enqueued = time.perf_counter()

    def claim(now: float) -> list[tuple[str, int, str]]:
        token = secrets.token_hex(8)
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "UPDATE notices SET lease_owner = 'floor', lease_token = ?, lease_expires_at = ?,"
            " due_at = ?, version = version + 1 WHERE id IN (SELECT id FROM notices"
            " WHERE due_at <= ? ORDER BY due_at LIMIT ?) RETURNING id, version, phase",
            (token, now + 60, now + 60, now, BATCH),
        ).fetchall()
        conn.execute("COMMIT")
        return [(r[0], r[1], token) for r in rows]

    now = T0
    while batch := claim(now):
        for notice_id, version, token in batch:
            (email, url) = conn.execute(
                "SELECT email, reset_url FROM secrets WHERE notice_id = ?", (notice_id,)
            ).fetchone()
            key = f"{notice_id}:email:1"
            conn.execute("BEGIN IMMEDIATE")  # intent
            conn.execute(
                "UPDATE notices SET phase = 'primary_pending', version = version + 1"
                " WHERE id = ? AND version = ? AND lease_token = ?",
                (notice_id, version, token),
            )
            conn.execute(
                "INSERT INTO attempts VALUES (?, ?, 'email', 'intent', NULL)", (key, notice_id)
            )
            conn.execute(
                "INSERT INTO events (notice_id, at, kind, old_phase, new_phase)"
                " VALUES (?, ?, 'intent', 'queued', 'primary_pending')",
                (notice_id, now),
            )
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")  # the transport: the outbox row
            message_id = "obx_" + secrets.token_hex(8)
            conn.execute(
                "INSERT INTO outbox VALUES (?, ?, 'pending', ?)",
                (message_id, key, f"{email}{url}{payload}"),
            )
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")  # outcome
            conn.execute(
                "UPDATE notices SET due_at = ?, lease_owner = NULL, lease_token = NULL,"
                " lease_expires_at = NULL, version = version + 1"
                " WHERE id = ? AND version = ? AND lease_token = ?",
                (now + 15, notice_id, version + 1, token),
            )
            conn.execute(
                "UPDATE attempts SET state = 'submitted', message_id = ? WHERE key = ?",
                (message_id, key),
            )
            conn.execute(
                "INSERT INTO observations (key, status, at) VALUES (?, 'pending', ?)", (key, now)
            )
            conn.execute(
                "INSERT INTO events (notice_id, at, kind, old_phase, new_phase)"
                " VALUES (?, ?, 'outcome', 'primary_pending', 'primary_pending')",
                (notice_id, now),
            )
            conn.execute("COMMIT")
    submitted = time.perf_counter()
    conn.execute("UPDATE outbox SET status = 'delivered'")
    resumed = time.perf_counter()
    now = T0 + 15
    while batch := claim(now):
        for notice_id, version, token in batch:
            key = f"{notice_id}:email:1"
            (message_id,) = conn.execute(
                "SELECT message_id FROM attempts WHERE key = ?", (key,)
            ).fetchone()
            (status,) = conn.execute(
                "SELECT status FROM outbox WHERE message_id = ?", (message_id,)
            ).fetchone()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE notices SET phase = 'accepted', due_at = NULL, lease_owner = NULL,"
                " lease_token = NULL, lease_expires_at = NULL, version = version + 1"
                " WHERE id = ? AND version = ? AND lease_token = ?",
                (notice_id, version, token),
            )
            conn.execute(
                "INSERT INTO observations (key, status, at) VALUES (?, ?, ?)", (key, status, now)
            )
            conn.execute(
                "INSERT INTO events (notice_id, at, kind, old_phase, new_phase)"
                " VALUES (?, ?, 'poll', 'primary_pending', 'accepted')",
                (notice_id, now),
            )
            conn.execute("DELETE FROM secrets WHERE notice_id = ?", (notice_id,))
            conn.execute("COMMIT")
    accepted = time.perf_counter()
    conn.close()
    return enqueued - started, submitted - enqueued, accepted - resumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    header = f"{'N':>7} {'stage':<12} {'resetctl s':>11} {'floor s':>9} {'ratio':>7}"
    print(header + "  (throughput / the floor's)")
    for n in args.sizes:
        ours: list[tuple[float, float, float]] = []
        floor: list[tuple[float, float, float]] = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                floor.append(run_floor(Path(tmp) / "floor.db", n))
                ours.append(run_resetctl(Path(tmp) / "resetctl.db", n))
        for index, stage in enumerate(("enqueue", "to submitted", "to accepted")):
            a = statistics.median(r[index] for r in ours)
            b = statistics.median(r[index] for r in floor)
            print(f"{n:>7} {stage:<12} {a:>11.3f} {b:>9.3f} {b / a:>7.2f}")
        a = statistics.median(sum(r) for r in ours)
        b = statistics.median(sum(r) for r in floor)
        print(f"{n:>7} {'lifecycle':<12} {a:>11.3f} {b:>9.3f} {b / a:>7.2f}   target ≥ 0.50")


if __name__ == "__main__":
    main()
