"""Mistakes fail loudly (issue 23, items 7 and 8): an unknown region is refused at
enqueue, only `enqueue` and `db init` create a database, a zero where zero means nothing
is refused as the command starts, refused input leaves no file behind, and relative
times read `in 2m` / `6m5s ago`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import time_machine
from conftest import (
    T0,
    FakeClock,
    database_clock_at,
    make_settings,
    reset_request,
    resetctl,
    run_sweep,
)
from typer.testing import CliRunner

import resetctl as rc
from resetctl.cli import app
from resetctl.cli_output import relative
from resetctl.config import load_settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError, InputError
from resetctl.store import Store

#: What an enqueue naming a region without its own table is told, the configured
#: regions filled in.
UNKNOWN_REGION = (
    "region: no [policy.<region>] table for this region (configured: {}); add one,"
    ' or set unknown_region = "default" to send it under [policy.default]'
)


def jsonl(*requests: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


def notice_count(db: str) -> int:
    with Store(db, must_exist=True) as store:
        return sum(store.phase_counts().values())


def has_schema(db: str) -> bool:
    """Whether the database exists with resetctl's tables (a file, or the schema in a
    PostgreSQL database)."""
    if not db.startswith("postgresql://"):
        return Path(db).exists()
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    return row is not None and row[0] > 0


# -- an unknown region -------------------------------------------------------------------


def test_an_unknown_region_is_refused_naming_the_line_and_the_configured_regions(
    db: str, clock: FakeClock
) -> None:
    """A region with no [policy.<region>] fails the whole enqueue, all or none, and says
    which regions the config has."""
    settings = make_settings(policy={"apac": {"channels": ["sms", "email"]}})
    with rc.open(db, settings, clock=clock) as handle:
        handle.enqueue([reset_request()])
        with pytest.raises(InputError) as refused:
            handle.enqueue([reset_request(region="apac"), reset_request(region="eu")])
    assert refused.value.problems == [f"line 2: {UNKNOWN_REGION.format('apac, default')}"]
    assert notice_count(db) == 1


def test_the_default_region_is_always_accepted_even_with_no_region_tables(
    db: str, clock: FakeClock
) -> None:
    """No region and region "default" use [policy.default] under the built-in config;
    any other region is refused there too, naming default as the one configured."""
    with rc.open(db, make_settings(), clock=clock) as handle:
        results = handle.enqueue([reset_request(), reset_request(region="default")])
        with pytest.raises(InputError) as refused:
            handle.enqueue([reset_request(region="eu")])
    assert [r.created for r in results] == [True, True]
    assert refused.value.problems == [f"line 1: {UNKNOWN_REGION.format('default')}"]


def test_unknown_region_default_sends_it_under_policy_default(store: Store) -> None:
    """`unknown_region = "default"`: the region is kept, the policy is [policy.default]."""
    settings = make_settings(unknown_region="default", policy={"apac": {"version": 4}})
    [result] = enqueue(store, settings, [reset_request(region="mars")], T0)
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert (loaded.region, loaded.policy_name) == ("mars", "default")


def test_unknown_region_in_a_file_must_be_refuse_or_default(tmp_path: Path) -> None:
    """Any other value is a ConfigError naming the file, its line and the key."""
    config = tmp_path / "resetctl.toml"
    config.write_text('support_label = "Acme"\nunknown_region = "fallback"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_settings(config)
    assert str(refused.value).startswith(f"config {config}, line 2: unknown_region: must be")


def test_the_cli_refuses_an_unknown_region_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    """`resetctl enqueue` with an unknown region: one error line, exit 2, no file."""
    db = tmp_path / "r.db"
    done = resetctl("enqueue", db=db, input=jsonl(reset_request(region="eu")))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: line 1: {UNKNOWN_REGION.format('default')}\n"
    assert list(tmp_path.iterdir()) == []


# -- only enqueue and db init create a database -------------------------------------------


def test_sweep_on_a_missing_database_exits_1_and_creates_nothing_until_db_init(db: str) -> None:
    """`sweep` on a missing file (or an empty PostgreSQL database) exits 1 with one line
    and creates nothing; `db init` creates it, once, and then the sweep runs."""
    swept = resetctl("sweep", db=db)
    assert swept.returncode == 1, swept.stderr
    [line] = swept.stderr.splitlines()
    if db.startswith("postgresql://"):
        assert line.startswith("error: database postgresql://")
        assert line.endswith("not a resetctl database (no schema)")
    else:
        assert line == f"error: database {db}: no such file (nothing created)"
    assert not has_schema(db)

    created = resetctl("db", "init", "--json", db=db)
    again = resetctl("db", "init", "--json", db=db)
    assert created.returncode == again.returncode == 0, created.stderr + again.stderr
    assert json.loads(created.stdout)["created"] is True
    assert json.loads(again.stdout)["created"] is False
    assert resetctl("sweep", "--json", db=db).returncode == 0


def test_db_init_creates_a_private_file_and_says_so(tmp_path: Path) -> None:
    """`db init` prints what it did; the new file is 0600, as an enqueue's would be."""
    db = tmp_path / "resetctl.db"
    done = resetctl("db", "init", db=db)
    assert (done.returncode, done.stdout) == (0, f"database {db}: created\n")
    assert db.stat().st_mode & 0o777 == 0o600
    again = resetctl("db", "init", db=db)
    assert again.stdout == f"database {db}: already there, schema current\n"


