"""A notice as a worker or a callback reads it: the row with its attempts and folded
statuses, the secret half, what a lookup must match, the policy it was enqueued under,
the attempt a callback names, and when the next notice falls due.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from resetctl.errors import StoreError
from resetctl.machine import ATTEMPT_STATES, STATUSES, Attempt, Status, fold_status
from resetctl.policy import Policy
from resetctl.schema_facts import NEXT_DUE_SQL
from resetctl.store.connection import StoreConnection
from resetctl.store.records import NOTICE_COLUMNS, Contact, LoadedNotice, loaded_notice


class NoticeReads(StoreConnection):
    """Notices, attempts, contacts and policies as the machine is given them (shared SQL)."""

    def load_policy(self, name: str, version: int) -> Policy:
        """The policy a notice was enqueued under."""
        row = self.conn.execute(
            "SELECT body FROM policies WHERE name = ? AND version = ?", (name, version)
        ).fetchone()
        if row is None:
            raise StoreError(f"policy.{name} version {version} is missing from the database")
        return Policy.from_record(json.loads(row[0]))

    def load_notice(self, notice_id: str) -> LoadedNotice | None:
        """A notice with its attempts and folded statuses; None when unknown."""
        row = self.conn.execute(
            f"SELECT {NOTICE_COLUMNS} FROM notices WHERE id = ?", (notice_id,)
        ).fetchone()
        if row is None:
            return None
        attempts = self._attempts_where("a.notice_id = ?", (notice_id,))
        return loaded_notice(row, attempts.get(notice_id, ()))

    def load_notices(self, notice_ids: Sequence[str]) -> dict[str, LoadedNotice]:
        """Several notices with their attempts, in two queries (a claimed batch)."""
        chosen = json.dumps(list(notice_ids))
        rows = self.conn.execute(
            f"SELECT {NOTICE_COLUMNS} FROM notices WHERE id IN {self.sql.ids()}",
            (chosen,),
        ).fetchall()
        attempts = self._attempts_where(f"a.notice_id IN {self.sql.ids()}", (chosen,))
        return {row[0]: loaded_notice(row, attempts.get(row[0], ())) for row in rows}

    def load_contact(self, notice_id: str) -> Contact | None:
        """The secret half of a notice; None once scrubbed. Only the lease holder reads it."""
        return self.load_contacts([notice_id]).get(notice_id)

    def load_contacts(self, notice_ids: Sequence[str]) -> dict[str, Contact]:
        """The secret halves of several notices (scrubbed ones are absent). Only the lease
        holder reads them."""
        rows = self.conn.execute(
            "SELECT notice_id, email, phone, reset_url, display_name FROM notice_secrets"
            f" WHERE notice_id IN {self.sql.ids()}",
            (json.dumps(list(notice_ids)),),
        )
        return {row[0]: Contact(*row[1:]) for row in rows}

    def load_fingerprints(self, attempt_keys: Sequence[str]) -> dict[str, dict[str, str]]:
        """What each attempt's lookup must match, as recorded at its intent (attempts
        without one, sent before it was kept, are absent)."""
        rows = self.conn.execute(
            "SELECT attempt_key, sent FROM attempts"
            f" WHERE attempt_key IN {self.sql.ids()} AND sent IS NOT NULL",
            (json.dumps(list(attempt_keys)),),
        )
        found: dict[str, dict[str, str]] = {}
        for key, sent in rows:
            value = json.loads(sent)
            if isinstance(value, dict):
                found[str(key)] = {str(k): str(v) for k, v in value.items()}
        return found

    def _attempts_where(
        self, where: str, params: Sequence[object]
    ) -> dict[str, tuple[Attempt, ...]]:
        rows = self.conn.execute(
            "SELECT a.attempt_key, a.channel, a.state, a.started_at, a.last_call_at,"
            " a.submitted_at, a.message_id, a.calls, a.settled, a.polls, a.recoverable,"
            " o.status, a.notice_id, a.last_read_at, a.lookup_settle, a.lookups,"
            " a.first_lookup_at, a.call_mono, a.lookup_mono, a.lookup_failing_since,"
            " a.transport"
            " FROM attempts a"
            " LEFT JOIN observations o ON o.attempt_key = a.attempt_key"
            f" WHERE {where} ORDER BY a.notice_id, a.started_at, a.attempt_key, o.id",
            params,
        ).fetchall()
        statuses: dict[str, list[Status]] = {}
        heads: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            heads.setdefault(row[0], row)
            bucket = statuses.setdefault(row[0], [])
            if row[11] is not None:
                bucket.append(STATUSES[row[11]])
        by_notice: dict[str, list[Attempt]] = {}
        for key, head in heads.items():
            by_notice.setdefault(head[12], []).append(
                Attempt(  # positional: Attempt's field order
                    head[1],  # channel
                    key,
                    ATTEMPT_STATES[head[2]],
                    head[3],  # started_at
                    head[4],  # last_call_at
                    head[5],  # submitted_at
                    head[6],  # message_id
                    head[7],  # calls
                    head[8],  # settled
                    head[9],  # polls
                    fold_status(statuses[key]),
                    bool(head[10]),  # recoverable
                    head[13],  # last_read_at
                    head[14],  # lookup_settle
                    head[15],  # lookups
                    head[16],  # first_lookup_at
                    head[17],  # call_mono
                    head[18],  # lookup_mono
                    head[19],  # lookup_failing_since
                    head[20],  # transport: the instance of its latest call
                )
            )
        return {notice: tuple(found) for notice, found in by_notice.items()}

    def attempt_for_message(self, transport: str, message_id: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of a provider's message, for callbacks."""
        row = self.conn.execute(
            "SELECT notice_id, channel, attempt_key FROM attempts"
            " WHERE transport = ? AND message_id = ?",
            (transport, message_id),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def attempt_by_key(self, transport: str, attempt_key: str) -> tuple[str, str, str] | None:
        """(notice_id, channel, attempt_key) of an attempt by its key, for callbacks that
        carry it (an ambiguous attempt has no provider id yet)."""
        row = self.conn.execute(
            "SELECT notice_id, channel, attempt_key FROM attempts"
            " WHERE attempt_key = ? AND transport = ?",
            (attempt_key, transport),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), str(row[2]))

    def observation_seen(self, dedupe: str) -> bool:
        """True when a callback with this identity was stored already. Call inside the
        write transaction that would store it (the unique index backs it up)."""
        row = self.conn.execute("SELECT 1 FROM observations WHERE dedupe = ?", (dedupe,)).fetchone()
        return row is not None

    def next_due_at(self) -> float | None:
        """The earliest due time of any live notice (leased ones fall due at lease end)."""
        (due,) = self.conn.execute(NEXT_DUE_SQL).fetchone() or (None,)
        return None if due is None else float(due)

    def live_notices(self) -> list[LoadedNotice]:
        """Every live notice with its attempts (for `alerts`), in two queries."""
        rows = self.conn.execute(
            f"SELECT {NOTICE_COLUMNS} FROM notices WHERE due_at IS NOT NULL ORDER BY due_at"
        ).fetchall()
        attempts = self._attempts_where(
            "a.notice_id IN (SELECT id FROM notices WHERE due_at IS NOT NULL)", ()
        )
        return [loaded_notice(row, attempts.get(row[0], ())) for row in rows]
