"""Lifecycle throughput: resetctl against two floors and huey, measured side by side.

N notices are enqueued in one call, swept to submission on the outbox (status pending),
then, with the clock past the first poll and every message delivered, swept to
acceptance. Four runs share each round, on fresh files in this process, in an order that
rotates from round to round, so a noisy machine affects them alike:

* the **raw floor**: the same transitions with the fewest statements a careful
  hand-written worker would use: a claim with UPDATE … RETURNING, an intent commit, an
  outcome commit, a compare-and-set and one event row per transition; it writes
  pre-rendered bytes and validates nothing;
* the **fair floor**: the raw floor's statements plus the work no real product can skip:
  enqueue validates every email (email-validator) and phone (phonenumbers), and the
  submit stage renders the product's three email templates per message with chevron and
  stores the rendered message in the outbox row, in the same commit as the outcome;
* **huey**'s simplest task path: SqliteHuey (WAL, synchronous as resetctl's Store sets
  it), N calls of a no-op task enqueued, then dequeued and executed one by one in this
  process, as huey's consumer worker loop does (``huey.dequeue()``, ``huey.execute()``);
* **huey doing the product's work** (``hwork``): the fair floor's work on huey's task
  path: enqueue validates and enqueues a ``send`` task; ``send`` renders, writes the
  outbox row and enqueues a ``poll``; ``poll`` ends the notice and scrubs the row.

Ratios are throughputs: the other's time / resetctl's time (above 1: resetctl is faster).

    python bench/lifecycle.py                     # N = 5,000, 3 rounds
    python bench/lifecycle.py --sizes 2000 --rounds 1
    python bench/lifecycle.py --huey-fsync        # also huey at its default (FULL) sync

huey is a bench-only dependency: ``pip install huey`` (or the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import math
import secrets
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import chevron
import email_validator
import phonenumbers
from babel.numbers import format_decimal
from babel.units import format_unit
from chevron.tokenizer import tokenize

from resetctl.config import settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports
from resetctl.work import SweepOptions

T0 = 1_767_225_600.0
BATCH = 50


class Mark(NamedTuple):
    """A moment (or a span): wall-clock seconds and this process's CPU seconds."""

    wall: float
    cpu: float


def mark() -> Mark:
    return Mark(time.perf_counter(), time.process_time())


def span(start: Mark, end: Mark) -> Mark:
    return Mark(end.wall - start.wall, end.cpu - start.cpu)


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


def run_resetctl(path: Path, n: int) -> tuple[Mark, Mark, Mark]:
    """Seconds to enqueue, to sweep to submission, to sweep to acceptance."""
    settings = settings_from_mapping({"outbox": {"email_status": "pending"}})
    clock = Clock(T0)
    with Store(path) as store:
        started = mark()
        enqueue(store, settings, requests(n), T0)
        enqueued = mark()
        sweeper = Sweeper(store, settings, build_transports(settings, store, clock), clock=clock)
        options = SweepOptions("bench", BATCH, 60.0)
        summary = sweeper.run(options)
        submitted = mark()
        assert summary.submitted == n, summary
        with store.transaction() as conn:  # the provider delivers everything (not timed)
            conn.execute("UPDATE outbox SET status = 'delivered'")
        clock.now = T0 + 15
        resumed = mark()
        summary = sweeper.run(options)
        accepted = mark()
        assert summary.accepted == n, summary
    return span(started, enqueued), span(enqueued, submitted), span(resumed, accepted)


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


def _accept(conn: sqlite3.Connection, notice_id: str, version: int, token: str, now: float) -> None:
    """Both floors' acceptance of one notice: read its status, end it, scrub its secrets."""
    key = f"{notice_id}:email:1"
    (message_id,) = conn.execute("SELECT message_id FROM attempts WHERE key = ?", (key,)).fetchone()
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
    conn.execute("INSERT INTO observations (key, status, at) VALUES (?, ?, ?)", (key, status, now))
    conn.execute(
        "INSERT INTO events (notice_id, at, kind, old_phase, new_phase)"
        " VALUES (?, ?, 'poll', 'primary_pending', 'accepted')",
        (notice_id, now),
    )
    conn.execute("DELETE FROM secrets WHERE notice_id = ?", (notice_id,))
    conn.execute("COMMIT")


