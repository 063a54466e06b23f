"""The idle cron tick, answered before the command-line stack is imported.

Cron runs `resetctl sweep` 1,440 times a day on every host, and most runs find nothing
due. Typer, Click, Rich (and pydantic, which Typer imports) cost several times the
interpreter's own start-up, so a plain `sweep` without --max-runtime first asks one
indexed query whether anything is due. When nothing is, it validates the configuration
and its options, records the sweep (the stalled-sweeper alert reads that), prints the
same summary line and exits. In every other case, and on any doubt (an option it does
not know or would refuse, a missing or shared database file, a schema to migrate, a bad
config), it returns None and the full command line runs and reports as usual.

Its SQL and the schema version come from ``resetctl.schema_facts``, a leaf the store reads
too: importing the store costs more than the whole tick may.
"""

from __future__ import annotations

import sqlite3
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from resetctl.schema_facts import NEXT_DUE_SQL, RECORD_SWEEP_SQL, SCHEMA_VERSION, sweep_record

_GLOBAL_OPTIONS = frozenset({"--log-level", "--log-format"})
_SWEEP_OPTIONS = frozenset({"--db", "--config", "--worker-id", "--batch-size", "--lease"})
_ONE_PASS = frozenset({"0", "0s"})


def _parse(argv: Sequence[str]) -> tuple[dict[str, str], bool] | None:
    """`[--log-level X] [--log-format Y] sweep [known options]`, or None for anything else."""
    options: dict[str, str] = {}
    json_output = False
    args = list(argv)
    seen_sweep = False
    while args:
        arg = args.pop(0)
        name, has_value, value = arg.partition("=")
        if not seen_sweep and arg == "sweep":
            seen_sweep = True
            continue
        allowed = _SWEEP_OPTIONS | {"--max-runtime"} if seen_sweep else _GLOBAL_OPTIONS
        if seen_sweep and arg == "--json":
            json_output = True
            continue
        if name not in allowed:
            return None
        if not has_value:
            if not args:
                return None
            value = args.pop(0)
        options[name] = value
    if not seen_sweep or options.get("--max-runtime", "0").strip() not in _ONE_PASS:
        return None
    batch_size = options.get("--batch-size", "1")
    if not (batch_size.isascii() and batch_size.isdigit() and int(batch_size) >= 1):
        return None  # --batch-size 0 is refused by the full path, idle or not
    return options, json_output


def idle_tick(
    argv: Sequence[str], environ: Mapping[str, str], out: TextIO = sys.stdout
) -> int | None:
    """Answer an idle `resetctl sweep` and return its exit code, or None when the full
    command line must run."""
    parsed = _parse(argv)
    if parsed is None or environ.get("RESETCTL_FAILPOINTS"):
        return None
    if environ.get("RESETCTL_TIME_SCALE", "1").strip() not in ("", "1"):
        return None  # an accelerated clock: the full path owns it
    if environ.get("RESETCTL_CLOCK_SKEW", "0").strip() not in ("", "0"):
        return None  # a skewed clock (the multi-host simulation): the full path owns it
    options, json_output = parsed
    started = time.time()
    config = options.get("--config") or environ.get("RESETCTL_CONFIG")
    if config and not Path(config).is_file():
        return None  # a pipe can be read once only: the full path reads it
    try:
        from resetctl.config import load_settings
        from resetctl.durations import parse_duration

        settings = load_settings(Path(config) if config else None)
        if "--lease" in options:
            parse_duration(options["--lease"], "--lease")  # --lease 0 is refused, idle or not
    except Exception:
        return None  # the full command line says what is wrong
    db = options.get("--db") or environ.get("RESETCTL_DB") or settings.db or "resetctl.db"
    if db.startswith(("postgresql:", "postgres:")):
        return None  # a database server: the full path (and its driver) owns it
    if db in ("", ":memory:") or db[:5].lower() == "file:":
        return None  # not a database file: the full path refuses it
    path = Path(db)
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or any(
            Path(db + suffix).is_symlink() for suffix in ("-wal", "-shm", "-journal")
        ):
            return None  # a link (or no plain file): the full path refuses it
        if info.st_mode & 0o077:
            return None  # a database others can read: the full path warns about it
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
    except (OSError, sqlite3.Error):
        return None
    try:
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA synchronous = NORMAL")
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version != SCHEMA_VERSION:
            return None  # a migration (or a newer resetctl) is the full path's business
        row = conn.execute(NEXT_DUE_SQL).fetchone()
        if row is not None and row[0] <= time.time():
            return None  # work is due: sweep it
        finished = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(RECORD_SWEEP_SQL, sweep_record(finished, finished - started))
        conn.execute("COMMIT")
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    from resetctl.summary import SweepSummary

    print(SweepSummary(duration=finished - started).line(finished, json_output), file=out)
    return 0
