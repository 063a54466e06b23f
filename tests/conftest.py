"""Shared fixtures: a store on a temp file, a settable clock, notice and sweep factories."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pgcluster
import pytest

from resetctl.config import DEFAULT_CONCURRENCY, Settings, settings_from_mapping
from resetctl.enqueue import EnqueueResult, enqueue
from resetctl.store import Store
from resetctl.sweep import Sweeper, SweepSummary
from resetctl.transports import Transport, build_transports
from resetctl.work import SweepOptions

#: A fixed start time (2026-01-01T00:00:00Z): tests pass `now` in, they never read a clock.
T0 = 1767225600.0


class FakeClock:
    """A clock tests move by hand; `sleep` advances it instead of waiting."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True, scope="session")
def _user_config_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The user's configuration directory, where the hash key goes when no config file
    names one: a scratch one for the session (shared by its tests, as a user's is), so
    no test writes a key into the real home."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("user-config"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


@pytest.fixture(autouse=True)
def _resetctl_logging_restored() -> Iterator[None]:
    """resetctl's logger as each test found it: an in-process CLI run configures it (its
    own handler, its level, no propagation), and a later test that reads the capture
    would otherwise see none of resetctl's lines."""
    logger = logging.getLogger("resetctl")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    yield
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    logger.handlers[:] = saved[2]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def twilio(clock: FakeClock) -> Iterator[Any]:
    """A Twilio API on loopback (providers_twilio.FakeTwilio), checked against its
    OpenAPI description on every request; the test fails on any violation."""
    from providers_twilio import FakeTwilio

    server = FakeTwilio(clock)
    try:
        yield server
    finally:
        server.close()
    assert server.violations == []


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "resetctl.db"


#: What a broken uniqueness or foreign key raises, on either backend.
INTEGRITY_ERRORS: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)
with contextlib.suppress(ImportError):
    import psycopg

    INTEGRITY_ERRORS += (psycopg.IntegrityError,)

#: Modules whose tests run against every backend: the store's contract suite and the
#: behaviours built on it. Everything else runs on SQLite, the embedded default.
CONTRACT_MODULES = frozenset(
    {
        "test_store",
        "test_terminal_guard",
        "test_sweep",
        "test_enqueue",
        "test_enqueue_send_truth",
        "test_ops",
        "test_delivery_truth",
        "test_health_after_purge",
        "test_replay",
        "test_alerts",
        "test_races",
        "test_end_to_end",
        "test_faults",
        "test_template_retirement",
        "test_doubt_clocks",
        "test_doubt",
        "test_callback_replay",
        "test_at_risk_agreement",
        "test_cancel",
        "test_tracing",
        "test_find",
        "test_loud_mistakes",
        "test_region_policy",
        "test_limit_races",
        "test_region_sender",
        "test_retention",
        "test_distributions",
        "test_sms_segments",
        "test_telemetry_budget",
        "test_rollout_shadow",
        "test_rollout_slice",
        "test_failover",
        "test_failover_processes",
        "test_failover_ops",
    }
)

#: Modules about PostgreSQL's own guarantees.
POSTGRES_ONLY_MODULES = frozenset({"test_postgres", "test_multi_host", "test_db_copy"})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        module = metafunc.module.__name__.rpartition(".")[2]
        backends = ["sqlite", "postgresql"] if module in CONTRACT_MODULES else ["sqlite"]
        if module in POSTGRES_ONLY_MODULES:
            backends = ["postgresql"]
        metafunc.parametrize("backend", backends, scope="function")


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[str]:
    """The admin URI of a PostgreSQL cluster: .ci/run's (RESETCTL_TEST_PG), else a
    throwaway one started for this session on a Unix socket."""
    given = os.environ.get("RESETCTL_TEST_PG")
    if given:
        yield given
        return
    if pgcluster.bin_dir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL binaries are missing (.ci/run installs them)")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with pgcluster.running() as base:
        yield pgcluster.uri(base)