def run_floor(path: Path, n: int) -> tuple[Mark, Mark, Mark]:
    """The same three stages, hand-written against sqlite3 with the fewest statements."""
    payload = rendered_payload()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executescript(FLOOR_SCHEMA)
    started = mark()
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
    enqueued = mark()

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
    submitted = mark()
    conn.execute("UPDATE outbox SET status = 'delivered'")
    resumed = mark()
    now = T0 + 15
    while batch := claim(now):
        for notice_id, version, token in batch:
            _accept(conn, notice_id, version, token, now)
    accepted = mark()
    conn.close()
    return span(started, enqueued), span(enqueued, submitted), span(resumed, accepted)


FAIR_SCHEMA = """
CREATE TABLE notices (id TEXT PRIMARY KEY, phase TEXT NOT NULL, due_at REAL,
  lease_owner TEXT, lease_token TEXT, lease_expires_at REAL, version INTEGER NOT NULL,
  expires_at REAL NOT NULL);
CREATE INDEX notices_due ON notices (due_at) WHERE due_at IS NOT NULL;
CREATE TABLE secrets (notice_id TEXT PRIMARY KEY, email TEXT, phone TEXT, reset_url TEXT);
CREATE TABLE attempts (key TEXT PRIMARY KEY, notice_id TEXT, channel TEXT, state TEXT,
  message_id TEXT, UNIQUE (notice_id, channel));
CREATE TABLE observations (id INTEGER PRIMARY KEY, key TEXT, status TEXT, at REAL);
CREATE TABLE events (id INTEGER PRIMARY KEY, notice_id TEXT, at REAL, kind TEXT,
  old_phase TEXT, new_phase TEXT);
CREATE TABLE outbox (message_id TEXT PRIMARY KEY, key TEXT UNIQUE, status TEXT, body TEXT);
"""

#: The product's own email templates (templates/v1 at the top of the checkout).
TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "v1"
SUPPORT_LABEL = "Support"  # the product's default support_label


@functools.cache
def template_tokens(name: str) -> tuple[Any, ...]:
    """A template tokenized once per process (the product does the same)."""
    return tuple(tokenize((TEMPLATES / name).read_text(encoding="utf-8")))


@functools.cache
def minutes_words(minutes: int) -> tuple[str, str]:
    """(minutes_until_expiry, minutes_phrase) as CLDR words them in English, once per
    count per process (the product caches these too)."""
    return (
        format_decimal(minutes, locale="en"),
        format_unit(minutes, "duration-minute", length="long", locale="en"),
    )


def render_message(email: str, reset_url: str, expires_at: float, now: float) -> str:
    """The outbox body for one email: the three templates rendered, as JSON."""
    number, phrase = minutes_words(max(0, math.floor((expires_at - now) / 60)))
    data: dict[str, object] = {
        "reset_url": reset_url,
        "minutes_until_expiry": number,
        "minutes_phrase": phrase,
        "support_label": SUPPORT_LABEL,
    }  # display_name only when the request has one: these have none, as in the product
    subject = chevron.render(template_tokens("email_subject.mustache"), data, partials_path=None)
    return json.dumps(
        {
            "to": email,
            "subject": " ".join(subject.split()),
            "text": chevron.render(template_tokens("email_text.mustache"), data, None),
            "html": chevron.render(template_tokens("email_html.mustache"), data, None),
        }
    )


def validated(i: int, request: dict[str, str]) -> str:
    """What every fair run checks per request: the email's syntax (its normalized form is
    returned) and the phone number's validity, with the product's own libraries."""
    email: str = email_validator.validate_email(
        request["email"], check_deliverability=False
    ).normalized
    number = phonenumbers.parse(request["phone"], None)
    if not phonenumbers.is_valid_number(number):
        raise ValueError(f"request {i}: not a valid phone number")
    return email


