"""How the store tells its two backends apart, and what differs between them.

A backend is SQLite (``resetctl.store.sqlite``) or PostgreSQL (``resetctl.store.postgres``);
each holds only its connection handling (a connection, write transactions, rows as dicts,
a few catalog reads), its :class:`Dialect` (the SQL fragments that differ) and its schema
with migrations. Every statement they share is written once, in the store, with SQLite's
parameter style (``?`` and ``:name``), which the PostgreSQL connection translates once per
statement text.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: URI schemes that name a PostgreSQL database (libpq's own spellings).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(db: str | Path) -> bool:
    """True when ``db`` is a PostgreSQL connection URI rather than a file path."""
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


def database_errors() -> tuple[type[Exception], ...]:
    """The driver exceptions a database failure raises (a full disk, a lost server)."""
    errors: list[type[Exception]] = [sqlite3.Error]
    if "psycopg" in sys.modules:
        errors.append(sys.modules["psycopg"].Error)
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

    def ids(self, param: str = "?") -> str:
        """``(SELECT value FROM <json array at param>)``."""
        return self.ids_template.format(param=param)

    def day(self, expr: str) -> str:
        """The UTC calendar day of an epoch-seconds expression, as text."""
        return self.day_template.format(expr=expr)

    def event_mark(self, op: str, param: str) -> str:
        """The condition that an event's watermark stands ``op`` the one at ``param``."""
        return self.event_mark_template.format(op=op, param=param)
