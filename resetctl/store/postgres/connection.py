"""The PostgreSQL connection: psycopg 3, autocommit, time-outs on every statement, and the
shared statements' SQLite parameter style (``?``, ``:name``) translated once per text."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlencode

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
            conninfo(uri),
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


def conninfo(db: str) -> str:
    """``db`` as libpq is given it: a URI's scheme in lower case (a scheme is
    case-insensitive, RFC 3986 3.1; libpq knows only the lower-case spellings)."""
    text = db.strip()
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in ("postgresql", "postgres"):
        return f"{scheme.lower()}://{rest}"
    return text


#: A password's key in a connection string, once percent-decoded, in any case
#: (``password``, ``sslpassword``; libpq refuses a ``PASSWORD=`` with a message that
#: quotes the string, so it is caught here first).
_PASSWORD_KEY = re.compile(r"(?:^|[\s?&])(?:ssl)?password\s*=", re.IGNORECASE)


#: How ``redacted`` names a database it cannot show: one that does not parse, or that
#: carries a password (whose unencoded ``@`` or ``/`` would shift libpq's parse, so that
#: any part rebuilt from it could hold a piece of the password).
NOT_SHOWN = "postgresql://…"


def names_password(db: str) -> bool:
    """True when ``db`` carries a password, or may: a ``:`` in what precedes a URI's last
    ``@`` (user information, however badly encoded), or any spelling of a password key,
    percent-encoded or not."""
    text = conninfo(db)
    if _PASSWORD_KEY.search(unquote(text)):
        return True
    return "://" in text and ":" in text.partition("://")[2].rpartition("@")[0]


def parsed(db: str) -> dict[str, str] | None:
    """libpq's own parse of ``db`` (psycopg's ``conninfo_to_dict``); None when it cannot
    parse it or the driver is missing."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return None
    try:
        return {k: str(v) for k, v in conninfo_to_dict(conninfo(db)).items() if v is not None}
    except Exception:  # libpq's parse errors quote the string: never shown
        return None


def redacted(db: str) -> str:
    """How a PostgreSQL database is named in messages: a URI rebuilt from libpq's parse
    of ``db`` with only its user, host, port, database name and service, so no password
    (nor the text as given, whatever it holds) can appear; :data:`NOT_SHOWN` when it does
    not parse or names a password."""
    parts = None if names_password(db) else parsed(db)
    if parts is None:
        return NOT_SHOWN
    host = parts.get("host", "")
    query = {}
    if host.startswith(("/", "@")):  # a socket directory (or an abstract socket)
        query["host"], host = host, ""
    elif ":" in host and "," not in host:
        host = f"[{host}]"
    if "service" in parts:
        query["service"] = parts["service"]
    user = f"{quote(parts['user'], safe='')}@" if "user" in parts else ""
    port = f":{quote(parts['port'], safe=',')}" if "port" in parts else ""
    dbname = f"/{quote(parts['dbname'], safe='')}" if "dbname" in parts else ""
    netloc = f"{user}{quote(host, safe=',[]:')}{port}"
    tail = f"?{urlencode(query, safe='/')}" if query else ""
    return f"postgresql://{netloc}{dbname or ('/' if tail else '')}{tail}"