@pytest.mark.parametrize(
    "args",
    [
        ["sweep"],
        ["sweep", "--max-runtime", "55s"],
        ["serve-callbacks", "--bind", "127.0.0.1:0"],
        ["serve", "--bind", "127.0.0.1:0"],
        ["observe", "twilio", "--url", "https://hooks.example/t", "--signature", "x"],
        ["db", "copy", "--to", "postgresql:///nowhere?host=/nonexistent"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_no_command_but_enqueue_and_db_init_creates_a_missing_database(
    tmp_path: Path, args: list[str]
) -> None:
    """Commands that write but are not enqueue: exit 1, one line naming the path, and
    neither the file nor its -wal or -shm appears."""
    db = tmp_path / "typo.db"
    result = CliRunner().invoke(app, [*args, "--db", str(db)], env={"RESETCTL_DB": ""}, input="")
    assert result.exit_code == 1, result.output
    assert result.stderr == f"error: database {db}: no such file (nothing created)\n"
    assert list(tmp_path.iterdir()) == []


# -- a zero that means nothing -----------------------------------------------------------


@pytest.fixture
def idle_db(tmp_path: Path) -> Path:
    """A database with nothing due: the idle tick answers a plain sweep on it."""
    path = tmp_path / "idle.db"
    with Store(path):
        pass
    return path


@pytest.fixture
def busy_db(tmp_path: Path) -> Path:
    """A database with a notice due now."""
    path = tmp_path / "busy.db"
    with rc.open(path, make_settings()) as handle:
        handle.enqueue([reset_request()])
    return path


@pytest.mark.parametrize(
    ("option", "named"),
    [
        (["--lease", "0"], "error: --lease: must be a positive duration"),
        (["--lease", "0s"], "error: --lease: must be a positive duration"),
        (["--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["--concurrency", "0"], "Invalid value for '--concurrency'"),
    ],
    ids=["lease-0", "lease-0s", "batch-size-0", "concurrency-0"],
)
@pytest.mark.parametrize("state", ["idle", "busy", "missing"])
def test_a_zero_sweep_option_is_refused_as_the_command_starts(
    request: pytest.FixtureRequest, tmp_path: Path, state: str, option: list[str], named: str
) -> None:
    """`sweep --lease 0` (and a zero batch or pool) exits 2 naming the option whether
    work is due, nothing is, or the database is missing (which it does not create)."""
    db = tmp_path / "missing.db" if state == "missing" else request.getfixturevalue(f"{state}_db")
    done = resetctl("sweep", *option, db=db)
    assert done.returncode == 2, done.stdout + done.stderr
    assert named in done.stderr
    assert done.stdout == ""
    assert db.exists() is (state != "missing")
    if state == "busy":
        with Store(db) as store:
            assert store.phase_counts() == {"queued": 1}


def test_max_runtime_0_is_one_pass_not_a_mistake(idle_db: Path) -> None:
    """--max-runtime 0 keeps its meaning (one pass, the default): exit 0."""
    assert resetctl("sweep", "--max-runtime", "0", db=idle_db).returncode == 0


@pytest.mark.parametrize(
    ("toml", "line", "key"),
    [
        ('[policy.default]\nttl = "10m"\nlease = 0\n', 3, "policy.default.lease"),
        ('[policy.default]\nlease = "0s"\n', 2, "policy.default.lease"),
        ("[policy.default]\nbatch_size = 0\n", 2, "policy.default.batch_size"),
        (
            "[policy.default.email]\npoll_delays = [0, 45]\n",
            2,
            "policy.default.email.poll_delays[0]",
        ),
        ('support_label = "A"\n\n[sweep]\nconcurrency = 0\n', 4, "sweep.concurrency"),
        ("[outbox]\nlatency = 0\n", 2, "outbox.latency"),
        ("[twilio]\nmax_in_flight = 0\n", 2, "twilio.max_in_flight"),
    ],
    ids=["lease", "lease-0s", "batch_size", "poll_delay", "concurrency", "latency", "lane"],
)
def test_a_zero_in_the_config_is_refused_naming_file_line_and_key_even_when_idle(
    idle_db: Path, tmp_path: Path, toml: str, line: int, key: str
) -> None:
    """A zero duration or count in the file: exit 2 with the file, its line and the key,
    before any work, on the idle tick's path as on the full one."""
    config = tmp_path / "resetctl.toml"
    config.write_text(toml, encoding="utf-8")
    done = resetctl("sweep", "--config", str(config), db=idle_db)
    assert done.returncode == 2, done.stdout + done.stderr
    [error] = done.stderr.splitlines()
    assert error.startswith(f"error: config {config}, line {line}: {key}: "), error


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"lease": 0.0}, "lease: must be a positive duration"),
        ({"batch_size": 0}, "batch_size: must be a positive whole number"),
        ({"concurrency": 0}, "concurrency: expected a whole number from 1 to 256"),
    ],
    ids=["lease", "batch_size", "concurrency"],
)
def test_the_api_refuses_a_zero_sweep_option_instead_of_taking_the_default(
    db: str, clock: FakeClock, options: dict[str, Any], named: str
) -> None:
    """handle.sweep(lease=0) is a ConfigError, not the policy's lease; nothing is claimed."""
    with rc.open(db, make_settings(), clock=clock, sleep=clock.sleep) as handle:
        handle.enqueue([reset_request()])
        with pytest.raises(ConfigError, match=f"^{named}$"):
            handle.sweep(**options)
        assert handle.health()["notices_by_phase"] == {"queued": 1}


# -- refused input leaves no file ------------------------------------------------------------

VALID = reset_request()


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ([json.dumps(VALID), "{not json"], "line 2: (line): not valid JSON"),
        ([json.dumps({**VALID, "reset_url": None})], "line 1: reset_url: required"),
        ([json.dumps({**VALID, "region": "eu"})], "line 1: region: no [policy.<region>]"),
        (
            [json.dumps(VALID), json.dumps({**VALID, "email": "other@example.com"})],
            "line 2: idempotency_key: already used with different fields",
        ),
    ],
    ids=["invalid-json", "missing-field", "unknown-region", "key-reused-in-the-batch"],
)
def test_a_refused_enqueue_into_a_new_database_leaves_no_file(
    tmp_path: Path, lines: list[str], problem: str
) -> None:
    """Bad input for a database that does not exist yet: exit 2 and the directory stays
    empty (no database, no -wal, no hash key); good input then creates it."""
    db = tmp_path / "new.db"
    done = resetctl("enqueue", db=db, input="\n".join(lines) + "\n")
    assert done.returncode == 2, done.stderr
    assert problem in done.stderr
    assert list(tmp_path.iterdir()) == []

    accepted = resetctl("enqueue", db=db, input=jsonl(reset_request()))
    assert accepted.returncode == 0, accepted.stderr
    assert notice_count(str(db)) == 1


