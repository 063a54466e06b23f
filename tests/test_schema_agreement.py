"""SQLite's schema.sql and PostgreSQL's declare the same tables, columns, keys and indexes:
each is read back from a freshly created database, not from its file's text."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pgcluster
import pytest

from resetctl.store import Store
from resetctl.store.sqlite.schema import schema_sql, statements


class Column(NamedTuple):
    type: str
    not_null: bool
    default: str | None


class Index(NamedTuple):
    columns: tuple[str, ...]
    unique: bool
    #: the partial index's predicate, normalized; None for a whole-table index
    where: str | None


class Schema(NamedTuple):
    columns: dict[str, dict[str, Column]]
    primary_keys: dict[str, tuple[str, ...]]
    #: UNIQUE constraints by table (their index names are each database's own)
    unique: dict[str, set[tuple[str, ...]]]
    #: (table, columns) → (referenced table, columns, on delete)
    foreign_keys: dict[tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...], str]]
    #: indexes made by CREATE INDEX, by name
    indexes: dict[str, Index]


#: What exists on PostgreSQL alone, and why: event ids follow insert order there, not
#: commit order, so alerts' watermark reads the writing transaction (see the dialect).
POSTGRES_ONLY_COLUMNS = {("events", "xid")}
POSTGRES_ONLY_INDEXES = {"events_xid"}

#: The types each database declares, as one vocabulary (SQLite's INTEGER is 64-bit, so
#: PostgreSQL's BIGINT identity ids are the same column).
_TYPES = {
    "text": "text",
    "integer": "integer",
    "bigint": "integer",
    "real": "real",
    "double precision": "real",
}


def _type(declared: str) -> str:
    return _TYPES.get(declared.lower(), declared.lower())


def _predicate(text: str | None) -> str | None:
    """A partial index's predicate without the parentheses and case either database adds."""
    if text is None:
        return None
    text = re.sub(r"::\w+", "", text)  # PostgreSQL's casts of literals (::text)
    return re.sub(r"\s+", " ", text.replace("(", "").replace(")", "")).strip().lower()


def _default(value: Any) -> str | None:
    return None if value is None else str(value).strip("'").lower()


def sqlite_schema(conn: sqlite3.Connection) -> Schema:
    """The schema of a SQLite database, read from its catalog."""
    tables = [
        str(name)
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    schema = Schema({}, {}, {}, {}, {})
    for table in tables:
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
        # A primary key column is NOT NULL on PostgreSQL. SQLite's catalog says so only
        # when it is declared, though it enforces it on WITHOUT ROWID tables and an
        # INTEGER PRIMARY KEY (the rowid); every insert of the rest names the key.
        schema.columns[table] = {
            str(name): Column(_type(str(declared)), bool(not_null or pk), _default(default))
            for _, name, declared, not_null, default, pk in info
        }
        keyed = sorted((pk, str(name)) for _, name, _, _, _, pk in info if pk)
        schema.primary_keys[table] = tuple(name for _, name in keyed)
        schema.unique[table] = set()
        for _, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({table})"):
            columns = tuple(str(c[2]) for c in conn.execute(f"PRAGMA index_info({name})"))
            if origin == "u":
                schema.unique[table].add(columns)
            elif origin == "c":
                (sql,) = conn.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)
                ).fetchone()
                where = str(sql).split(" WHERE ", 1)[1] if partial else None
                schema.indexes[str(name)] = Index(columns, bool(unique), _predicate(where))
        references: dict[int, list[Any]] = {}
        for row in conn.execute(f"PRAGMA foreign_key_list({table})"):
            references.setdefault(row[0], []).append(row)
        for rows in references.values():
            rows.sort(key=lambda r: r[1])
            key = (table, tuple(str(r[3]) for r in rows))
            target = (str(rows[0][2]), tuple(str(r[4]) for r in rows), str(rows[0][6]).lower())
            schema.foreign_keys[key] = target
    return schema


#: pg_constraint.confdeltype, spelt as SQLite's foreign_key_list spells ON DELETE.
_ON_DELETE = {
    "a": "no action",
    "r": "restrict",
    "c": "cascade",
    "n": "set null",
    "d": "set default",
}


