"""A throwaway PostgreSQL cluster: initdb into a temp directory, pg_ctl start on a Unix
socket (no TCP port), stopped and removed at the end. PostgreSQL refuses to run as root,
so as root the server runs as the `postgres` user (created when missing).

Tests, .ci/run and bench/scale.py share it:

    python tests/pgcluster.py start   # prints `export RESETCTL_TEST_PG=…; export …_DIR=…`
    python tests/pgcluster.py stop DIR
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: The server's user when we are root.
SERVER_USER = "postgres"


def bin_dir() -> Path | None:
    """Where initdb and pg_ctl live: the newest /usr/lib/postgresql/*/bin, else PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if found:
        return Path(found[-1])
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _ensure_server_user() -> None:
    """As root, the server needs a user of its own (Debian's package creates `postgres`)."""
    import pwd

    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run([useradd, "--system", "--no-create-home", SERVER_USER], check=True)


def _as_server(argv: list[str]) -> list[str]:
    """``argv`` run as the server's user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return argv
    return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", SERVER_USER, "--", *argv]


def uri(base: Path | str, dbname: str = "postgres") -> str:
    """The URI of a database of the cluster at ``base`` (its socket directory)."""
    return f"postgresql:///{dbname}?host={base}&user=postgres"


def start(settings: tuple[str, ...] = ("fsync=off", "synchronous_commit=off")) -> Path:
    """Start a new cluster; returns its directory (data in data/, the socket beside it)."""
    binaries = bin_dir()
    if binaries is None:
        raise RuntimeError("PostgreSQL's initdb was not found (apt-get install postgresql)")
    base = Path(tempfile.mkdtemp(prefix="resetctl-pg-"))
    base.chmod(0o755)
    if os.geteuid() == 0:
        _ensure_server_user()
        shutil.chown(base, SERVER_USER, SERVER_USER)
    data = base / "data"
    subprocess.run(
        _as_server(
            [
                str(binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    options = " ".join(
        [
            f"-k {base}",
            "-c listen_addresses=''",
            "-c max_connections=300",
            "-c shared_buffers=128MB",
            *(f"-c {s}" for s in settings),
        ]
    )
    subprocess.run(
        _as_server(
            [
                str(binaries / "pg_ctl"),
                *("-D", str(data), "-o", options, "-l", str(base / "log")),
                *("-w", "-t", "60", "start"),
            ]
        ),
        check=True,
        capture_output=True,
    )
    return base


def stop(base: Path | str) -> None:
    """Stop the cluster at ``base`` and remove it."""
    binaries = bin_dir()
    data = Path(base) / "data"
    if binaries is not None and data.is_dir():
        subprocess.run(
            _as_server([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            check=False,
            capture_output=True,
        )
    shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def running() -> Iterator[Path]:
    """A cluster for the duration of a with-block."""
    base = start()
    try:
        yield base
    finally:
        stop(base)


def create_database(admin_uri: str, name: str) -> str:
    """A new empty database beside ``admin_uri``'s; returns its URI."""
    import psycopg

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_uri.replace("/postgres?", f"/{name}?", 1)


def drop_database(admin_uri: str, name: str) -> None:
    """Drop a database, ending its sessions."""
    import psycopg

    with psycopg.connect(admin_uri, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    if sys.argv[1:2] == ["start"]:
        started = start()
        print(f"export RESETCTL_TEST_PG='{uri(started)}'; export RESETCTL_TEST_PG_DIR='{started}'")
    elif sys.argv[1:2] == ["stop"] and len(sys.argv) == 3:
        stop(sys.argv[2])
    else:
        sys.exit("usage: pgcluster.py start | stop DIR")
