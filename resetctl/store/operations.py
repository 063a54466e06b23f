"""What the operational commands read and keep: the meta table (the salt, watermarks, the
last sweep), inspect's rows, alerts' records, health and metrics counts, purge's short
delete batches, and the timings export.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from resetctl.errors import StoreError
from resetctl.machine import Phase
from resetctl.policy import Policy
from resetctl.schema_facts import RECORD_SWEEP_SQL, sweep_record
from resetctl.store.backend import Connection
from resetctl.store.measures import Measures

#: Kinds of daily_counts rows that are not events: per-notice figures `health` reads over
#: a window, folded in by `purge` so a window over purged days still adds up.
DERIVED_ATTEMPT = "health:attempt"

#: An attempt's outcome for `health`: the latest normalized status, or the submission's
#: own end when nothing was observed.
_ATTEMPT_OUTCOME = (
    "CASE a.state WHEN 'rejected' THEN 'failed'"
    " WHEN 'ambiguous' THEN 'ambiguous' WHEN 'intent' THEN 'unsent' ELSE"
    " COALESCE((SELECT o.status FROM observations o WHERE o.attempt_key ="
    " a.attempt_key ORDER BY o.id DESC LIMIT 1), 'pending') END"
)
#: Live notices by the policy record they were enqueued under (its body names their
#: template version): the grouping reads the partial index over live notices only.
LIVE_POLICY_COUNTS_SQL = (
    "SELECT l.policy_name, l.policy_version, p.body, l.live FROM"
    " (SELECT policy_name, policy_version, COUNT(*) AS live FROM notices"
    " WHERE due_at IS NOT NULL GROUP BY policy_name, policy_version) AS l"
    " LEFT JOIN policies p ON p.name = l.policy_name AND p.version = l.policy_version"
    " ORDER BY l.policy_name, l.policy_version"
)
#: The day that holds, per dimension, the counts of every day past the aggregates'
#: retention: all-time sums (the metrics' counters, read from 0) never go down when a day
#: goes, and no window health reads (it starts after 1970) reaches it.
ALL_TIME_DAY = "1970-01-01"
#: Finished notices of one policy that finished before a cutoff, oldest first: a walk of
#: the index over finished notices by policy (notices_finished_policy).
_FINISHED_OF_POLICY = (
    "SELECT id FROM notices WHERE due_at IS NULL AND policy_name = ? AND phase_since < ?"
    " ORDER BY phase_since LIMIT ?"
)
_FINISHED = (
    "SELECT id FROM notices WHERE due_at IS NULL AND phase_since < ? ORDER BY phase_since LIMIT ?"
)
#: Where a derived daily_counts row is folded in; counts add up on conflict.
_FOLD_INTO_DAILY = (
    "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status,"
    " reason, policy, policy_version, template_version, count) "
)
_FOLD_CONFLICT = (
    " ON CONFLICT (day, kind, old_phase, new_phase, channel, status, reason, policy,"
    " policy_version, template_version) DO UPDATE SET count = daily_counts.count + excluded.count"
)


class Operations(Measures):
    """Inspect, alerts, health, metrics, purge and export (shared SQL)."""

    def salt(self) -> bytes:
        """This database's secret salt for digests and recipient hashes."""
        (value,) = self.conn.execute("SELECT value FROM meta WHERE key = 'salt'").fetchone()
        return bytes.fromhex(value)

    def meta_value(self, key: str) -> str | None:
        """A value of the meta table (watermarks, last sweep)."""
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def record_sweep(self, finished_at: float, duration: float) -> None:
        """Remember the last sweep's end and duration (for metrics)."""
        with self.transaction() as conn:
            conn.executemany(RECORD_SWEEP_SQL, sweep_record(finished_at, duration))

    def add_lane_counts(self, counts: Mapping[str, Mapping[str, float]]) -> None:
        """Add one sweep's per-transport lane counts (calls, throttled, waited seconds)
        to the running totals, and keep the largest in-flight peak; every process and
        host adds to the same rows."""
        with self.transaction() as conn:
            for transport, added in counts.items():
                key = f"lane:{transport}"
                row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
                totals: dict[str, float] = json.loads(row[0]) if row else {}
                for name, value in added.items():
                    if name == "peak_in_flight":
                        totals[name] = max(totals.get(name, 0), value)
                    else:
                        totals[name] = totals.get(name, 0) + value
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(totals, sort_keys=True)),
                )

    def lane_counts(self) -> dict[str, dict[str, float]]:
        """Each transport's lane totals, as sweeps added them (see add_lane_counts)."""
        rows = self.conn.execute("SELECT key, value FROM meta WHERE key LIKE 'lane:%'").fetchall()
        return {str(key)[5:]: json.loads(value) for key, value in sorted(rows)}

    def last_sweep(self) -> tuple[float, float] | None:
        """(finished_at, duration) of the last recorded sweep."""
        rows = dict(
            self.conn.execute(
                "SELECT key, value FROM meta WHERE key IN ('last_sweep_at', 'last_sweep_duration')"
            ).fetchall()
        )
        if len(rows) < 2:
            return None
        return float(rows["last_sweep_at"]), float(rows["last_sweep_duration"])

    def attempt_rows(self, notice_id: str) -> list[dict[str, Any]]:
        """Attempts of a notice with their latest observation (no secrets here: ``sent``,
        the lookup fingerprint, holds a digest of the body beside the sender, so a
        reader shows only its sender keys)."""
        return self._dicts(
            "SELECT a.channel, a.attempt_key, a.transport, a.state, a.template_version,"
            " a.locale, a.segments, a.started_at, a.submitted_at, a.message_id, a.calls,"
            " a.settled, a.polls, a.lookups, a.last_error, a.sent,"
            " o.observed_at AS observed_at,"
            " o.source AS source,"
            " o.raw_status AS raw_status, o.status AS status"
            " FROM attempts a LEFT JOIN observations o ON o.id = (SELECT MAX(id)"
            " FROM observations WHERE attempt_key = a.attempt_key)"
            " WHERE a.notice_id = ? ORDER BY a.started_at, a.attempt_key",
            (notice_id,),
        )

    def event_rows(self, notice_id: str) -> list[dict[str, Any]]:
        """The notice's transition history, oldest first."""
        return self._dicts(
            "SELECT at, worker, kind, old_phase, new_phase, attempt_key, channel, status, polls,"
            " reason, lane_wait FROM events WHERE notice_id = ? ORDER BY id",
            (notice_id,),
        )

    def all_events(self) -> list[dict[str, Any]]:
        """Every event (demo and tests)."""
        return self._dicts(
            "SELECT notice_id, at, worker, kind, old_phase, new_phase, attempt_key, status,"
            " polls, reason FROM events ORDER BY id",
            (),
        )

    def record_would_page(self, notice_id: str, phase: Phase, reason: str, now: float) -> bool:
        """Record once per notice that an observe-mode alert would have paged for it."""
        return self._record_alert_event("would_page", notice_id, phase, reason, now)

    def record_alert_once(self, notice_id: str, phase: Phase, reason: str, now: float) -> bool:
        """Record that `alerts` reported a notice nobody can help any more; False when it
        was reported before (such a notice is reported once, not on every run)."""
        return self._record_alert_event("alert_reported", notice_id, phase, reason, now)

    def _record_alert_event(
        self, kind: str, notice_id: str, phase: Phase, reason: str, now: float
    ) -> bool:
        """An `alerts` event of ``kind`` for the notice, unless it has one already."""
        with self.transaction() as conn:
            changed = conn.execute(
                "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase, reason)"
                " SELECT ?, ?, 'alerts', ?, ?, ?, ? WHERE NOT EXISTS"
                " (SELECT 1 FROM events WHERE notice_id = ? AND kind = ?)",
                (notice_id, now, kind, phase.value, phase.value, reason, notice_id, kind),
            ).rowcount
        return bool(changed)

    def ended_since(self, after_event: int, after_time: float) -> tuple[list[dict[str, Any]], int]:
        """Notices that ended without success (expired or failed) in events after the
        watermark ``after_event`` (or, when purge took every newer event away and the
        watermark starts again, after ``after_time``), oldest first, and the new
        watermark: every event at or below it is visible now, and no later write can add
        one there, so the next read skips nothing.

        The watermark is the dialect's: an event id on SQLite, whose writes are
        serialized; the newest finished transaction on PostgreSQL, where ids follow
        insert order, not commit order. (A watermark from elsewhere, a copied SQLite
        file's event id, reads from ``after_time``.)
        """
        (newest,) = self.conn.execute(self.sql.events_watermark).fetchone()
        newest = int(newest)
        by_time = newest < after_event
        where = "e.at > :time" if by_time else self.sql.event_mark(">", ":event")
        rows = self._dicts(
            "SELECT e.notice_id, n.region, e.new_phase AS phase, e.reason, e.at AS ended_at,"
            " n.policy_name AS policy, n.policy_version FROM events e"
            " JOIN notices n ON n.id = e.notice_id"
            f" WHERE {where} AND {self.sql.event_mark('<=', ':newest')}"
            " AND e.new_phase IN ('expired', 'failed')"
            " AND e.old_phase <> e.new_phase AND e.kind <> 'lost_race'"
            f" ORDER BY {self.sql.events_order}",
            {"time": after_time, "event": after_event, "newest": newest},
        )
        return rows, newest

    def live_summary(self) -> tuple[int, float | None]:
        """(count, earliest created_at) of live notices."""
        count, first = self.conn.execute(
            "SELECT COUNT(*), MIN(created_at) FROM notices WHERE due_at IS NOT NULL"
        ).fetchone()
        return int(count), None if first is None else float(first)

    def known_policies(self) -> list[tuple[str, int]]:
        """(name, version) of every policy record stored."""
        rows = self.conn.execute("SELECT name, version FROM policies ORDER BY 1, 2")
        return [(str(n), int(v)) for n, v in rows]

    def phase_counts(self) -> dict[str, int]:
        """Notices stored, by phase."""
        rows = self.conn.execute("SELECT phase, COUNT(*) FROM notices GROUP BY phase")
        return {str(phase): int(count) for phase, count in rows}

    def live_counts(self) -> list[tuple[str, str, int, int]]:
        """(phase, policy, policy_version, count) of live notices: the queue depth."""
        rows = self.conn.execute(
            "SELECT phase, policy_name, policy_version, COUNT(*) FROM notices"
            " WHERE due_at IS NOT NULL GROUP BY 1, 2, 3"
        )
        return [(str(p), str(n), int(v), int(c)) for p, n, v, c in rows]

    def live_policy_counts(self) -> list[tuple[Policy, int]]:
        """The stored policy of every (policy_name, policy_version) live notices were
        enqueued under, with how many live notices use it, by name and version.

        Read through the partial index over live notices, so finished notices cost
        nothing; the template version a live notice renders is its policy's.
        """
        rows = self.conn.execute(LIVE_POLICY_COUNTS_SQL).fetchall()
        counted: list[tuple[Policy, int]] = []
        for name, version, body, count in rows:
            if body is None:
                raise StoreError(f"policy.{name} version {version} is missing from the database")
            counted.append((Policy.from_record(json.loads(body)), int(count)))
        return counted

    def oldest_due_at(self, now: float) -> float | None:
        """The due time of the longest-waiting notice that is due now (sweep lag)."""
        (due,) = self.conn.execute(
            "SELECT MIN(due_at) FROM notices WHERE due_at IS NOT NULL AND due_at <= ?", (now,)
        ).fetchone()
        return None if due is None else float(due)

    def event_counts(self, since: float) -> list[dict[str, Any]]:
        """Events since ``since`` by every bounded dimension, live rows plus purged days."""
        return self._dicts(
            "SELECT kind, old_phase, new_phase, channel, status, reason, policy,"
            " policy_version, template_version, SUM(count) AS count FROM ("
            " SELECT e.kind, e.old_phase, e.new_phase, COALESCE(e.channel, '') AS channel,"
            " COALESCE(e.status, '') AS status, COALESCE(e.reason, '') AS reason,"
            " n.policy_name AS policy, n.policy_version AS policy_version,"
            " COALESCE(a.template_version, '') AS template_version, COUNT(*) AS count"
            " FROM events e JOIN notices n ON n.id = e.notice_id"
            " LEFT JOIN attempts a ON a.attempt_key = e.attempt_key"
            " WHERE e.at >= :since GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9"
            " UNION ALL SELECT kind, old_phase, new_phase, channel, status, reason, policy,"
            " policy_version, template_version, count FROM daily_counts"
            f" WHERE day >= {self.sql.day(':since')} AND kind NOT LIKE 'health:%') AS counted"
            " GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9",
            {"since": since},
        )

    def skips_since(self, reason: str, since: float) -> list[tuple[str, int, int]]:
        """(policy, newest policy version, count) of channels skipped for ``reason``
        since ``since`` (the events' time index; recent, so never purged)."""
        rows = self.conn.execute(
            "SELECT n.policy_name, MAX(n.policy_version), COUNT(*) FROM events e"
            " JOIN notices n ON n.id = e.notice_id WHERE e.at >= ? AND e.kind = 'skipped'"
            " AND e.reason = ? GROUP BY n.policy_name ORDER BY n.policy_name",
            (since, reason),
        )
        return [(str(p), int(v), int(n)) for p, v, n in rows]

    def _derived_since(self, kind: str, since: float) -> list[tuple[str, str, int]]:
        """(channel, status, count) of a derived kind on purged days from ``since``'s."""
        rows = self.conn.execute(
            "SELECT channel, status, SUM(count) FROM daily_counts WHERE kind = ?"
            f" AND day >= {self.sql.day('?')} GROUP BY 1, 2",
            (kind, since),
        )
        return [(str(c), str(s), int(n)) for c, s, n in rows]

    def attempt_outcomes(self, since: float) -> list[tuple[str, str, int]]:
        """(channel, outcome, count) of attempts begun since ``since``: the latest
        normalized status, or the submission's own end when nothing was observed.
        Purged days count from their daily aggregates."""
        rows = self.conn.execute(
            f"SELECT a.channel, {_ATTEMPT_OUTCOME}, COUNT(*)"
            " FROM attempts a WHERE a.started_at >= ? GROUP BY 1, 2",
            (since,),
        )
        counts: dict[tuple[str, str], int] = {}
        for channel, outcome, count in [
            *rows,
            *self._derived_since(DERIVED_ATTEMPT, since),
        ]:
            key = (str(channel), str(outcome))
            counts[key] = counts.get(key, 0) + int(count)
        return [(c, o, n) for (c, o), n in counts.items()]

    def expired_without_outcome(self, since: float) -> int:
        """Notices that expired since ``since`` with no channel ending on a terminal
        outcome, as their policy defines one (purged days from their daily aggregates)."""
        return sum(self.expired_without_outcome_counts(since).values())

    def late_primary_after_fallback(self, since: float) -> int:
        """Notices whose primary reported a success, as their policy defines it, after
        their fallback was submitted (purged days from their daily aggregates)."""
        return sum(self.late_primary_counts(since).values())

    def purge_batch(self, cutoff: float, limit: int, policy: str | None = None) -> int:
        """Delete up to ``limit`` notices that finished before ``cutoff`` (of the policy
        named ``policy``, if given), with their attempts, observations, events and outbox
        messages, in one short transaction, first folding their events into daily_counts.
        Returns how many were deleted."""
        with self.transaction() as conn:
            found = (
                conn.execute(_FINISHED, (cutoff, limit))
                if policy is None
                else conn.execute(_FINISHED_OF_POLICY, (policy, cutoff, limit))
            )
            ids = [row[0] for row in found]
            if not ids:
                return 0
            chosen = json.dumps(ids)
            conn.execute(
                "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status,"
                " reason, policy, policy_version, template_version, count)"
                f" SELECT {self.sql.day('e.at')}, e.kind, e.old_phase, e.new_phase,"
                " COALESCE(e.channel, ''), COALESCE(e.status, ''), COALESCE(e.reason, ''),"
                " n.policy_name, n.policy_version, COALESCE(a.template_version, ''), COUNT(*)"
                " FROM events e JOIN notices n ON n.id = e.notice_id"
                " LEFT JOIN attempts a ON a.attempt_key = e.attempt_key"
                f" WHERE e.notice_id IN {self.sql.ids()}"
                " GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10" + _FOLD_CONFLICT,
                (chosen,),
            )
            self._fold_derived(conn, chosen)
            selected = self.sql.ids()
            conn.execute(
                "DELETE FROM observations WHERE attempt_key IN (SELECT attempt_key FROM"
                f" attempts WHERE notice_id IN {selected})",
                (chosen,),
            )
            for table, column in (
                ("attempts", "notice_id"),
                ("events", "notice_id"),
                ("outbox", "notice_id"),
                ("notice_secrets", "notice_id"),
                ("shadow_notices", "notice_id"),
            ):
                conn.execute(f"DELETE FROM {table} WHERE {column} IN {selected}", (chosen,))
            # Only still-finished rows: nothing live is ever removed.
            deleted = conn.execute(
                f"DELETE FROM notices WHERE id IN {selected} AND due_at IS NULL", (chosen,)
            ).rowcount
        return int(deleted)

    def newest_policies(self) -> dict[str, Policy]:
        """The newest record (highest version) stored of each policy name."""
        rows = self.conn.execute(
            "SELECT p.name, p.body FROM policies p WHERE p.version ="
            " (SELECT MAX(q.version) FROM policies q WHERE q.name = p.name) ORDER BY 1"
        ).fetchall()
        return {str(name): Policy.from_record(json.loads(body)) for name, body in rows}

    def purge_limit_counts(self, cutoff: float, limit: int = 500) -> int:
        """Delete up to ``limit`` abuse-limit counters last counted before ``cutoff``, in
        one short transaction (by the index on last_at). Returns how many went."""
        with self.transaction() as conn:
            # last_at is checked again on the row itself: an enqueue that counted on it
            # since the rows were chosen keeps it (PostgreSQL re-reads a changed row).
            deleted = conn.execute(
                "DELETE FROM limit_counts WHERE last_at < ? AND (rule, policy, subject) IN"
                " (SELECT rule, policy, subject FROM limit_counts WHERE last_at < ?"
                " ORDER BY last_at LIMIT ?)",
                (cutoff, cutoff, limit),
            ).rowcount
        return int(deleted)

    def purge_aggregate_day(self, before: str) -> tuple[str, int, int] | None:
        """Fold the oldest day of daily aggregates (daily_counts and refusals) before the
        day ``before`` (YYYY-MM-DD) into ALL_TIME_DAY and delete it, in one short
        transaction: (that day, daily_counts rows deleted, refusals rows deleted), or None
        when no day before ``before`` is left."""
        with self.transaction() as conn:
            days = [
                conn.execute(
                    f"SELECT MIN(day) FROM {table} WHERE day > ? AND day < ?",
                    (ALL_TIME_DAY, before),
                ).fetchone()[0]
                for table in ("daily_counts", "refusals")
            ]
            present = [str(d) for d in days if d is not None]
            if not present:
                return None
            day = min(present)
            conn.execute(
                _FOLD_INTO_DAILY + f"SELECT '{ALL_TIME_DAY}', kind, old_phase, new_phase,"
                " channel, status, reason, policy, policy_version, template_version, count"
                " FROM daily_counts WHERE day = ?" + _FOLD_CONFLICT,
                (day,),
            )
            conn.execute(
                "INSERT INTO refusals (day, minute, policy, reason, count)"
                f" SELECT '{ALL_TIME_DAY}', 0, policy, reason, SUM(count) FROM refusals"
                " WHERE day = ? GROUP BY policy, reason"
                " ON CONFLICT (day, minute, policy, reason) DO UPDATE"
                " SET count = refusals.count + excluded.count",
                (day,),
            )
            daily = conn.execute("DELETE FROM daily_counts WHERE day = ?", (day,)).rowcount
            refused = conn.execute("DELETE FROM refusals WHERE day = ?", (day,)).rowcount
        return day, int(daily), int(refused)

    def _fold_derived(self, conn: Connection, chosen: str) -> None:
        """Fold the per-notice figures `health` reads into daily_counts before the rows
        go: attempts by outcome (by start day), and the distributions and policy-aware
        counts (store.measures)."""
        selected = self.sql.ids(":chosen")
        conn.execute(
            _FOLD_INTO_DAILY + f"SELECT {self.sql.day('a.started_at')}, :kind, '', '',"
            f" a.channel, {_ATTEMPT_OUTCOME}, '', n.policy_name, n.policy_version,"
            " a.template_version, COUNT(*) FROM attempts a JOIN notices n ON n.id = a.notice_id"
            f" WHERE a.notice_id IN {selected} GROUP BY 1, 5, 6, 8, 9, 10" + _FOLD_CONFLICT,
            {"chosen": chosen, "kind": DERIVED_ATTEMPT},
        )
        self._fold_measures(conn, chosen)

    def row_counts(self) -> dict[str, int]:
        """Rows in each table that grows with traffic."""
        return {
            table: int(self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("notices", "attempts", "observations", "events", "outbox")
        }

    def terminal_timings(self, since: float, until: float) -> Iterator[dict[str, Any]]:
        """Finished notices created in [since, until), oldest first, with their policy
        record's key, the phase they ended in, its reason and since when (a cancel's own
        time), and per attempt when its intent was committed (before the call: how soon a
        sweep took it up), every read's time, source and raw status (a poll that saw
        nothing new included: it bounds when a status changed). No id, account, contact
        or URL is selected.
        """
        notices = self.conn.execute(
            "SELECT id, region, created_at, expires_at, policy_name, policy_version,"
            " phase, reason, phase_since"
            " FROM notices WHERE created_at >= ? AND created_at < ? AND due_at IS NULL"
            # A shadow notice never met a provider: it has no timing to replay.
            " AND NOT EXISTS (SELECT 1 FROM shadow_notices s WHERE s.notice_id = notices.id)"
            " ORDER BY created_at, id",
            (since, until),
        )
        for (
            notice_id,
            region,
            created_at,
            expires_at,
            name,
            version,
            phase,
            reason,
            phase_since,
        ) in notices.fetchall():
            channels: dict[str, dict[str, Any]] = {}
            rows = self.conn.execute(
                "SELECT a.channel, a.transport, a.started_at, a.submitted_at, a.last_read_at,"
                " o.observed_at, o.raw_status, o.source FROM attempts a LEFT JOIN observations o"
                " ON o.attempt_key = a.attempt_key"
                " WHERE a.notice_id = ? ORDER BY a.channel, o.observed_at, o.id",
                (notice_id,),
            )
            for (
                channel,
                transport,
                started_at,
                submitted_at,
                last_read_at,
                observed_at,
                raw,
                source,
            ) in rows:
                entry = channels.setdefault(
                    channel,
                    {
                        "transport": transport,
                        "started_at": started_at,
                        "submitted_at": submitted_at,
                        "last_read_at": last_read_at,
                        "seen": [],
                    },
                )
                if observed_at is not None:
                    entry["seen"].append((observed_at, raw, source))
            yield {
                "region": region,
                "created_at": created_at,
                "expires_at": expires_at,
                "policy": (name, version),
                "phase": phase,
                "reason": reason,
                "phase_since": phase_since,
                "channels": channels,
            }