def run_fair_floor(
    path: Path, n: int, profile: cProfile.Profile | None = None
) -> tuple[Mark, Mark, Mark]:
    """The raw floor's statements, plus the work no real product can skip: validating
    every email and phone at enqueue, and rendering the three email templates per
    message into an outbox row written in the outcome's commit."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executescript(FAIR_SCHEMA)
    started = mark()
    conn.execute("BEGIN IMMEDIATE")
    for i, request in enumerate(requests(n)):
        email = validated(i, request)
        notice_id = f"n{i}"
        conn.execute(
            "INSERT INTO notices VALUES (?, 'queued', ?, NULL, NULL, NULL, 0, ?)",
            (notice_id, T0, T0 + 600),
        )
        conn.execute(
            "INSERT INTO secrets VALUES (?, ?, ?, ?)",
            (notice_id, email, request["phone"], request["reset_url"]),
        )
    conn.execute("COMMIT")
    enqueued = mark()
    if profile is not None:  # bench/profile_sweep.py: the sweep stages only
        profile.enable()

    def claim(now: float) -> list[tuple[str, int, str, float]]:
        token = secrets.token_hex(8)
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "UPDATE notices SET lease_owner = 'floor', lease_token = ?, lease_expires_at = ?,"
            " due_at = ?, version = version + 1 WHERE id IN (SELECT id FROM notices"
            " WHERE due_at <= ? ORDER BY due_at LIMIT ?) RETURNING id, version, expires_at",
            (token, now + 60, now + 60, now, BATCH),
        ).fetchall()
        conn.execute("COMMIT")
        return [(r[0], r[1], token, r[2]) for r in rows]

    now = T0
    while batch := claim(now):
        for notice_id, version, token, expires_at in batch:
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
            body = render_message(email, url, expires_at, now)
            message_id = "obx_" + secrets.token_hex(8)
            conn.execute("BEGIN IMMEDIATE")  # outcome, with the outbox row
            conn.execute("INSERT INTO outbox VALUES (?, ?, 'pending', ?)", (message_id, key, body))
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
    if profile is not None:
        profile.disable()
    submitted = mark()
    check_fair_rendering(conn)
    conn.execute("UPDATE outbox SET status = 'delivered'")
    resumed = mark()
    if profile is not None:
        profile.enable()
    now = T0 + 15
    while batch := claim(now):
        for notice_id, version, token, _expires_at in batch:
            _accept(conn, notice_id, version, token, now)
    if profile is not None:
        profile.disable()
    accepted = mark()
    (done,) = conn.execute("SELECT count(*) FROM notices WHERE phase = 'accepted'").fetchone()
    assert done == n, done
    conn.close()
    return span(started, enqueued), span(enqueued, submitted), span(resumed, accepted)


def check_fair_rendering(conn: sqlite3.Connection) -> None:
    """Untimed: the fair floor stored what the product renders, byte for byte."""
    from resetctl.render import RenderModel, render_email

    (body,) = conn.execute("SELECT body FROM outbox WHERE key = 'n0:email:1'").fetchone()
    (url,) = conn.execute("SELECT reset_url FROM secrets WHERE notice_id = 'n0'").fetchone()
    ours = json.loads(body)
    theirs = render_email(RenderModel(url, 10, SUPPORT_LABEL), "v1")
    assert (ours["subject"], ours["text"], ours["html"]) == (
        theirs.subject,
        theirs.text,
        theirs.html,
    ), "the fair floor's rendering differs from the product's"


HUEY_MISSING = "huey is not installed: pip install huey (or: pip install -e '.[bench]')"


def open_huey(path: Path, fsync: bool) -> Any:
    """A SqliteHuey on ``path`` in WAL mode: at ``synchronous = NORMAL`` (resetctl's
    durability) unless ``fsync`` keeps huey's own default (FULL)."""
    from huey import SqliteHuey  # type: ignore[import-untyped]
    from huey.storage import SqliteStorage  # type: ignore[import-untyped]

    class Storage(SqliteStorage):  # type: ignore[misc]
        def _create_connection(self) -> sqlite3.Connection:
            conn: sqlite3.Connection = super()._create_connection()
            if not fsync:
                conn.execute("PRAGMA synchronous = NORMAL")
            return conn

    huey = SqliteHuey("bench", filename=str(path), storage_class=Storage, journal_mode="wal")
    mode = huey.storage.conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal", mode
    return huey


def run_huey(path: Path, n: int, fsync: bool = False) -> tuple[Mark, Mark]:
    """Seconds for huey's SqliteHuey to enqueue N no-op tasks, then to dequeue and execute
    them all in this process, the way its consumer's worker loop does.

    By default its connection runs at ``synchronous = NORMAL`` in WAL, as resetctl's Store
    does (the same durability); ``fsync`` keeps huey's own default (FULL: an fsync per
    commit)."""
    huey = open_huey(path, fsync)

    @huey.task()  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    started = mark()
    for _ in range(n):
        noop()
    enqueued = mark()
    executed = 0
    while (task := huey.dequeue()) is not None:
        huey.execute(task)
        executed += 1
    done = mark()
    assert executed == n, executed
    huey.storage.close()
    return span(started, enqueued), span(enqueued, done)