@pytest.fixture
def db(backend: str, db_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The database a test runs on: a temp SQLite file, or a new PostgreSQL database."""
    if backend == "sqlite":
        yield str(db_path)
        return
    admin: str = request.getfixturevalue("pg_admin")
    name = f"t_{uuid.uuid4().hex[:12]}"
    uri = pgcluster.create_database(admin, name)
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    # A server keeps no key file beside it: every host (and test) names the key.
    monkeypatch.setenv("RESETCTL_HASH_KEY", "test-hash-key-0123456789abcdef")
    try:
        yield uri
    finally:
        pgcluster.drop_database(admin, name)


@pytest.fixture
def store(db: str) -> Iterator[Store]:
    with Store(db) as opened:
        yield opened


def later(store: Store, seconds: float) -> FakeClock:
    """A clock ``seconds`` past the real time, for a sweep that recovers a dead worker's
    leases without waiting for them. On PostgreSQL leases are read on the database's
    clock, so this session's view of it moves forward by as much."""
    if store.backend == "postgresql":
        store.conn.execute(f"SET resetctl.clock_offset = '{float(seconds)}'")
    return FakeClock(time.time() + seconds)


def database_follows(store: Store, clock: FakeClock) -> None:
    """On PostgreSQL, move this session's view of the database clock to a fake clock
    running ahead of real time (due times and leases are read on the database's)."""
    if store.backend == "postgresql":
        store.conn.execute(f"SET resetctl.clock_offset = '{max(clock() - time.time(), 0.0)}'")


def database_clock_at(db: str, now: float) -> None:
    """On PostgreSQL, make the database's clock read ``now`` for every new session (it
    runs on in real time from there): decisions read the database's clock, so a test
    that runs commands under time-machine moves it too. Nothing on SQLite."""
    if not db.startswith("postgresql://"):
        return
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        name = str(row[0]).replace('"', '""')
        offset = float(now - time.time())
        conn.execute(f"ALTER DATABASE \"{name}\" SET resetctl.clock_offset = '{offset}'")  # type: ignore[call-overload]


def make_settings(**overrides: Any) -> Settings:
    """Settings from a config mapping, like a TOML file would give."""
    return settings_from_mapping(overrides, "test")


@pytest.fixture
def settings() -> Settings:
    return make_settings()


_counter = iter(range(1, 10**9))


def reset_request(**fields: Any) -> dict[str, Any]:
    """An enqueue request with distinct defaults; pass a field as None to drop it."""
    n = next(_counter)
    base: dict[str, Any] = {
        "idempotency_key": f"reset-{n}",
        "email": f"user{n}@example.com",
        "phone": "+14155550123",
        "reset_url": f"https://shop.example/reset/token-{n}",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


NoticeFactory = Callable[..., str]


@pytest.fixture
def make_notice(store: Store, clock: FakeClock) -> Callable[..., str]:
    """Enqueue one notice at the clock's time; returns its id."""

    def make(settings: Settings | None = None, **fields: Any) -> str:
        results: list[EnqueueResult] = enqueue(
            store, settings or make_settings(), [reset_request(**fields)], clock()
        )
        return results[0].notice_id

    return make


def run_sweep(
    store: Store,
    settings: Settings,
    clock: FakeClock,
    transports: Mapping[str, Transport] | None = None,
    *,
    worker: str = "test-worker",
    batch_size: int = 50,
    lease: float = 60.0,
    max_runtime: float = 0.0,
    listeners: list[Any] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> SweepSummary:
    """One in-process sweep at the fake clock's time."""
    sweeper = Sweeper(
        store,
        settings,
        transports or build_transports(settings, store, clock),
        clock=clock,
        sleep=clock.sleep,
        listeners=listeners or [],
    )
    return sweeper.run(SweepOptions(worker, batch_size, lease, max_runtime, concurrency))


def resetctl(
    *args: str,
    db: Path | str | None = None,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the real command line (`python -m resetctl`) in a child process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    if "RESETCTL_HASH_KEY" in os.environ:  # a PostgreSQL test's key (a server has no beside)
        full_env["RESETCTL_HASH_KEY"] = os.environ["RESETCTL_HASH_KEY"]
    if db is not None:
        full_env["RESETCTL_DB"] = str(db)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "resetctl", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        check=check,
        timeout=120,
    )
