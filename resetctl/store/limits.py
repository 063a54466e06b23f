"""The abuse limits' counts and the requests refused for a policy reason: rows every
process and host shares, read under a lock so two writers count one after the other.
What a count allows is the machine's (:mod:`resetctl.machine.admission`); this module
reads and writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from resetctl.store.connection import StoreConnection


class LimitCounts(StoreConnection):
    """Limit counts and refusals (shared SQL). Call inside a write transaction."""

    def locked_counts(
        self, rule: str, policy: str, subjects: Sequence[str]
    ) -> dict[str, list[list[float]]]:
        """The counts of ``subjects`` under ``rule`` and ``policy``, their rows locked until
        the transaction ends (a subject never counted reads ``[]``).

        Rows are created first, so there is always a row to lock; they are locked in
        subject order, so two writers over overlapping subjects queue rather than cross.
        On SQLite the write transaction (BEGIN IMMEDIATE) already excludes other writers.
        """
        wanted = sorted(set(subjects))
        if not wanted:
            return {}
        self.conn.executemany(
            "INSERT INTO limit_counts (rule, policy, subject, counts, last_at)"
            " VALUES (?, ?, ?, '[]', 0) ON CONFLICT (rule, policy, subject) DO NOTHING",
            [(rule, policy, subject) for subject in wanted],
        )
        rows = self.conn.execute(
            "SELECT subject, counts FROM limit_counts WHERE rule = ? AND policy = ?"
            f" AND subject IN {self.sql.ids()} ORDER BY subject{self.sql.lock_rows}",
            (rule, policy, json.dumps(wanted)),
        )
        return {str(subject): json.loads(counts) for subject, counts in rows}

    def write_counts(
        self, rule: str, policy: str, counts: Mapping[str, list[list[float]]], now: float
    ) -> None:
        """Store the counts the machine allowed (rows :meth:`locked_counts` locked)."""
        self.conn.executemany(
            "UPDATE limit_counts SET counts = ?, last_at = ?"
            " WHERE rule = ? AND policy = ? AND subject = ?",
            [
                (json.dumps(value, separators=(",", ":")), now, rule, policy, subject)
                for subject, value in counts.items()
            ],
        )

    def count_refusals(self, refused: Mapping[tuple[str, str], int], now: float) -> None:
        """Add requests refused, by (policy, reason), to this minute's counts."""
        day = self.sql.day("?")
        self.conn.executemany(
            f"INSERT INTO refusals (day, minute, policy, reason, count)"
            f" VALUES ({day}, ?, ?, ?, ?) ON CONFLICT (day, minute, policy, reason)"
            " DO UPDATE SET count = refusals.count + excluded.count",
            [
                (now, int(now // 60), policy, reason, n)
                for (policy, reason), n in sorted(refused.items())
            ],
        )

    def refusal_counts(self, since: float) -> list[tuple[str, str, int]]:
        """(policy, reason, count) of requests refused from ``since``'s minute on (from
        0: all time, purged days' totals included)."""
        rows = self.conn.execute(
            "SELECT policy, reason, SUM(count) FROM refusals"
            " WHERE minute >= ? GROUP BY policy, reason ORDER BY policy, reason",
            (int(since // 60),),
        )
        return [(str(p), str(r), int(n)) for p, r, n in rows]
