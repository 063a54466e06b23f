"""A PostgreSQL database named with a password, in every spelling an operator might type,
is refused without the password (or any piece of it) in any message, through the API and
the command line; a database error is one line that quotes no row.

The refusals come before any connection, so most of these need no server; the ones that
reach a server use this session's throwaway cluster (conftest's ``pg_admin``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pgcluster
import pytest
from conftest import make_settings, reset_request
from typer.testing import CliRunner

import resetctl
import resetctl.api
from resetctl.cli import app
from resetctl.store import is_postgres, open_store

#: The password, built so that a piece of it shows wherever a parse split it.
SECRET = "Hunter2@Tango/Zulu"
PIECES = ("Hunter2", "Tango", "Zulu")

#: Every spelling of a database name that carries the password (or could: an unencoded
#: ``@`` or ``/`` shifts libpq's parse of what follows).
WITH_PASSWORD = {
    "uri-userinfo-unencoded": f"postgresql://app:{SECRET}@db1.example/resetctl",
    "uri-userinfo-encoded": "postgresql://app:Hunter2%40Tango%2FZulu@db1.example/resetctl",
    "uri-upper-case-scheme": "POSTGRESQL://app:Hunter2Tango@db1.example/resetctl",
    "uri-mixed-case-short-scheme": "Postgres://app:Hunter2Tango@db1.example/resetctl",
    "uri-query": "postgresql://db1.example/resetctl?password=Hunter2Tango",
    "uri-query-percent-encoded-key": "postgresql://db1.example/resetctl?%70assword=Hunter2Tango",
    "uri-query-upper-case-key": "postgresql://db1.example/resetctl?PASSWORD=Hunter2Tango",
    "uri-ssl-key-password": "postgres://db1.example/resetctl?sslpassword=Hunter2Tango",
    "keyword": "host=db1.example password=Hunter2Tango dbname=resetctl",
    "keyword-upper-case": "HOST=db1.example PASSWORD=Hunter2Tango",
    "keyword-quoted": "host=db1.example password = 'Hunter2 Tango' dbname=resetctl",
    "keyword-after-spaces": "  dbname=resetctl   password=Hunter2Tango",
}
#: Strings libpq cannot parse, each quoting something that must not be echoed.
UNPARSEABLE = {
    "uri-unknown-query-key": "postgresql://db1.example/resetctl?token=Hunter2Tango",
    "keyword-stray-word": "host=db1.example Hunter2Tango",
}


def leaked(text: str) -> list[str]:
    return [piece for piece in PIECES if piece.lower() in text.lower()]


@pytest.mark.parametrize("name", list(WITH_PASSWORD) + list(UNPARSEABLE))
def test_the_api_refuses_without_quoting_the_string(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resetctl.open refuses each form with a ConfigError that holds no piece of it, and
    creates no file (an upper-case scheme once became a SQLite file named by the URI)."""
    db = {**WITH_PASSWORD, **UNPARSEABLE}[name]
    monkeypatch.chdir(tmp_path)
    assert is_postgres(db)
    with pytest.raises(resetctl.ConfigError) as raised:
        resetctl.open(db, make_settings())
    message = str(raised.value)
    assert leaked(message) == []
    assert leaked(repr(raised.value)) == []
    assert "\n" not in message
    expected = "a password in the URI is refused" if name in WITH_PASSWORD else "not a valid"
    assert expected in message
    with pytest.raises(resetctl.ConfigError):
        open_store(db)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", list(WITH_PASSWORD) + list(UNPARSEABLE))
def test_the_command_line_refuses_in_one_line_with_exit_2(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--db, RESETCTL_DB and db copy --to: exit 2, one line, no piece of the password."""
    db = {**WITH_PASSWORD, **UNPARSEABLE}[name]
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    source = tmp_path / "source.db"
    resetctl.api.init_database(source)
    before = sorted(p.name for p in tmp_path.iterdir())
    runs = [
        runner.invoke(app, ["health", "--db", db]),
        runner.invoke(app, ["inspect", "ntc_x"], env={"RESETCTL_DB": db}),
        runner.invoke(app, ["db", "copy", "--db", str(source), "--to", db]),
    ]
    for result in runs:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2, result.output
        assert len(lines) == 1, result.output
        assert lines[0].startswith("error: database postgresql://…: ")
        assert leaked(result.output) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_a_database_in_the_config_file_is_refused_the_same_way(tmp_path: Path) -> None:
    """`db = …` in the config, as a real process sees it: exit 2, one line, no secret."""
    config = tmp_path / "resetctl.toml"
    config.write_text(f'db = "{WITH_PASSWORD["uri-userinfo-unencoded"]}"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESETCTL_", "PG"))}
    done = subprocess.run(
        [sys.executable, "-m", "resetctl", "sweep", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: database postgresql://…: a password in the URI is refused (another user can"
        " read argv); use PGPASSWORD, ~/.pgpass or PGSERVICE"
    ]
    assert leaked(done.stdout + done.stderr) == []


def test_a_file_path_is_still_a_file() -> None:
    """Paths that merely contain ``=`` or ``password`` stay SQLite files."""
    for path in ("resetctl.db", "a=b.db", "/srv/password=x.db", "./host=x.db", "postgresql.db"):
        assert not is_postgres(path)


def test_a_database_without_a_password_is_named_by_its_parts(tmp_path: Path) -> None:
    """A refused connection names user, host, port and database, rebuilt, in one line,
    exit 1 (a runtime failure, not bad input); a keyword string reads the same."""
    runner = CliRunner()
    port = _closed_port()
    for db in (
        f"postgresql://app@127.0.0.1:{port}/resetctl?connect_timeout=2",
        f"user=app host=127.0.0.1 port={port} dbname=resetctl connect_timeout=2",
        f"POSTGRESQL://app@127.0.0.1:{port}/resetctl?connect_timeout=2",
    ):
        result = runner.invoke(app, ["health", "--db", db])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1, result.output
        assert len(lines) == 1, result.output
        assert lines[0].startswith(f"error: database postgresql://app@127.0.0.1:{port}/resetctl: ")
        assert "connect_timeout" not in lines[0]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server_db(pg_admin: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    uri = pgcluster.create_database(pg_admin, name)
    monkeypatch.setenv("RESETCTL_HASH_KEY", "test-hash-key-0123456789abcdef")
    try:
        yield uri
    finally:
        pgcluster.drop_database(pg_admin, name)


def test_a_database_error_is_one_line_without_its_detail(server_db: str) -> None:
    """An error PostgreSQL raises with DETAIL and HINT lines (which can quote a row)
    reaches the caller as its first line only, naming the database without a password."""
    import psycopg

    with resetctl.open(server_db, make_settings()) as handle:
        with psycopg.connect(server_db, autocommit=True) as admin:
            admin.execute(
                """
                CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    RAISE EXCEPTION 'refused by policy'
                        USING DETAIL = 'row: ' || NEW.id || ' Hunter2Tango',
                              HINT = 'Tango';
                END $$;
                CREATE TRIGGER refuse BEFORE INSERT ON notices
                    FOR EACH ROW EXECUTE FUNCTION refuse();
                """
            )
        with pytest.raises(resetctl.StoreError) as raised:
            handle.enqueue([reset_request()])
    message = str(raised.value)
    assert message.startswith(f"database {handle.path}: ")
    assert message.endswith("refused by policy")
    assert "\n" not in message
    assert leaked(message) == []
    assert "password" not in handle.path
