"""Every write to notices and their attempts: enqueue's insert (with the policy versions
it names), the lease claims, a round's compare-and-set steps with their facts, scrubs and
events, and lease recoveries.

Every write to a notice row is a compare-and-set on its row version (and lease token, for
a sweep) that checks exactly one row changed; losing one is normal and recorded as a
``lost_race`` event. Nothing here decides what happens next: that is the machine's job.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence

from resetctl.distributions import segment_bucket
from resetctl.machine import Phase, Reason, Status
from resetctl.policy import Policy
from resetctl.store.backend import Connection
from resetctl.store.measures import DERIVED_SMS_SEGMENTS
from resetctl.store.notice_finds import NoticeFinds
from resetctl.store.records import (
    Claim,
    DeclinedFacts,
    IntentFacts,
    LookupFacts,
    NewNotice,
    ObservationFacts,
    OutcomeFacts,
    SkippedFacts,
    Step,
    StepResult,
    event_row,
    loaded_notice,
)

#: An SMS submission counted by segment bucket (status) and encoding (reason) in
#: daily_counts, on the day its intent was written: the rows never hold the encoding.
_SMS_SEGMENTS = (
    "INSERT INTO daily_counts (day, kind, old_phase, new_phase, channel, status, reason,"
    " policy, policy_version, template_version, count) SELECT {day},"
    f" '{DERIVED_SMS_SEGMENTS}', '', '', 'sms', {{bucket}}, :encoding, n.policy_name,"
    " n.policy_version, '', :count FROM notices n"
)
#: The bucket of the attempt row (alias a) an undone intent counted.
_BUCKET_OF_ROW = (
    "CASE WHEN a.segments >= 4 THEN '4+' ELSE CAST(COALESCE(a.segments, 1) AS TEXT) END"
)
_SEGMENTS_ADD = (
    " ON CONFLICT (day, kind, old_phase, new_phase, channel, status, reason, policy,"
    " policy_version, template_version) DO UPDATE SET count = daily_counts.count + excluded.count"
)


def _segments_row(segments: int | None, encoding: str, count: int) -> dict[str, object]:
    if segments is None:
        return {"encoding": encoding, "count": count}
    return {"bucket": segment_bucket(segments), "encoding": encoding, "count": count}


class NoticeWrites(NoticeFinds):
    """Enqueue's insert, claims, compare-and-set steps and their facts (shared SQL)."""

    def store_policy(self, policy: Policy, now: float) -> bool:
        """Record a policy version; False when that version exists with other settings.

        Call inside a transaction.
        """
        body = policy.record_json()
        self.conn.execute(
            "INSERT INTO policies (name, version, body, stored_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (name, version) DO NOTHING",
            (policy.name, policy.version, body, now),
        )
        (stored,) = self.conn.execute(
            "SELECT body FROM policies WHERE name = ? AND version = ?",
            (policy.name, policy.version),
        ).fetchone()
        # Compared as policies, not text: a record stored by an older resetctl lacks keys
        # added since, which take their defaults and change nothing.
        return bool(stored == body or Policy.from_record(json.loads(stored)) == policy)

    def insert_notices(self, news: Sequence[NewNotice]) -> list[tuple[str, str]]:
        """Insert notices, or find the ones their idempotency keys already name.

        Returns, per notice in order, (notice_id, request_digest) of the stored notice:
        its own when it was inserted. Call inside a transaction. Two or three statements
        for the whole list, whatever its length (executemany for the rows; the read of
        the stored notices only when some key was already taken).
        """
        if not news:
            return []
        conn = self.conn
        inserted = conn.executemany(
            "INSERT INTO notices (id, idempotency_key, request_digest, account_ref, region,"
            " policy_name, policy_version, channels, recipient_hash, created_at, expires_at,"
            " phase, phase_since, due_at, locale, consent, reason)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (idempotency_key) DO NOTHING",
            [
                (
                    new.notice_id,
                    new.idempotency_key,
                    new.request_digest,
                    new.account_ref,
                    new.region,
                    new.policy.name,
                    new.policy.version,
                    ",".join(new.channels),
                    new.recipient_hash,
                    new.created_at,
                    new.expires_at,
                    # Every channel ruled out (the policy says fail): finished as it is
                    # stored, never due, holding no secret.
                    Phase.QUEUED.value if new.channels else Phase.FAILED.value,
                    new.created_at,
                    new.created_at if new.channels else None,
                    new.locale,
                    None if new.consent is None else ",".join(new.consent),
                    None if new.channels else Reason.NO_CHANNEL.value,
                )
                for new in news
            ],
        )
        if inserted.rowcount == len(news):  # every one new, as almost always
            results = [(new.notice_id, new.request_digest) for new in news]
        else:
            # The stored notice of every key: ours where the insert won, else the earlier
            # one (a retried request, or the same key twice in this list).
            keys = json.dumps([new.idempotency_key for new in news])
            stored = {
                str(key): (str(notice_id), str(digest))
                for key, notice_id, digest in conn.execute(
                    "SELECT idempotency_key, id, request_digest FROM notices"
                    f" WHERE idempotency_key IN {self.sql.ids()}",
                    (keys,),
                )
            }
            results = [stored[new.idempotency_key] for new in news]
        conn.executemany(
            "INSERT INTO notice_secrets (notice_id, email, phone, reset_url, display_name)"
            " VALUES (?, ?, ?, ?, ?)",
            [
                (
                    new.notice_id,
                    new.contact.email,
                    new.contact.phone,
                    new.contact.reset_url,
                    new.contact.display_name,
                )
                for new, (notice_id, _) in zip(news, results, strict=True)
                if notice_id == new.notice_id and new.channels
            ],
        )
        # What the policy ruled out, as events: inspect and health read why.
        conn.executemany(
            "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase, channel,"
            " reason) VALUES (?, ?, 'enqueue', 'skipped', 'queued', ?, ?, ?)",
            [
                (
                    new.notice_id,
                    new.created_at,
                    Phase.QUEUED.value if new.channels else Phase.FAILED.value,
                    channel,
                    why.value,
                )
                for new, (notice_id, _) in zip(news, results, strict=True)
                if notice_id == new.notice_id
                for channel, why in new.skipped
            ],
        )
        return results

    def stored_notices(self, keys: Sequence[str]) -> dict[str, tuple[str, str]]:
        """(notice_id, request_digest) of the notices ``keys`` already name."""
        if not keys:
            return {}
        return {
            str(key): (str(notice_id), str(digest))
            for key, notice_id, digest in self.conn.execute(
                "SELECT idempotency_key, id, request_digest FROM notices"
                f" WHERE idempotency_key IN {self.sql.ids()}",
                (json.dumps(list(keys)),),
            )
        }

    def claim_due(self, worker: str, now: float, lease: float, limit: int) -> list[Claim]:
        """Lease up to ``limit`` due notices, oldest due first, in one statement.

        A leased notice's due time becomes its lease end, so a dead worker's notices fall
        due again exactly when their lease passes.
        """
        return self._claim(self.sql.claim, worker, now, lease, limit, {})

    def claim_notices(
        self, worker: str, notice_ids: Sequence[str], now: float, lease: float
    ) -> list[Claim]:
        """Lease the chosen notices that are live, due and not leased (``enqueue --send``
        makes their first submission itself)."""
        if not notice_ids:
            return []
        ids = {"ids": json.dumps(list(notice_ids))}
        return self._claim(self.sql.claim_ids, worker, now, lease, len(notice_ids), ids)

    def _claim(
        self,
        sql: str,
        worker: str,
        now: float,
        lease: float,
        limit: int,
        extra: Mapping[str, object],
    ) -> list[Claim]:
        token = secrets.token_hex(8)
        until = now + lease
        params = {"worker": worker, "token": token, "until": until, "now": now, "limit": limit}
        with self.transaction() as conn:
            rows = conn.execute(sql, {**params, **extra}).fetchall()
        if not rows:
            return []
        # The claim returned each row as written; only the attempts are read here.
        chosen = json.dumps([row[1] for row in rows])
        attempts = self._attempts_where(f"a.notice_id IN {self.sql.ids()}", (chosen,))
        return [
            Claim(
                row[1],
                token,
                until,
                row[0] is not None,
                loaded_notice(row[1:], attempts.get(row[1], ())),
            )
            for row in rows
        ]

    def record_step(self, step: Step) -> StepResult:
        """Write one step in its own transaction: facts always, the decision by CAS.

        ``step.version`` (and ``step.lease_token`` when given) must still match the row,
        or the decision is dropped and a ``lost_race`` event is recorded instead:
        evidence such as an observation or a submission outcome is true either way and is
        kept. An intent is only written by the winner: it is the claim on a channel.
        """
        (result,) = self.write_round([step])
        return result

    def write_round(self, steps: Sequence[Step]) -> list[StepResult]:
        """Write a round's steps (:meth:`write_steps`) in their own transaction, run
        again if the database broke a lock cycle with another writer."""
        return self.retried_transaction(lambda: self.write_steps(steps))

    def write_step(self, step: Step) -> StepResult:
        """:meth:`record_step` inside a transaction the caller already holds."""
        (result,) = self.write_steps([step])
        return result

    def write_steps(self, steps: Sequence[Step]) -> list[StepResult]:
        """Write a round's steps inside the caller's transaction, in a few set-based
        statements: one compare-and-set UPDATE for every notice (each row's own version
        and lease token; RETURNING says which won), then the facts, scrubs and events of
        the whole round together. Facts are kept whether or not their step won."""
        if not steps:
            return []
        conn = self.conn
        # Rows are locked in one order (by notice) by every writer, so two writers of
        # overlapping rounds (one with a lapsed lease) rarely wait on each other in a
        # cycle; when they do, the caller's retried transaction runs the round again.
        ordered = sorted(steps, key=lambda step: step.notice_id)
        rows = [  # the dialect's step_cas reads these by position
            [
                step.notice_id,
                step.version,
                step.lease_token,
                step.decision.phase.value,
                step.decision.reason.value,
                step.now,
                int(step.release or step.decision.phase.terminal),
                None if step.decision.phase.terminal else step.decision.due_at,
            ]
            for step in ordered
        ]
        # What each winning row now says (the terminal guard may have kept its phase).
        written = {
            row[0]: (str(row[1]), row[2])
            for row in conn.execute(self.sql.step_cas, (json.dumps(rows),)).fetchall()
        }
        won = set(written)
        results = [StepResult(step.notice_id in won, step.version + 1) for step in steps]
        self._write_all_facts(ordered, won)
        narrowed = [
            (",".join(s.facts.channels), s.notice_id)
            for s in ordered
            if isinstance(s.facts, SkippedFacts) and s.notice_id in won
        ]
        if narrowed:  # rare: no statement at all in a round without a skip
            conn.executemany("UPDATE notices SET channels = ? WHERE id = ?", narrowed)
        finished = [s.notice_id for s in steps if s.notice_id in won and s.decision.phase.terminal]
        if finished:
            chosen = json.dumps(finished)
            conn.execute(
                f"DELETE FROM notice_secrets WHERE notice_id IN {self.sql.ids()}",
                (chosen,),
            )
            # A lookup's fingerprint holds a digest of a body that carried the link.
            conn.execute(
                f"UPDATE attempts SET sent = NULL WHERE notice_id IN {self.sql.ids()}"
                " AND sent IS NOT NULL",
                (chosen,),
            )
            if not self._keep_outbox_content:
                # The outbox holds rendered messages (address, link): scrubbed too.
                conn.execute(
                    "UPDATE outbox SET content = '{\"scrubbed\": true}'"
                    f" WHERE notice_id IN {self.sql.ids()}",
                    (chosen,),
                )
        # Evidence changed the facts of a notice whose step lost: holders of older views
        # must reload, and a notice nobody holds is due at once, so whoever holds it next
        # acts on the evidence now rather than when its parked decision falls due. A live
        # lease keeps its due time (its end): its holder's next write loses its
        # compare-and-set, reloads and decides again.
        now = self.sql.lease_now
        conn.executemany(
            "UPDATE notices SET version = version + 1, due_at = CASE"
            f" WHEN due_at > {now} AND (lease_expires_at IS NULL"
            f" OR lease_expires_at <= {now}) THEN {now} ELSE due_at END"
            " WHERE id = :id",
            [
                {"now": s.now, "id": s.notice_id}
                for s in steps
                if s.notice_id not in won
                and s.facts is not None
                and not isinstance(s.facts, IntentFacts | DeclinedFacts)
            ],
        )
        conn.executemany(
            "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase,"
            " attempt_key, channel, status, polls, reason, lane_wait)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [event_row(s, written.get(s.notice_id)) for s in steps],
        )
        if self._before_commit is not None:
            for kind in dict.fromkeys(s.kind for s in steps):
                self._before_commit(kind)
        return results

    def _write_all_facts(self, steps: Sequence[Step], won: set[str]) -> None:
        """Every step's facts, grouped by kind so each kind is one executemany."""
        conn = self.conn
        intents = [s for s in steps if isinstance(s.facts, IntentFacts) and s.notice_id in won]
        # Counted before the attempt row exists: a retry of the same attempt is not another.
        texts = [
            {**_segments_row(f.segments, f.encoding, 1), "notice": s.notice_id, "now": s.now}
            for s in intents
            if isinstance(f := s.facts, IntentFacts) and f.encoding is not None
        ]
        if texts:  # a round of emails sends no statement for them
            conn.executemany(
                _SMS_SEGMENTS.format(day=self.sql.day(":now"), bucket=":bucket")
                + " WHERE n.id = :notice AND NOT EXISTS (SELECT 1 FROM attempts a"
                " WHERE a.notice_id = n.id AND a.channel = 'sms')" + _SEGMENTS_ADD,
                texts,
            )
        conn.executemany(
            "INSERT INTO attempts (attempt_key, notice_id, channel, transport,"
            " template_version, segments, state, recoverable, started_at,"
            " last_call_at, lookup_settle, locale, sent, call_mono)"
            " VALUES (?, ?, ?, ?, ?, ?, 'intent', ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (notice_id, channel) DO UPDATE SET calls = attempts.calls + 1,"
            " last_call_at = excluded.last_call_at, segments = excluded.segments,"
            # The instance that makes this call, and what it can do: an attempt moves
            # only when nothing was created, or when the policy trades a doubt for reach.
            " transport = excluded.transport, recoverable = excluded.recoverable,"
            " lookup_settle = excluded.lookup_settle,"
            " lookups = 0, first_lookup_at = NULL, lookup_mono = NULL,"
            " lookup_failing_since = NULL, locale = excluded.locale,"
            " sent = excluded.sent, call_mono = excluded.call_mono",
            [
                (
                    f.attempt_key,
                    s.notice_id,
                    f.channel,
                    f.transport,
                    f.template_version,
                    f.segments,
                    int(f.recoverable),
                    s.now,
                    s.now,
                    f.lookup_settle,
                    f.locale,
                    f.sent,
                    f.call_mono,
                )
                for s in intents
                if isinstance(f := s.facts, IntentFacts)
            ],
        )
        outcomes = [(s, s.facts) for s in steps if isinstance(s.facts, OutcomeFacts)]
        # A later fact never downgrades an earlier one: once submitted or rejected, a
        # stale worker's transient or ambiguous outcome does not undo it.
        conn.executemany(
            "UPDATE attempts SET settled = calls,"
            " state = CASE WHEN state IN ('submitted', 'rejected') AND :state NOT IN"
            " ('submitted', 'rejected') THEN state ELSE :state END,"
            " message_id = COALESCE(message_id, :message_id),"
            " submitted_at = CASE WHEN :state IN ('submitted', 'ambiguous')"
            " THEN COALESCE(submitted_at, :now) ELSE submitted_at END,"
            " last_error = :error WHERE attempt_key = :key",
            [
                {
                    "state": f.state.value,
                    "message_id": f.message_id,
                    "now": s.now,
                    "error": f.error,
                    "key": f.attempt_key,
                }
                for s, f in outcomes
            ],
        )
        observations: list[tuple[str, str, str, str, float, str | None]] = [
            (f.attempt_key, "submit", f.raw_status, f.status.value, s.now, None)
            for s, f in outcomes
            if f.status is not None and f.raw_status is not None
        ]
        for s in steps:
            facts = s.facts
            if isinstance(facts, DeclinedFacts):
                self._write_declined(facts)
            elif isinstance(facts, LookupFacts):
                self._write_lookup(conn, facts, s.notice_id in won, s.now)
            elif isinstance(facts, ObservationFacts):
                if facts.message_id is not None:
                    self._found(conn, facts.attempt_key, facts.message_id)
                observations.append(
                    (
                        facts.attempt_key,
                        facts.source,
                        facts.raw_status,
                        facts.status.value,
                        s.now,
                        facts.dedupe,
                    )
                )
        conn.executemany(
            "UPDATE attempts SET polls = polls + 1, last_read_at = ? WHERE attempt_key = ?",
            [
                (s.now, f.attempt_key)
                for s in steps
                if isinstance(f := s.facts, ObservationFacts) and f.source == "poll"
            ],
        )
        conn.executemany(
            "INSERT INTO observations (attempt_key, source, raw_status, status, observed_at,"
            " dedupe) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (dedupe) WHERE dedupe IS NOT NULL DO NOTHING",
            observations,
        )

    def _write_declined(self, facts: DeclinedFacts) -> None:
        """The call was never made: undo its intent (a first call leaves no attempt)."""
        self.conn.execute(
            "UPDATE attempts SET calls = calls - 1,"
            " settled = CASE WHEN settled < calls - 1 THEN settled ELSE calls - 1 END"
            " WHERE attempt_key = ?",
            (facts.attempt_key,),
        )
        if facts.encoding is not None:  # the intent's SMS count goes with it
            self.conn.execute(
                _SMS_SEGMENTS.format(day=self.sql.day("a.started_at"), bucket=_BUCKET_OF_ROW)
                + " JOIN attempts a ON a.notice_id = n.id WHERE a.attempt_key = :key"
                " AND a.calls = 0" + _SEGMENTS_ADD,
                {**_segments_row(None, facts.encoding, -1), "key": facts.attempt_key},
            )
        self.conn.execute(
            "DELETE FROM attempts WHERE attempt_key = ? AND calls = 0", (facts.attempt_key,)
        )

    @staticmethod
    def _found(conn: Connection, attempt_key: str, message_id: str) -> None:
        """The provider has the message (a lookup or a callback said so): an ambiguous or
        in-doubt attempt is submitted, with the provider's id."""
        conn.execute(
            "UPDATE attempts SET message_id = COALESCE(message_id, :message_id),"
            " state = CASE WHEN state IN ('intent', 'ambiguous') THEN 'submitted' ELSE state END,"
            " settled = calls, submitted_at = COALESCE(submitted_at, last_call_at),"
            " lookups = 0, first_lookup_at = NULL, lookup_mono = NULL,"
            " lookup_failing_since = NULL WHERE attempt_key = :key",
            {"message_id": message_id, "key": attempt_key},
        )

    def _write_lookup(self, conn: Connection, facts: LookupFacts, won: bool, now: float) -> None:
        """A lookup's facts. Found is evidence, kept whoever holds the notice; what a
        failed or not-found read adds to the doubt's bookkeeping counts only for the
        holder that asked (a lost one is asked again), and is written exactly as the
        machine folded it: the store never decides when a doubt is settled."""
        if facts.message_id is not None:
            self._found(conn, facts.attempt_key, facts.message_id)
            conn.execute(
                "UPDATE attempts SET last_read_at = ? WHERE attempt_key = ?",
                (now, facts.attempt_key),
            )
            if facts.status is not None and facts.raw_status is not None:
                self._insert_observation(
                    conn, facts.attempt_key, "lookup", facts.raw_status, facts.status, now
                )
            return
        if not won:
            return
        after = facts.after
        conn.execute(
            "UPDATE attempts SET lookups = ?, first_lookup_at = ?, lookup_mono = ?,"
            " lookup_failing_since = ?, last_read_at = ?, state = ?, settled = ?"
            " WHERE attempt_key = ?",
            (
                after.lookups,
                after.first_lookup_at,
                after.lookup_mono,
                after.lookup_failing_since,
                after.last_read_at,
                after.state.value,
                after.settled,
                facts.attempt_key,
            ),
        )

    @staticmethod
    def _insert_observation(
        conn: Connection,
        attempt_key: str,
        source: str,
        raw_status: str,
        status: Status,
        now: float,
        dedupe: str | None = None,
    ) -> None:
        conn.execute(
            "INSERT INTO observations (attempt_key, source, raw_status, status, observed_at,"
            " dedupe) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (dedupe) WHERE dedupe IS NOT NULL DO NOTHING",
            (attempt_key, source, raw_status, status.value, now, dedupe),
        )

    def record_lease_recovery(self, notice_id: str, worker: str, phase: Phase, now: float) -> None:
        """An event saying this worker took over a lease its holder never released."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO events (notice_id, at, worker, kind, old_phase, new_phase)"
                " VALUES (?, ?, ?, 'lease_recovered', ?, ?)",
                (notice_id, now, worker, phase.value, phase.value),
            )