APP_SCHEMA = """
CREATE TABLE notices (id TEXT PRIMARY KEY, phase TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE outbox (message_id TEXT PRIMARY KEY, notice_id TEXT NOT NULL, status TEXT,
  body TEXT);
"""


def run_huey_product(path: Path, n: int, fsync: bool = False) -> tuple[Mark, Mark, Mark]:
    """huey as the queue of the product's unavoidable work, the fair floor's work on
    huey's task path: enqueue validates the email and phone and enqueues a ``send`` task
    (its arguments, the contact data included, pickled into huey's queue); the worker's
    ``send`` renders the three templates, writes the outbox row in the application's
    database and enqueues a ``poll``; ``poll`` reads the status, ends the notice and
    scrubs the outbox row. The same three stages as the others, each task dequeued and
    executed in this process as huey's consumer does. No lease, no compare-and-set, no
    events: huey's at-least-once task semantics are all it has."""
    huey = open_huey(path, fsync)
    app = sqlite3.connect(path.with_suffix(".app.db"), isolation_level=None)
    app.execute("PRAGMA journal_mode = WAL")
    app.execute("PRAGMA synchronous = NORMAL")
    app.executescript(APP_SCHEMA)

    @huey.task()  # type: ignore[untyped-decorator]
    def poll(notice_id: str, message_id: str) -> None:
        (status,) = app.execute(
            "SELECT status FROM outbox WHERE message_id = ?", (message_id,)
        ).fetchone()
        if status == "delivered":
            app.execute("BEGIN IMMEDIATE")
            app.execute("UPDATE notices SET phase = 'accepted' WHERE id = ?", (notice_id,))
            app.execute("UPDATE outbox SET body = NULL WHERE message_id = ?", (message_id,))
            app.execute("COMMIT")

    @huey.task()  # type: ignore[untyped-decorator]
    def send(notice_id: str, email: str, url: str, expires_at: float, now: float) -> None:
        body = render_message(email, url, expires_at, now)
        message_id = "obx_" + secrets.token_hex(8)
        app.execute("INSERT INTO outbox VALUES (?, ?, 'pending', ?)", (message_id, notice_id, body))
        poll(notice_id, message_id)

    def work(count: int) -> None:
        """Dequeue and execute ``count`` tasks: the sends (which enqueue the polls), then
        the polls, in the order they were enqueued."""
        for _ in range(count):
            task = huey.dequeue()
            assert task is not None
            huey.execute(task)

    started = mark()
    app.execute("BEGIN IMMEDIATE")
    for i, request in enumerate(requests(n)):
        email = validated(i, request)
        app.execute("INSERT INTO notices VALUES (?, 'queued', ?)", (f"n{i}", T0 + 600))
        send(f"n{i}", email, request["reset_url"], T0 + 600, T0)
    app.execute("COMMIT")
    enqueued = mark()
    work(n)
    submitted = mark()
    app.execute("UPDATE outbox SET status = 'delivered'")
    resumed = mark()
    work(n)
    accepted = mark()
    assert huey.dequeue() is None
    (done,) = app.execute("SELECT count(*) FROM notices WHERE phase = 'accepted'").fetchone()
    assert done == n, done
    huey.storage.close()
    app.close()
    return span(started, enqueued), span(enqueued, submitted), span(resumed, accepted)


def have_huey() -> bool:
    try:
        import huey  # noqa: F401
    except ImportError:
        return False
    return True


