"""What the SQL shared by both backends needs from a backend: a connection, a write
transaction, rows as dicts, and the dialect's few differing fragments.

Shared statements are written with SQLite's parameter style (``?`` and ``:name``); the
PostgreSQL connection translates them once per statement text.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from resetctl.machine import Attempt
from resetctl.store.interface import Store


class Cursor(Protocol):
    """The part of a DB-API cursor the store uses."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


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

    def ids(self, param: str = "?") -> str:
        """``(SELECT value FROM <json array at param>)``."""
        return self.ids_template.format(param=param)

    def day(self, expr: str) -> str:
        """The UTC calendar day of an epoch-seconds expression, as text."""
        return self.day_template.format(expr=expr)


class SqlBackend(Store):
    """A store whose SQL is shared: the concerns (claims and steps, reads, outbox) are
    mixins over this, and each backend supplies the connection and the dialect."""

    conn: Connection
    sql: Dialect

    @abstractmethod
    def _attempts_where(
        self, where: str, params: Sequence[object]
    ) -> dict[str, tuple[Attempt, ...]]:
        """Attempts (with folded statuses) matching ``where``, by notice."""

    @abstractmethod
    def _dicts(
        self, sql: str, params: Sequence[object] | dict[str, object]
    ) -> list[dict[str, Any]]:
        """Rows of a read-only query as dicts."""
