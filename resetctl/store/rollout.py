"""Rollout's rows: the notices enqueued in shadow, the idempotency keys answered out of the
slice, and what health counts of both. What a rollout means is :mod:`resetctl.rollout`'s;
this module reads and writes."""

from __future__ import annotations

import json
from collections.abc import Sequence

from resetctl.store.connection import StoreConnection

#: The daily_counts kind that keeps the slice answers an enqueue pruned (health's count of
#: them over windows longer than the answers are kept).
DERIVED_OUT_OF_SLICE = "health:out_of_slice"
#: A slice answer as recorded: idempotency key, request digest, policy name, answered at,
#: kept until.
SliceAnswer = tuple[str, str, str, float, float]


class RolloutRecords(StoreConnection):
    """Shadow marks and slice answers (shared SQL)."""

    def mark_shadow(self, notice_ids: Sequence[str]) -> None:
        """Record that these notices were enqueued in shadow. Call inside the enqueue's
        transaction, after their insert: the mark commits with the notice."""
        self.conn.executemany(
            "INSERT INTO shadow_notices (notice_id) VALUES (?) ON CONFLICT (notice_id) DO NOTHING",
            [(notice_id,) for notice_id in notice_ids],
        )

    def shadow_among(self, notice_ids: Sequence[str]) -> set[str]:
        """The notices among ``notice_ids`` that were enqueued in shadow."""
        if not notice_ids:
            return set()
        rows = self.conn.execute(
            f"SELECT notice_id FROM shadow_notices WHERE notice_id IN {self.sql.ids()}",
            (json.dumps(list(notice_ids)),),
        )
        return {str(notice_id) for (notice_id,) in rows}

    def slice_answers(self, keys: Sequence[str]) -> dict[str, str]:
        """The request digest of each key among ``keys`` answered out of the slice."""
        if not keys:
            return {}
        rows = self.conn.execute(
            "SELECT idempotency_key, request_digest FROM slice_answers"
            f" WHERE idempotency_key IN {self.sql.ids()}",
            (json.dumps(list(keys)),),
        )
        return {str(key): str(digest) for key, digest in rows}

    def record_slice_answers(self, answers: Sequence[SliceAnswer]) -> None:
        """Record keys answered out of the slice; a key answered already keeps its first
        answer (a racing enqueue's). Call inside the enqueue's transaction."""
        self.conn.executemany(
            "INSERT INTO slice_answers (idempotency_key, request_digest, policy, answered_at,"
            " keep_until) VALUES (?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
            list(answers),
        )

    def prune_slice_answers(self, now: float, limit: int) -> int:
        """Fold up to ``limit`` answers kept past ``keep_until`` into daily_counts (by the
        day they were answered) and delete them, by the index on keep_until. Call inside
        a write transaction. Returns how many went."""
        chosen = [
            str(key)
            for (key,) in self.conn.execute(
                "SELECT idempotency_key FROM slice_answers WHERE keep_until < ?"
                " ORDER BY keep_until LIMIT ?",
                (now, limit),
            )
        ]
        if not chosen:
            return 0
        ids = json.dumps(chosen)
        self.conn.execute(
            "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status,"
            " reason, policy, policy_version, template_version, count)"
            f" SELECT {self.sql.day('answered_at')}, ?, '', '', '', '', '', policy, 0, '',"
            f" COUNT(*) FROM slice_answers WHERE idempotency_key IN {self.sql.ids()}"
            " GROUP BY 1, 8 ON CONFLICT (day, kind, old_phase, new_phase, channel, status,"
            " reason, policy, policy_version, template_version)"
            " DO UPDATE SET count = daily_counts.count + excluded.count",
            (DERIVED_OUT_OF_SLICE, ids),
        )
        deleted = self.conn.execute(
            f"DELETE FROM slice_answers WHERE idempotency_key IN {self.sql.ids()}", (ids,)
        ).rowcount
        return int(deleted)

    def would_send_counts(self, since: float) -> list[tuple[str, str, int]]:
        """(policy, channel, count) of shadow notices' would-sends since ``since``: their
        ``shadow`` events, plus the daily aggregates of purged days."""
        rows = self.conn.execute(
            "SELECT policy, channel, SUM(count) FROM ("
            " SELECT n.policy_name AS policy, e.channel AS channel, COUNT(*) AS count"
            " FROM events e JOIN notices n ON n.id = e.notice_id"
            " WHERE e.at >= :since AND e.kind = 'shadow' GROUP BY 1, 2"
            " UNION ALL SELECT policy, channel, count FROM daily_counts"
            f" WHERE kind = 'shadow' AND day >= {self.sql.day(':since')}) AS shadowed"
            " GROUP BY 1, 2 ORDER BY 1, 2",
            {"since": since},
        )
        return [(str(p), str(c), int(n)) for p, c, n in rows]

    def out_of_slice_counts(self, since: float) -> list[tuple[str, int]]:
        """(policy, count) of requests answered out of the slice since ``since``: the
        answers kept, plus the pruned ones by their day."""
        rows = self.conn.execute(
            "SELECT policy, SUM(count) FROM ("
            " SELECT policy, COUNT(*) AS count FROM slice_answers WHERE answered_at >= :since"
            " GROUP BY 1 UNION ALL SELECT policy, count FROM daily_counts WHERE kind = :kind"
            f" AND day >= {self.sql.day(':since')}) AS answered GROUP BY 1 ORDER BY 1",
            {"since": since, "kind": DERIVED_OUT_OF_SLICE},
        )
        return [(str(p), int(n)) for p, n in rows]
