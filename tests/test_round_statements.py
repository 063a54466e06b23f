"""A round's writes are set-based: the statements a sweep sends to SQLite do not grow with
the number of notices in its batch (each row's compare-and-set stays per row, inside one
statement), and neither do the outbox's status reads (one query per round)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, run_sweep

from resetctl.enqueue import enqueue
from resetctl.store import Store


class CountingConnection:
    """A sqlite3 connection that counts the statements handed to it (executemany once)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.calls: Counter[str] = Counter()

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.calls[sql.split()[0].upper()] += 1
        return self.conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.calls[sql.split()[0].upper()] += 1
        return self.conn.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _statements(tmp_path: Any, batch: int) -> tuple[int, int]:
    """Statements issued by a one-batch sweep to submission, then one to acceptance."""
    settings = make_settings(outbox={"email_status": "pending"})
    clock = FakeClock()
    with Store(tmp_path / f"b{batch}.db") as store:
        enqueue(store, settings, [reset_request() for _ in range(batch)], clock())
        counting = CountingConnection(store.conn)
        store.conn = counting  # type: ignore[assignment]
        summary = run_sweep(store, settings, clock, batch_size=batch)
        assert summary.submitted == batch
        submitted = sum(counting.calls.values())
        with store.transaction() as conn:
            conn.execute("UPDATE outbox SET status = 'delivered'")
        counting.calls.clear()
        clock.advance(15)
        summary = run_sweep(store, settings, clock, batch_size=batch)
        assert summary.accepted == batch
        return submitted, sum(counting.calls.values())


@pytest.mark.parametrize("stage", [0, 1], ids=["to submitted", "to accepted"])
def test_statements_per_round_do_not_grow_with_the_batch(tmp_path: Any, stage: int) -> None:
    """A batch of 200 costs the statements of a batch of 5: the writes are set-based, and
    the outbox reads a round's statuses in one query."""
    small = _statements(tmp_path, 5)[stage]
    large = _statements(tmp_path, 200)[stage]
    assert large == small
    # (Three of them turn the connection's own checkpoints off for the sweep and back on.)
    assert small < 43
