"""How the store tells its two backends apart, and what differs between them.

A backend is SQLite (``resetctl.store.sqlite``) or PostgreSQL (``resetctl.store.postgres``);
each holds only its connection handling (a connection, write transactions, rows as dicts,
a few catalog reads), its :class:`Dialect` (the SQL fragments that differ) and its schema
with migrations. Every statement they share is written once, in the store, with SQLite's
parameter style (``?`` and ``:name``), which the PostgreSQL connection translates once per
statement text.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: URI schemes that name a PostgreSQL database (libpq's own spellings, in any case).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
#: libpq's connection keywords: a string that starts with one and ``=`` is a keyword/value
#: connection string (``host=db1 dbname=resetctl``), never a file name; matched in any
#: case, so ``PASSWORD=…`` is refused as a password rather than made into a SQLite file.
_KEYWORDS = frozenset(
    # One string, as libpq's documentation lists them: easier to check than 41 literals.
    (  # noqa: SIM905
        "host hostaddr port dbname user password passfile require_auth channel_binding"
        " connect_timeout client_encoding options application_name fallback_application_name"
        " keepalives keepalives_idle keepalives_interval keepalives_count tcp_user_timeout"
        " replication gssencmode sslmode sslnegotiation sslcompression sslcert sslkey"
        " sslpassword sslcertmode sslrootcert sslcrl sslcrldir sslsni requirepeer"
        " ssl_min_protocol_version ssl_max_protocol_version krbsrvname gsslib gssdelegation"
        " service target_session_attrs load_balance_hosts"
    ).split()
)
_KEYWORD_START = re.compile(r"\s*([A-Za-z_]+)\s*=")


def is_postgres(db: str | Path) -> bool:
    """True when ``db`` names a PostgreSQL database rather than a file: a ``postgresql://``
    URI (the scheme in any case) or a libpq keyword/value string."""
    if not isinstance(db, str):
        return False
    if db.lstrip()[:13].lower().startswith(POSTGRES_SCHEMES):
        return True
    keyword = _KEYWORD_START.match(db)
    return keyword is not None and keyword.group(1).lower() in _KEYWORDS


def database_label(db: str | Path) -> str:
    """How a database is named in messages: a file by its path; a PostgreSQL database by
    a URI rebuilt from libpq's parse of it, without any password."""
    if not is_postgres(db):
        return str(db)
    from resetctl.store.postgres.connection import redacted

    return redacted(str(db))


def error_line(exc: BaseException) -> str:
    """A driver's error in one line: its first, without the DETAIL, HINT and CONTEXT
    lines PostgreSQL adds (they can quote a row's values)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def database_errors() -> tuple[type[Exception], ...]:
    """The driver exceptions a database failure raises (a full disk, a lost server)."""
    errors: list[type[Exception]] = [sqlite3.Error]
    driver = sys.modules.get("psycopg")  # None where an import of it was blocked
    if driver is not None:
        errors.append(driver.Error)
    return tuple(errors)


class Connection(Protocol):
    """The part of a connection the store uses (sqlite3's, or PostgreSQL's adapter)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """The statements and fragments that differ between backends."""

    #: the claim of due notices (parameters worker, token, now, lease, until, limit)
    claim: str
    #: the claim of chosen notices (the same, plus ids: a JSON array)
    claim_ids: str
    #: a round's compare-and-sets, from one JSON array parameter
    step_cas: str
    #: a subquery of the values of a JSON array of strings bound at ``{param}``
    ids_template: str
    #: the UTC day (YYYY-MM-DD) of an epoch-seconds expression ``{expr}``
    day_template: str
    #: "now" for lease comparisons: the caller's clock (``:now``), or the database's
    lease_now: str
    #: the database's own clock in epoch seconds, when several hosts share it and every
    #: decision must be made on it; None when only this host writes (its clock decides)
    database_clock: str | None
    #: the newest watermark on events that `alerts` may read up to (no later write can
    #: land below it)
    events_watermark: str
    #: an event (alias ``e``) compared with a watermark bound at ``{param}`` by ``{op}``
    event_mark_template: str
    #: the order of events along their watermark
    events_order: str
    #: ``notices`` read through the partial index over live notices only, for queries
    #: whose own order would let a planner walk finished rows instead
    live_notices: str
    #: what locks the rows a SELECT reads until the transaction ends (PostgreSQL's
    #: `` FOR UPDATE``); empty where the write transaction excludes every other writer
    lock_rows: str = ""
    #: the encoded size of the row of table alias ``{alias}`` as stored, where the
    #: database measures it (PostgreSQL); empty where the store encodes the record itself
    row_bytes_template: str = ""

    def ids(self, param: str = "?") -> str:
        """``(SELECT value FROM <json array at param>)``."""
        return self.ids_template.format(param=param)

    def day(self, expr: str) -> str:
        """The UTC calendar day of an epoch-seconds expression, as text."""
        return self.day_template.format(expr=expr)

    def event_mark(self, op: str, param: str) -> str:
        """The condition that an event's watermark stands ``op`` the one at ``param``."""
        return self.event_mark_template.format(op=op, param=param)
