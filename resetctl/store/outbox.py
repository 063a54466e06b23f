"""The outbox transport's storage: messages by attempt key, scriptable statuses, and the
messages a sweep's round holds back for the transaction that records their outcomes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

from resetctl.store.connection import StoreConnection
from resetctl.store.records import OutboxRow, outbox_message_id

#: A message, once per attempt key (deferred messages join the next transaction).
OUTBOX_INSERT = (
    "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
    " submitted_at, updated_at, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (attempt_key) DO NOTHING"
)
#: The message stored under an attempt key, if any.
OUTBOX_BY_KEY = "SELECT message_id, status FROM outbox WHERE attempt_key = ?"


class OutboxMessages(StoreConnection):
    """The outbox's messages (shared SQL)."""

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
        is the same message whether or not the first one was ever stored; a message
        already stored under the key answers with the id and status it has (it may carry
        an id of an older form, written by an older resetctl). Inside :meth:`defer_outbox` (a
        sweep's rounds), the message joins the next write transaction (the round's
        outcomes) instead of committing on its own, and a resubmission of a stored message
        reports the status it was submitted with (the next status read tells the current
        one): a crash before that commit is an attempt in doubt that recovery resubmits
        under the same key, as with any provider. See _flush_outbox for the stored id.
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
        if self._outbox_deferred:
            with self._deferred_lock:
                self._deferred_outbox.append(row)
            return message_id, status
        with self.transaction() as conn:
            stored = conn.execute(OUTBOX_INSERT + " RETURNING message_id, status", row).fetchone()
            if stored is None:  # this key was submitted before: the same message
                stored = conn.execute(OUTBOX_BY_KEY, (attempt_key,)).fetchone()
        return str(stored[0]), str(stored[1])

    @contextlib.contextmanager
    def _joined_writes(self) -> Iterator[None]:
        """Inside a backend's open write transaction (:meth:`transaction`): the deferred
        messages are written first, so they commit with the outcomes that record them;
        attempts that recorded an id other than the stored one are repointed after the
        caller's writes. If the transaction fails, the messages stay deferred for the next
        one."""
        with self._deferred_lock:
            deferred, self._deferred_outbox = self._deferred_outbox, []
        try:
            stale = self._flush_outbox(deferred) if deferred else []
            yield
            if stale:
                self._repoint_attempts(stale)
        except BaseException:
            with self._deferred_lock:
                self._deferred_outbox[:0] = deferred
            raise

    def _flush_outbox(self, deferred: Sequence[OutboxRow]) -> list[tuple[str, str, str]]:
        """Write deferred messages inside the caller's transaction. Returns
        (attempt_key, stored id, id reported) for each key that already had a message
        under another id, so the caller repoints the attempts that recorded the reported
        one (:meth:`_repoint_attempts`, after the round's facts are written).

        Only an older resetctl writes another id for a key (ids gained a time prefix in
        schema 4): a sweep of the old version still running when the file migrated. When
        every row was new, as almost always, this costs no statement beyond the insert.
        """
        written = self.conn.executemany(OUTBOX_INSERT, deferred)
        if written.rowcount == len(deferred):
            return []
        keys = json.dumps([row[1] for row in deferred])
        stored = {
            str(key): str(message_id)
            for key, message_id in self.conn.execute(
                f"SELECT attempt_key, message_id FROM outbox WHERE attempt_key IN {self.sql.ids()}",
                (keys,),
            )
        }
        return [
            (row[1], stored[row[1]], row[0])
            for row in deferred
            if row[1] in stored and stored[row[1]] != row[0]
        ]

    def _repoint_attempts(self, stale: Sequence[tuple[str, str, str]]) -> None:
        """Attempts that recorded a reported id for a message stored under another one
        point at the stored one (see :meth:`_flush_outbox`)."""
        self.conn.executemany(
            "UPDATE attempts SET message_id = ? WHERE attempt_key = ? AND message_id = ?",
            [(stored_id, key, reported) for key, stored_id, reported in stale],
        )

    def outbox_status(self, message_id: str) -> str | None:
        """The outbox message's current raw status."""
        return self.outbox_statuses([message_id]).get(message_id)

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
        with self._deferred_lock:
            pending_rows = list(self._deferred_outbox)
        for pending in pending_rows:  # not committed yet: as submitted
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