def warm_up(names: list[str]) -> None:
    """One small untimed run of each, so that no timed run pays this process's one-time
    costs (phonenumbers' metadata, CLDR data, templates tokenized, modules imported)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            where = Path(tmp) / f"{name}.db"
            if name == "resetctl":
                run_resetctl(where, 100)
            elif name == "raw":
                run_floor(where, 100)
            elif name == "fair":
                run_fair_floor(where, 100)
            elif name == "huey":
                run_huey(where, 100)
            elif name == "huey_work":
                run_huey_product(where, 100)


Runs = dict[str, list[tuple[Mark, ...]]]


def median(runs: Runs, name: str, stages: tuple[int, ...], kind: str) -> float | None:
    """The median over rounds of one run's ``kind`` seconds (wall or cpu) summed over
    ``stages``, if that run took part."""
    if name not in runs:
        return None
    return float(statistics.median(sum(getattr(r[i], kind) for i in stages) for r in runs[name]))


def ratio(other: float | None, ours: float) -> str:
    return "-" if other is None else f"{other / ours:.2f}"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


#: (stage, resetctl's and the floors' stages summed, huey's stages summed or None).
#: huey has two stages: enqueue, and dequeue + execute (its "sweep").
STAGES: list[tuple[str, tuple[int, ...], tuple[int, ...] | None]] = [
    ("enqueue", (0,), (0,)),
    ("to submitted", (1,), None),
    ("to accepted", (2,), None),
    ("sweep", (1, 2), (1,)),
    ("lifecycle", (0, 1, 2), (0, 1)),
]


def table(n: int, runs: Runs, kind: str) -> None:
    for stage, ours_at, huey_at in STAGES:
        ours = median(runs, "resetctl", ours_at, kind)
        assert ours is not None
        raw, fair = median(runs, "raw", ours_at, kind), median(runs, "fair", ours_at, kind)
        huey = median(runs, "huey", huey_at, kind) if huey_at else None
        work = median(runs, "huey_work", ours_at, kind)
        print(
            f"{n:>7} {stage:<13} {ours:>10.3f} {seconds(raw):>7} {seconds(fair):>7}"
            f" {seconds(huey):>7} {seconds(work):>7} {ratio(raw, ours):>6}"
            f" {ratio(fair, ours):>6} {ratio(huey, ours):>6} {ratio(work, ours):>6}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--huey-fsync",
        action="store_true",
        help="also run huey at its default synchronous = FULL (an fsync per commit; slow)",
    )
    parser.add_argument("--no-huey", action="store_true", help="leave huey out")
    args = parser.parse_args()
    with_huey = not args.no_huey and have_huey()
    if not args.no_huey and not with_huey:
        print(HUEY_MISSING)
    print(
        "ratio = the other's time / resetctl's time (resetctl's throughput as a share of the"
        " other's); medians of rounds"
    )
    header = (
        f"{'N':>7} {'stage':<13} {'resetctl s':>10} {'raw s':>7} {'fair s':>7} {'huey s':>7}"
        f" {'hwork s':>7} {'÷raw':>6} {'÷fair':>6} {'÷huey':>6} {'÷hwork':>6}"
    )
    for n in args.sizes:
        runs: Runs = {"resetctl": [], "raw": [], "fair": []}
        if with_huey:
            runs["huey"] = []
            runs["huey_work"] = []
        if with_huey and args.huey_fsync:
            runs["huey_fsync"] = []
        order = list(runs)
        warm_up(order)
        for round_ in range(args.rounds):
            turn = order[round_ % len(order) :] + order[: round_ % len(order)]
            with tempfile.TemporaryDirectory() as tmp:
                for name in turn:
                    where = Path(tmp) / f"{name}.db"
                    if name == "resetctl":
                        runs[name].append(run_resetctl(where, n))
                    elif name == "raw":
                        runs[name].append(run_floor(where, n))
                    elif name == "fair":
                        runs[name].append(run_fair_floor(where, n))
                    elif name == "huey_work":
                        runs[name].append(run_huey_product(where, n))
                    else:
                        runs[name].append(run_huey(where, n, fsync=name == "huey_fsync"))
        print("wall-clock time (the targets):")
        print(header)
        table(n, runs, "wall")
        if "huey_fsync" in runs:
            slow = median(runs, "huey_fsync", (0, 1), "wall")
            ours = median(runs, "resetctl", (0, 1, 2), "wall")
            assert slow is not None
            assert ours is not None
            print(
                f"{n:>7} {'lifecycle':<13} huey at its default synchronous = FULL:"
                f" {slow:.3f} s, ratio {slow / ours:.2f}"
            )
        print("this process's CPU time (no waiting on the disk):")
        print(header)
        table(n, runs, "cpu")
        ours = median(runs, "resetctl", (0, 1, 2), "wall")
        fair = median(runs, "fair", (0, 1, 2), "wall")
        huey = median(runs, "huey", (0, 1), "wall")
        assert ours is not None
        assert fair is not None
        verdict = "met" if fair / ours >= 0.8 else "not met"
        line = (
            f"targets at N = {n}: lifecycle ≥ 0.80 of the fair floor: {fair / ours:.2f} ({verdict})"
        )
        if huey is not None:
            verdict = "met" if huey / ours >= 1.0 else "not met"
            line += f"; ≥ 1.00 of huey: {huey / ours:.2f} ({verdict})"
        work = median(runs, "huey_work", (0, 1, 2), "wall")
        if work is not None:
            line += f"; huey doing the product's work: {work / ours:.2f}"
        print(line)


if __name__ == "__main__":
    main()
