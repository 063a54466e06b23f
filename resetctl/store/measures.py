"""What the distributions and the policy-aware counters read: per notice, the primary
attempt's time to its terminal observation, the lifetime left when the fallback was
claimed, a fallback followed by a late primary success, an expiry without a terminal
channel outcome, the SMS sent by segment bucket and encoding; and their folding into
daily_counts before purge deletes the rows they come from.

"Terminal" and "success" are the notice's stored policy's (``Policy.succeeds`` per
channel, or ``failed``), never a fixed list: an SMS that was only ``sent`` (normalized
``accepted``) is not a success under the default SMS policy.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from resetctl.distributions import LIFETIME_LEFT_BUCKETS, PRIMARY_TO_TERMINAL_BUCKETS, bucket_of
from resetctl.policy import Policy
from resetctl.store.backend import Connection
from resetctl.store.connection import StoreConnection
from resetctl.store.sqlite.dialect import record_bytes

#: Derived daily_counts kinds (``health:`` kinds are no events): a histogram's bucket
#: counts (status: the bucket's ``le``) and its sum in milliseconds.
DERIVED_PRIMARY_TO_TERMINAL = "health:primary_to_terminal"
DERIVED_PRIMARY_TO_TERMINAL_SUM = "health:primary_to_terminal_sum"
DERIVED_LIFETIME_LEFT = "health:lifetime_left_at_fallback"
DERIVED_LIFETIME_LEFT_SUM = "health:lifetime_left_at_fallback_sum"
DERIVED_EXPIRED_WITHOUT_OUTCOME = "health:expired_without_outcome"
DERIVED_LATE_PRIMARY = "health:late_primary_after_fallback"
#: SMS submissions by segment bucket (status) and encoding (reason), counted as their
#: intent is written (the rows never hold the encoding), so purge has nothing to fold.
DERIVED_SMS_SEGMENTS = "health:sms_segments"

#: The primary attempt (the notice's first) and the first time it was seen in each
#: status that may end a channel; which of them does is the policy's to say.
_PRIMARY_FIRSTS = (
    "SELECT n.id, n.policy_name, n.policy_version, a.channel, a.started_at, o.status,"
    " MIN(o.observed_at) FROM attempts a JOIN notices n ON n.id = a.notice_id"
    " JOIN observations o ON o.attempt_key = a.attempt_key"
    " WHERE o.status IN ('accepted', 'delivered', 'failed') AND a.started_at ="
    " (SELECT MIN(b.started_at) FROM attempts b WHERE b.notice_id = a.notice_id)"
    " {where} GROUP BY 1, 2, 3, 4, 5, 6"
)
#: The fallback's claim: the one move into fallback_pending a notice makes.
_FALLBACK_CLAIMS = (
    "SELECT n.policy_name, n.policy_version, n.expires_at - e.at, e.at FROM events e"
    " JOIN notices n ON n.id = e.notice_id WHERE e.new_phase = 'fallback_pending'"
    " AND e.old_phase <> 'fallback_pending' AND e.kind <> 'lost_race' {where}"
)
#: Fallback attempts (f) followed by a possible success on the earlier primary (p).
_LATE_PRIMARY = (
    "SELECT DISTINCT f.notice_id, n.policy_name, n.policy_version, p.channel, o.status,"
    " f.started_at FROM attempts f JOIN notices n ON n.id = f.notice_id"
    " JOIN attempts p ON p.notice_id = f.notice_id AND p.channel <> f.channel"
    " JOIN observations o ON o.attempt_key = p.attempt_key"
    " WHERE f.started_at > p.started_at AND o.status IN ('accepted', 'delivered')"
    " AND o.observed_at > f.started_at {where}"
)
#: Expired notices with every status any of their channels ended on (or a rejection).
_EXPIRED_OUTCOMES = (
    "SELECT DISTINCT n.id, n.policy_name, n.policy_version, n.phase_since, a.channel,"
    " a.state, o.status FROM notices n LEFT JOIN attempts a ON a.notice_id = n.id"
    " LEFT JOIN observations o ON o.attempt_key = a.attempt_key"
    " AND o.status IN ('accepted', 'delivered', 'failed')"
    " WHERE n.phase = 'expired' {where}"
)
_FOLD = (
    "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status, reason,"
    " policy, policy_version, template_version, count) VALUES (?, ?, '', '', ?, ?, '', ?, ?,"
    " '', ?) ON CONFLICT (day, kind, old_phase, new_phase, channel, status, reason, policy,"
    " policy_version, template_version) DO UPDATE SET count = daily_counts.count + excluded.count"
)

#: Every stored column of an event and of an observation, in table order (the rowid
#: alias first: NULL in a SQLite record), and the positions of their REAL columns.
_EVENT_COLUMNS = (
    "NULL, e.notice_id, e.at, e.worker, e.kind, e.old_phase, e.new_phase, e.attempt_key,"
    " e.channel, e.status, e.polls, e.reason, e.lane_wait"
)
_EVENT_REALS = frozenset({2, 12})
_OBSERVATION_COLUMNS = (
    "NULL, o.attempt_key, o.source, o.raw_status, o.status, o.observed_at, o.dedupe"
)
_OBSERVATION_REALS = frozenset({5})
#: The fields of an event its log line carries, after the row's columns.
_EVENT_FIELDS = (
    "notice_id",
    "at",
    "worker",
    "kind",
    "old_phase",
    "new_phase",
    "attempt_key",
    "channel",
    "status",
    "polls",
    "reason",
)

#: (policy, channel) → bucket label → observations, and (policy, channel) → seconds.
Histogram = tuple[dict[tuple[str, str], Counter[str]], dict[tuple[str, str], float]]


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).date().isoformat()


class Measures(StoreConnection):
    """The distributions and the policy-aware counters (shared SQL)."""

    def primary_to_terminal(self, since: float) -> Histogram:
        """Seconds from each primary attempt's intent to its terminal observation, for
        those observed since ``since``, by (policy, channel); purged days from their
        folded buckets."""
        found = self._primary_terminals(self.conn, "", {})
        live = [(p, c, s) for _, p, _, c, s, at in found if at >= since]
        return self._histogram(
            live, PRIMARY_TO_TERMINAL_BUCKETS, DERIVED_PRIMARY_TO_TERMINAL, since
        )

    def lifetime_left_at_fallback(self, since: float) -> Histogram:
        """Seconds of link lifetime left when each fallback was claimed since ``since``,
        by (policy, ""); purged days from their folded buckets."""
        rows = self.conn.execute(_FALLBACK_CLAIMS.format(where="AND e.at >= ?"), (since,))
        live = [(str(p), "", max(float(left), 0.0)) for p, _, left, _ in rows]
        return self._histogram(live, LIFETIME_LEFT_BUCKETS, DERIVED_LIFETIME_LEFT, since)

    def late_primary_counts(self, since: float) -> Counter[tuple[str, str]]:
        """Notices whose primary reported a success (as their policy defines it) after
        their fallback had started since ``since``, by (policy, primary channel)."""
        found = self._late_primaries(self.conn, "AND f.started_at >= :since", {"since": since})
        counts = Counter((policy, channel) for _, policy, _, channel, _ in found)
        for policy, channel, _, count in self._derived(DERIVED_LATE_PRIMARY, since):
            counts[(policy, channel)] += count
        return counts

    def expired_without_outcome_counts(self, since: float) -> Counter[str]:
        """Notices that expired since ``since`` with no channel ending on a terminal
        outcome (its policy's success, ``failed`` or a rejection), by policy."""
        found = self._expired_unanswered(self.conn, "AND n.phase_since >= :since", {"since": since})
        counts = Counter(policy for policy, _, _ in found)
        for policy, _, _, count in self._derived(DERIVED_EXPIRED_WITHOUT_OUTCOME, since):
            counts[policy] += count
        return counts

    def sms_segment_counts(self, since: float) -> Counter[tuple[str, str, str]]:
        """SMS submissions since ``since``'s day by (policy, segment bucket, encoding)."""
        rows = self.conn.execute(
            "SELECT policy, status, reason, SUM(count) FROM daily_counts WHERE kind = ?"
            f" AND day >= {self.sql.day('?')} GROUP BY 1, 2, 3",
            (DERIVED_SMS_SEGMENTS, since),
        )
        return Counter({(str(p), str(b), str(e)): int(n) for p, b, e, n in rows if int(n)})

    def event_sizes(self) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """(policy, encoded bytes, fields with the recipient hash) of every stored event:
        the size measured as the database stores the row (SQLite: its record, encoded
        here as the file format does; PostgreSQL: pg_column_size)."""
        measured = self.sql.row_bytes_template.format(alias="e") or "NULL"
        rows = self.conn.execute(
            f"SELECT n.policy_name, n.recipient_hash, {measured}, {_EVENT_COLUMNS}"
            " FROM events e JOIN notices n ON n.id = e.notice_id ORDER BY e.id"
        )
        for policy, recipient, size, *columns in rows:
            fields = dict(zip(_EVENT_FIELDS, columns[1:], strict=False))
            fields["recipient"] = recipient
            encoded = record_bytes(columns, _EVENT_REALS) if size is None else int(size)
            yield str(policy), encoded, fields

    def observation_sizes(self) -> Iterator[tuple[str, float, int]]:
        """(policy, observed at, encoded bytes) of every stored observation, measured as
        :meth:`event_sizes` measures events."""
        measured = self.sql.row_bytes_template.format(alias="o") or "NULL"
        rows = self.conn.execute(
            f"SELECT n.policy_name, {measured}, {_OBSERVATION_COLUMNS} FROM observations o"
            " JOIN attempts a ON a.attempt_key = o.attempt_key"
            " JOIN notices n ON n.id = a.notice_id ORDER BY o.id"
        )
        for policy, size, *columns in rows:
            encoded = record_bytes(columns, _OBSERVATION_REALS) if size is None else int(size)
            yield str(policy), float(columns[5]), encoded

    def _fold_measures(self, conn: Connection, chosen: str) -> None:
        """Fold the chosen notices' distributions and policy-aware counts into
        daily_counts (by the day each was observed) before their rows go."""
        where = f"AND n.id IN {self.sql.ids(':chosen')}"
        params: dict[str, object] = {"chosen": chosen}
        folded: Counter[tuple[str, str, str, str, str, int]] = Counter()
        for _, policy, version, channel, seconds, at in self._primary_terminals(
            conn, where, params
        ):
            day = _day(at)
            bucket = bucket_of(seconds, PRIMARY_TO_TERMINAL_BUCKETS)
            folded[(day, DERIVED_PRIMARY_TO_TERMINAL, channel, bucket, policy, version)] += 1
            key = (day, DERIVED_PRIMARY_TO_TERMINAL_SUM, channel, "", policy, version)
            folded[key] += round(seconds * 1000)
        claims = conn.execute(
            _FALLBACK_CLAIMS.format(where=f"AND e.notice_id IN {self.sql.ids(':chosen')}"), params
        )
        for policy, version, left, at in claims:
            day, seconds = _day(float(at)), max(float(left), 0.0)
            bucket = bucket_of(seconds, LIFETIME_LEFT_BUCKETS)
            folded[(day, DERIVED_LIFETIME_LEFT, "", bucket, str(policy), int(version))] += 1
            key = (day, DERIVED_LIFETIME_LEFT_SUM, "", "", str(policy), int(version))
            folded[key] += round(seconds * 1000)
        for _, policy, version, channel, at in self._late_primaries(
            conn, where.replace("n.id", "f.notice_id"), params
        ):
            folded[(_day(at), DERIVED_LATE_PRIMARY, channel, "", policy, version)] += 1
        for policy, version, at in self._expired_unanswered(conn, where, params):
            folded[(_day(at), DERIVED_EXPIRED_WITHOUT_OUTCOME, "", "", policy, version)] += 1
        conn.executemany(_FOLD, [(*key, count) for key, count in sorted(folded.items())])

    def _histogram(
        self, live: list[tuple[str, str, float]], bounds: tuple[float, ...], kind: str, since: float
    ) -> Histogram:
        buckets: dict[tuple[str, str], Counter[str]] = {}
        sums: dict[tuple[str, str], float] = {}
        for policy, channel, seconds in live:
            buckets.setdefault((policy, channel), Counter())[bucket_of(seconds, bounds)] += 1
            sums[(policy, channel)] = sums.get((policy, channel), 0.0) + seconds
        for policy, channel, bucket, count in self._derived(kind, since):
            buckets.setdefault((policy, channel), Counter())[bucket] += count
        for policy, channel, _, milliseconds in self._derived(f"{kind}_sum", since):
            sums[(policy, channel)] = sums.get((policy, channel), 0.0) + milliseconds / 1000
        return buckets, sums

    def _derived(self, kind: str, since: float) -> list[tuple[str, str, str, int]]:
        """(policy, channel, status, count) of a derived kind on days from ``since``'s."""
        rows = self.conn.execute(
            "SELECT policy, channel, status, SUM(count) FROM daily_counts WHERE kind = ?"
            f" AND day >= {self.sql.day('?')} GROUP BY 1, 2, 3",
            (kind, since),
        )
        return [(str(p), str(c), str(s), int(n)) for p, c, s, n in rows]

    def _policy_reader(self, conn: Connection) -> Any:
        cache: dict[tuple[str, int], Policy] = {}

        def policy_of(name: str, version: int) -> Policy:
            if (name, version) not in cache:
                (body,) = conn.execute(
                    "SELECT body FROM policies WHERE name = ? AND version = ?", (name, version)
                ).fetchone()
                cache[(name, version)] = Policy.from_record(json.loads(body))
            return cache[(name, version)]

        return policy_of

    def _primary_terminals(
        self, conn: Connection, where: str, params: dict[str, object]
    ) -> Iterator[tuple[str, str, int, str, float, float]]:
        """(notice, policy, version, channel, seconds, observed at) per primary attempt
        that reached a terminal observation."""
        policy_of = self._policy_reader(conn)
        firsts: dict[str, tuple[str, int, str, float, float]] = {}
        for notice, name, version, channel, started, status, first in conn.execute(
            _PRIMARY_FIRSTS.format(where=where), params
        ).fetchall():
            policy = policy_of(str(name), int(version))
            if status != "failed" and not policy.succeeds(channel, status):
                continue
            known = firsts.get(notice)
            if known is None or float(first) < known[4]:
                firsts[notice] = (
                    str(name),
                    int(version),
                    str(channel),
                    float(started),
                    float(first),
                )
        for notice, (name, version, channel, started, first) in sorted(firsts.items()):
            yield notice, name, version, channel, max(first - started, 0.0), first

    def _late_primaries(
        self, conn: Connection, where: str, params: dict[str, object]
    ) -> list[tuple[str, str, int, str, float]]:
        """(notice, policy, version, primary channel, fallback start) per notice whose
        primary succeeded, as its policy says, after its fallback started."""
        policy_of = self._policy_reader(conn)
        late: dict[str, tuple[str, str, int, str, float]] = {}
        for notice, name, version, channel, status, started in conn.execute(
            _LATE_PRIMARY.format(where=where), params
        ).fetchall():
            if policy_of(str(name), int(version)).succeeds(channel, status):
                late[notice] = (str(notice), str(name), int(version), str(channel), float(started))
        return [late[notice] for notice in sorted(late)]

    def _expired_unanswered(
        self, conn: Connection, where: str, params: dict[str, object]
    ) -> list[tuple[str, int, float]]:
        """(policy, version, expired at) per expired notice on which no channel ended."""
        policy_of = self._policy_reader(conn)
        expired: dict[str, tuple[str, int, float]] = {}
        answered: set[str] = set()
        for notice, name, version, since, channel, state, status in conn.execute(
            _EXPIRED_OUTCOMES.format(where=where), params
        ).fetchall():
            expired[notice] = (str(name), int(version), float(since))
            policy = policy_of(str(name), int(version))
            if state == "rejected" or (
                status is not None and (status == "failed" or policy.succeeds(channel, status))
            ):
                answered.add(notice)
        return [expired[n] for n in sorted(expired) if n not in answered]