def postgres_schema(store: Store) -> Schema:
    """The schema of a PostgreSQL database (its current schema), read from its catalog."""
    conn = store.conn
    schema = Schema({}, {}, {}, {}, {})
    for table, name, declared, nullable, default in conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_schema = current_schema()"
        " ORDER BY table_name, ordinal_position"
    ).fetchall():
        if (table, name) in POSTGRES_ONLY_COLUMNS:
            continue
        column = Column(_type(str(declared)), nullable == "NO", _default(default))
        schema.columns.setdefault(str(table), {})[str(name)] = column
    for table in schema.columns:
        schema.primary_keys.setdefault(table, ())
        schema.unique.setdefault(table, set())

    def names(table_oid: int, numbers: list[int]) -> tuple[str, ...]:
        return tuple(
            str(
                conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = ? AND attnum = ?",
                    (table_oid, number),
                ).fetchone()[0]
            )
            for number in numbers
        )

    for table_oid, table, kind, keys, target_oid, target, target_keys, on_delete in conn.execute(
        "SELECT c.conrelid::int, t.relname, c.contype, c.conkey::int[], c.confrelid::int,"
        " r.relname, c.confkey::int[], c.confdeltype FROM pg_constraint c"
        " JOIN pg_class t ON t.oid = c.conrelid"
        " LEFT JOIN pg_class r ON r.oid = c.confrelid"
        " WHERE t.relnamespace = current_schema()::regnamespace AND c.contype IN ('p', 'u', 'f')"
    ).fetchall():
        columns = names(table_oid, list(keys))
        if kind == "p":
            schema.primary_keys[str(table)] = columns
        elif kind == "u":
            schema.unique[str(table)].add(columns)
        else:
            referenced = names(target_oid, list(target_keys))
            schema.foreign_keys[(str(table), columns)] = (
                str(target),
                referenced,
                _ON_DELETE[str(on_delete)],
            )
    for name, table_oid, unique, keys, where in conn.execute(
        "SELECT i.relname, x.indrelid::int, x.indisunique, x.indkey::int[],"
        " pg_get_expr(x.indpred, x.indrelid) FROM pg_index x"
        " JOIN pg_class i ON i.oid = x.indexrelid"
        " WHERE i.relnamespace = current_schema()::regnamespace"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)"
    ).fetchall():
        if name in POSTGRES_ONLY_INDEXES:
            continue
        columns = names(table_oid, list(keys))
        schema.indexes[str(name)] = Index(columns, bool(unique), _predicate(where))
    return schema


@pytest.fixture
def postgres_store(pg_admin: str) -> Iterator[Store]:
    """A store on a new, empty PostgreSQL database (the schema just applied)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    uri = pgcluster.create_database(pg_admin, name)
    try:
        with Store(uri) as store:
            yield store
    finally:
        pgcluster.drop_database(pg_admin, name)


@pytest.fixture
def sqlite_fresh(tmp_path: Path) -> Schema:
    with Store(tmp_path / "fresh.db") as store:
        assert isinstance(store.conn, sqlite3.Connection)
        return sqlite_schema(store.conn)


def test_both_schemas_declare_the_same_tables(sqlite_fresh: Schema, postgres_store: Store) -> None:
    """A new SQLite file and a new PostgreSQL database hold the same tables."""
    assert sorted(postgres_schema(postgres_store).columns) == sorted(sqlite_fresh.columns)


def test_both_schemas_declare_the_same_columns(sqlite_fresh: Schema, postgres_store: Store) -> None:
    """Every table has the same columns on both, with the same type (REAL is DOUBLE
    PRECISION, INTEGER is INTEGER or BIGINT), NOT NULL and default."""
    postgres = postgres_schema(postgres_store)
    for table, columns in sqlite_fresh.columns.items():
        assert postgres.columns.get(table) == columns, table


def test_both_schemas_declare_the_same_keys(sqlite_fresh: Schema, postgres_store: Store) -> None:
    """The same primary keys, UNIQUE constraints and foreign keys (with ON DELETE)."""
    postgres = postgres_schema(postgres_store)
    assert postgres.primary_keys == sqlite_fresh.primary_keys
    assert postgres.unique == sqlite_fresh.unique
    assert postgres.foreign_keys == sqlite_fresh.foreign_keys


def test_both_schemas_declare_the_same_indexes(sqlite_fresh: Schema, postgres_store: Store) -> None:
    """The same named indexes, on the same columns, with the same partial predicates."""
    assert postgres_schema(postgres_store).indexes == sqlite_fresh.indexes


def test_the_comparison_sees_a_schema_that_drifted(sqlite_fresh: Schema) -> None:
    """A column, a predicate or a uniqueness missing on one side is a difference."""
    drifted_script = (
        schema_sql()
        .replace("    lookup_failing_since REAL,", "")
        .replace("ON notices (due_at) WHERE due_at IS NOT NULL", "ON notices (due_at)")
        .replace("idempotency_key  TEXT    NOT NULL UNIQUE", "idempotency_key  TEXT    NOT NULL")
    )
    conn = sqlite3.connect(":memory:")
    for statement in statements(drifted_script):
        conn.execute(statement)
    drifted = sqlite_schema(conn)
    assert "lookup_failing_since" not in drifted.columns["attempts"]
    assert drifted.columns["attempts"] != sqlite_fresh.columns["attempts"]
    assert drifted.indexes["notices_due"] != sqlite_fresh.indexes["notices_due"]
    assert drifted.unique["notices"] != sqlite_fresh.unique["notices"]
