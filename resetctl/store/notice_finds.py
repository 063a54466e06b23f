"""Finding notices the way on-call and the application name them: by idempotency key, by
account, by phase, region and age; and the live notices of accounts (what a newer notice
supersedes). Every query walks an index: the live notices' partial index, the account's,
or creation time bounded by a start; never every finished notice."""

from __future__ import annotations

import json
from collections.abc import Sequence

from resetctl.store.notice_reads import NoticeReads
from resetctl.store.records import NOTICE_COLUMNS, LoadedNotice, loaded_notice


class NoticeFinds(NoticeReads):
    """Lookups by the application's names for a notice (shared SQL)."""

    def notice_id_for_key(self, idempotency_key: str) -> str | None:
        """The notice enqueued under ``idempotency_key``; None when there is none."""
        row = self.conn.execute(
            "SELECT id FROM notices WHERE idempotency_key = ?", (idempotency_key,)
        ).fetchone()
        return None if row is None else str(row[0])

    def find_notices(
        self,
        *,
        limit: int,
        phases: Sequence[str] = (),
        region: str | None = None,
        account_ref: str | None = None,
        since: float | None = None,
        live_only: bool = False,
    ) -> list[LoadedNotice]:
        """Notices newest first, at most ``limit``, with their attempts.

        With ``account_ref`` the account's index is walked; with ``live_only`` (every
        phase asked for is live) the live notices' partial index; otherwise creation
        time from ``since``, which the caller must then give.
        """
        where: list[str] = []
        params: dict[str, object] = {"limit": limit}
        source = "notices"
        if account_ref is not None:
            where.append("account_ref = :account")
            params["account"] = account_ref
        elif live_only:
            source = self.sql.live_notices
        elif since is None:
            raise ValueError("a search over finished notices needs a start (since)")
        if live_only:
            where.append("due_at IS NOT NULL")
        if since is not None:
            where.append("created_at >= :since")
            params["since"] = since
        if phases:
            where.append(f"phase IN {self.sql.ids(':phases')}")
            params["phases"] = json.dumps(list(phases))
        if region is not None:
            where.append("region = :region")
            params["region"] = region
        rows = self.conn.execute(
            f"SELECT {NOTICE_COLUMNS} FROM {source}"
            f" WHERE {' AND '.join(where) or 'TRUE'}"
            " ORDER BY created_at DESC, id DESC LIMIT :limit",
            params,
        ).fetchall()
        return self._with_attempts(rows)

    def live_for_accounts(self, accounts: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """(notice_id, region, account_ref) of the live notices of each (region,
        account_ref), oldest first: ids only, for a cancel that loads them itself."""
        if not accounts:
            return []
        rows = self.conn.execute(
            "SELECT id, region, account_ref FROM notices WHERE account_ref IN"
            f" {self.sql.ids()} AND due_at IS NOT NULL ORDER BY created_at, id",
            (json.dumps(sorted({account for _, account in accounts})),),
        ).fetchall()
        wanted = set(accounts)
        return [(str(i), str(r), str(a)) for i, r, a in rows if (r, a) in wanted]

    def _with_attempts(self, rows: Sequence[Sequence[object]]) -> list[LoadedNotice]:
        if not rows:
            return []
        chosen = json.dumps([row[0] for row in rows])
        attempts = self._attempts_where(f"a.notice_id IN {self.sql.ids()}", (chosen,))
        return [loaded_notice(row, attempts.get(str(row[0]), ())) for row in rows]