def test_the_api_refuses_before_creating_the_file_too(tmp_path: Path, clock: FakeClock) -> None:
    """resetctl.open(new path).enqueue(bad) raises InputError and creates nothing; the
    handle creates the file with its first accepted enqueue."""
    db = tmp_path / "new.db"
    with rc.open(db, make_settings(), clock=clock) as handle:
        with pytest.raises(InputError):
            handle.enqueue(iter([reset_request(region="eu")]))
        assert list(tmp_path.iterdir()) == []
        [result] = handle.enqueue(iter([reset_request()]))
    assert result.created
    assert notice_count(str(db)) == 1


# -- relative times ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(120, "in 2m"), (45.4, "in 45s"), (-365, "6m5s ago"), (-30, "30s ago"), (0.4, "now")],
)
def test_an_instant_reads_in_or_ago_never_a_negative_in(seconds: float, text: str) -> None:
    """Future instants read `in 2m`, past ones `6m5s ago`."""
    assert relative(seconds) == text


def test_inspect_text_says_how_long_ago_an_overdue_poll_was_due(db: str) -> None:
    """A notice nobody swept since its submission at T0: at T0 + 6m5s its first poll
    (due at 15 s) reads `5m50s ago` and its fallback deadline `in 55s`; at T0 + 8m20s the
    deadline reads `1m20s ago`."""
    settings = make_settings(outbox={"email_status": "pending"})
    database_clock_at(db, T0)
    with Store(db) as store:
        [result] = enqueue(store, settings, [reset_request()], T0)
        assert run_sweep(store, settings, FakeClock(T0)).submitted == 1

    def inspected(now: float) -> str:
        database_clock_at(db, now)
        with time_machine.travel(now, tick=False):
            done = CliRunner().invoke(app, ["inspect", result.notice_id, "--db", db])
        assert done.exit_code == 0, done.output
        assert "in -" not in done.stdout
        return done.stdout

    overdue = inspected(T0 + 365)
    assert "next: poll email at 2026-01-01T00:00:15Z (5m50s ago, poll_scheduled)" in overdue
    assert "deadline 2026-01-01T00:07:00Z (in 55s)" in overdue
    assert "deadline 2026-01-01T00:07:00Z (1m20s ago)" in inspected(T0 + 500)
