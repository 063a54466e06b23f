"""The outbox transport's storage: messages by attempt key, scriptable statuses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from resetctl.store.common import SqlBackend
from resetctl.store.records import outbox_message_id


class OutboxRecords(SqlBackend):
    """The outbox's messages (shared SQL)."""

    #: a message, once per attempt key (deferred messages join the next transaction)
    OUTBOX_INSERT = (
        "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
        " submitted_at, updated_at, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (attempt_key) DO NOTHING"
    )

    # -- outbox -----------------------------------------------------------------------

    def outbox_submit(
        self,
        attempt_key: str,
        notice_id: str,
        channel: str,
        content: dict[str, Any],
        status: str,
        now: float,
    ) -> tuple[str, str]:
        """Store a message once per attempt key; returns (message_id, current status).

        The message id follows from the attempt key, so a resubmission under the same key
        is the same message whether or not the first one was ever stored. With
        ``defer_outbox`` on (a sweep's rounds), the message joins the next write
        transaction (the round's outcomes) instead of committing on its own, and a
        resubmission of a stored message reports the status it was submitted with (the
        next status read tells the current one): a crash before that commit is an attempt
        in doubt that recovery resubmits under the same key, as with any provider.
        """
        message_id = outbox_message_id(attempt_key)
        row = (
            message_id,
            attempt_key,
            notice_id,
            channel,
            status,
            now,
            now,
            json.dumps(content),
        )
        if self.defer_outbox:
            self._deferred_outbox.append(row)
            return message_id, status
        with self.transaction() as conn:
            stored = conn.execute(self.OUTBOX_INSERT + " RETURNING status", row).fetchone()
            if stored is None:  # this key was submitted before: the same message
                stored = conn.execute(
                    "SELECT status FROM outbox WHERE attempt_key = ?", (attempt_key,)
                ).fetchone()
        return message_id, str(stored[0])

    def outbox_status(self, message_id: str) -> str | None:
        """The outbox message's current raw status."""
        for pending in self._deferred_outbox:
            if pending[0] == message_id:
                return str(pending[4])
        row = self.conn.execute(
            "SELECT status FROM outbox WHERE message_id = ?", (message_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def outbox_statuses(self, message_ids: Sequence[str]) -> dict[str, str]:
        """The current raw status of each known outbox message, by id, in one query."""
        found: dict[str, str] = {
            str(mid): str(status)
            for mid, status in self.conn.execute(
                f"SELECT message_id, status FROM outbox WHERE message_id IN {self.sql.ids()}",
                (json.dumps(list(message_ids)),),
            )
        }
        wanted = set(message_ids)
        for pending in self._deferred_outbox:  # not committed yet: as submitted
            if pending[0] in wanted:
                found[str(pending[0])] = str(pending[4])
        return found

    def outbox_set_status(self, message_id: str, status: str, now: float) -> bool:
        """Script a message's status; False when the message is unknown."""
        with self.transaction() as conn:
            changed = conn.execute(
                "UPDATE outbox SET status = ?, updated_at = ? WHERE message_id = ?",
                (status, now, message_id),
            ).rowcount
        return bool(changed == 1)

    def outbox_messages(self, notice_id: str | None = None) -> list[dict[str, Any]]:
        """Outbox messages, oldest first, without their content."""
        where, params = ("WHERE notice_id = ?", (notice_id,)) if notice_id else ("", ())
        return self._dicts(
            "SELECT message_id, notice_id, channel, attempt_key, status, submitted_at"
            f" FROM outbox {where} ORDER BY submitted_at, message_id",
            params,
        )

    def outbox_message(self, message_id: str) -> dict[str, Any] | None:
        """One outbox message with its rendered content."""
        rows = self._dicts(
            "SELECT message_id, notice_id, channel, attempt_key, status, submitted_at, content"
            " FROM outbox WHERE message_id = ?",
            (message_id,),
        )
        if not rows:
            return None
        row = rows[0]
        row.update(json.loads(row.pop("content")))
        return row
