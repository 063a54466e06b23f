"""The PostgreSQL connection: psycopg 3, autocommit, time-outs on every statement, and the
shared statements' SQLite parameter style (``?``, ``:name``) translated once per text."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from resetctl.errors import StoreError

if TYPE_CHECKING:
    import psycopg

#: What a PostgreSQL URI needs when the driver is missing.
INSTALL_HINT = "pip install 'resetctl[postgres]'"
#: Every statement gives up after this long (a stuck lock or a runaway query is a crash,
#: and a crash is recovered by the lease): milliseconds.
STATEMENT_TIMEOUT_MS = 30_000
#: A row lock is waited for at most this long (claims skip locked rows and never wait).
LOCK_TIMEOUT_MS = 10_000
#: Connecting gives up after this long: seconds.
CONNECT_TIMEOUT_S = 10

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """SQLite's parameter style to psycopg's: ``?`` → ``%s``, ``:name`` → ``%(name)s``,
    a literal ``%`` doubled; quoted text is left alone (bar its ``%``)."""
    parts = sql.split("'")
    for i, part in enumerate(parts):
        part = part.replace("%", "%%")
        if i % 2 == 0:  # outside a string literal
            part = _NAMED.sub(r"%(\1)s", part.replace("?", "%s"))
        parts[i] = part
    return "'".join(parts)


def _plain(value: Any) -> Any:
    """SUM over integers is numeric in PostgreSQL: give callers ints, as SQLite does."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _row(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_plain(v) for v in values)


class Cursor:
    """A finished statement's rows (fetched at once: every result here is small)."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


class PgConnection:
    """sqlite3's ``execute``/``executemany`` over a psycopg connection."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Any = None, /) -> Cursor:
        with self.raw.cursor() as cur:
            cur.execute(translate(sql) if parameters is not None else sql, parameters)
            rows = [_row(r) for r in cur.fetchall()] if cur.description else []
            return Cursor(rows, cur.rowcount)

    def executemany(self, sql: str, parameters: Any, /) -> Cursor:
        params = list(parameters)
        if not params:
            return Cursor([], 0)
        with self.raw.cursor() as cur:
            cur.executemany(translate(sql), params)
            return Cursor([], cur.rowcount)

    def dicts(self, sql: str, parameters: Any) -> list[dict[str, Any]]:
        with self.raw.cursor() as cur:
            cur.execute(translate(sql), parameters)
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, _row(r), strict=True)) for r in cur.fetchall()]

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> PgConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(uri: str, application_name: str = "resetctl") -> PgConnection:
    """An autocommit connection with statement and lock time-outs. The password comes
    from libpq's own sources (PGPASSWORD, ~/.pgpass, a service file), never from argv."""
    try:
        import psycopg
    except ImportError:
        raise StoreError(
            f"database {redacted(uri)}: PostgreSQL needs the driver: {INSTALL_HINT}"
        ) from None
    try:
        raw = psycopg.connect(
            uri,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=application_name,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"
            f" -c lock_timeout={LOCK_TIMEOUT_MS} -c TimeZone=UTC",
        )
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"database {redacted(uri)}: {reason}") from None
    return PgConnection(raw)


def redacted(uri: str) -> str:
    """The URI without any password it carries (for messages)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", re.sub(r"password=[^&]*", "password=***", uri))
