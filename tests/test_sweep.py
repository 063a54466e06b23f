"""Sweeps on a real SQLite file with the outbox, driven by a fake clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from conftest import FakeClock, make_settings, run_sweep
from fakes import ScriptedTransport

from resetctl.config import Settings
from resetctl.store import Store
from resetctl.telemetry import TransitionEvent
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    ProviderStatus,
    TransientError,
    build_transports,
)
from resetctl.transports.outbox import OutboxTransport


def messages(store: Store, notice_id: str, channel: str | None = None) -> list[dict[str, Any]]:
    rows = store.outbox_messages(notice_id)
    return [r for r in rows if channel is None or r["channel"] == channel]


def set_status(store: Store, notice_id: str, channel: str, status: str, clock: FakeClock) -> None:
    (message,) = messages(store, notice_id, channel)
    assert store.outbox_set_status(message["message_id"], status, clock())


def phase(store: Store, notice_id: str) -> str:
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    return loaded.state.phase.value


PENDING = make_settings(outbox={"email_status": "pending", "sms_status": "pending"})


def test_accepted_email_ends_the_notice_in_one_sweep(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """An email the outbox accepts at once makes the notice accepted; no SMS is sent."""
    notice_id = make_notice()
    summary = run_sweep(store, make_settings(), clock)
    assert (summary.claimed, summary.submitted, summary.accepted) == (1, 1, 1)
    assert phase(store, notice_id) == "accepted"
    assert [m["channel"] for m in messages(store, notice_id)] == ["email"]


def test_email_failure_sends_exactly_one_sms_in_the_same_sweep(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A failed email claims the SMS fallback and submits it in the sweep that claimed it."""
    settings = make_settings(outbox={"email_status": "failed"})
    notice_id = make_notice(settings)
    summary = run_sweep(store, settings, clock)
    assert (summary.escalated, summary.accepted) == (1, 1)
    assert len(messages(store, notice_id, "sms")) == 1
    clock.advance(3600)
    run_sweep(store, settings, clock)
    assert len(messages(store, notice_id, "sms")) == 1


def test_expiry_before_the_fallback_claim_expires_without_a_fallback(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A failure seen with less than the fallback reserve left expires the notice; no SMS."""
    notice_id = make_notice(PENDING)
    run_sweep(store, PENDING, clock)
    set_status(store, notice_id, "email", "failed", clock)
    # Cron stalled: the next sweep runs with 2 minutes left, under the 3-minute reserve.
    clock.advance(8 * 60)
    summary = run_sweep(store, PENDING, clock)
    assert summary.expired == 1
    assert phase(store, notice_id) == "expired"
    assert messages(store, notice_id, "sms") == []


def test_link_expiry_stops_everything(store: Store, clock: FakeClock, make_notice: Any) -> None:
    """A notice found after its expiry is expired without any submission."""
    notice_id = make_notice(ttl="90s")
    clock.advance(90)
    summary = run_sweep(store, make_settings(), clock)
    assert (summary.expired, summary.submitted) == (1, 0)
    assert messages(store, notice_id) == []


def test_poll_budget_spent_escalates_to_sms(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """An email still pending after its 15/45/105 s polls escalates to one SMS."""
    notice_id = make_notice(PENDING)
    run_sweep(store, PENDING, clock, max_runtime=104)
    assert phase(store, notice_id) == "primary_pending"
    assert messages(store, notice_id, "sms") == []
    run_sweep(store, PENDING, clock, max_runtime=5)
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    email = loaded.state.attempt("email")
    assert email is not None
    assert email.polls == 3
    assert phase(store, notice_id) == "fallback_pending"
    assert len(messages(store, notice_id, "sms")) == 1


def test_poll_budget_spent_expires_under_expire_policy(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """With on_poll_budget_spent = "expire", an unanswered email expires; no SMS."""
    settings = make_settings(
        outbox={"email_status": "pending"},
        policy={"default": {"on_poll_budget_spent": "expire"}},
    )
    notice_id = make_notice(settings)
    run_sweep(store, settings, clock, max_runtime=120)
    assert phase(store, notice_id) == "expired"
    assert messages(store, notice_id, "sms") == []
    assert store.load_contact(notice_id) is None


def test_max_runtime_keeps_sub_minute_polls_inside_one_cron_minute(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """One sweep with --max-runtime 55s makes the 15 s and 45 s polls on time."""
    notice_id = make_notice(PENDING)
    summary = run_sweep(store, PENDING, clock, max_runtime=55)
    assert summary.polled == 2
    history = store.event_rows(notice_id)
    polls = [e["at"] for e in history if e["kind"] == "poll"]
    created = store.load_notice(notice_id)
    assert created is not None
    assert [p - created.created_at for p in polls] == [15.0, 45.0]


def _wrap(settings: Settings, store: Store, clock: FakeClock, channel: str, **kw: Any) -> Any:
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    transports[channel] = ScriptedTransport(transports[channel], **kw)
    return transports


def test_ambiguous_fallback_is_recorded_and_never_resent(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """An SMS submission that times out after sending is recorded, never sent a second time."""
    settings = make_settings(outbox={"email_status": "failed", "sms_status": "pending"})
    notice_id = make_notice(settings)
    transports = _wrap(settings, store, clock, "sms", recovers_by_key=False)
    sms = transports["sms"]

    def deliver_then_time_out(message: Message, key: str) -> None:
        sms.inner.submit(message, key)  # the provider got it; the response is lost
        raise AmbiguousError("read timed out after the request was sent")

    sms.on_submit = deliver_then_time_out
    summary = run_sweep(store, settings, clock, transports)
    assert summary.errors == 1
    for _ in range(12):
        clock.advance(30)
        run_sweep(store, settings, clock, transports)
    assert len(sms.submits) == 1
    assert len(messages(store, notice_id, "sms")) == 1
    (attempt,) = [a for a in store.attempt_rows(notice_id) if a["channel"] == "sms"]
    assert attempt["state"] == "ambiguous"
    # A transport from outside resetctl keeps its error's kind and class, not its text.
    assert attempt["last_error"] == (
        "ambiguous: ScriptedTransport raised AmbiguousError (a plugin transport's message"
        " is not kept)"
    )
    assert phase(store, notice_id) == "expired"


def test_ambiguous_submission_is_recovered_by_key_on_an_idempotent_transport(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """With a transport that dedupes by key, recovery resubmits under the same key: one message."""
    settings = make_settings(outbox={"email_status": "failed", "sms_status": "delivered"})
    notice_id = make_notice(settings)
    transports = _wrap(settings, store, clock, "sms")
    sms = transports["sms"]

    def deliver_then_time_out(message: Message, key: str) -> None:
        if not sms.submits[1:]:
            sms.inner.submit(message, key)
            raise AmbiguousError("connection reset after the request was sent")

    sms.on_submit = deliver_then_time_out
    run_sweep(store, settings, clock, transports)
    clock.advance(settings.default_policy.retry_delays[0])
    run_sweep(store, settings, clock, transports)
    assert len(set(sms.submits)) == 1
    assert len(sms.submits) == 2
    assert len(messages(store, notice_id, "sms")) == 1
    assert phase(store, notice_id) == "accepted"


def test_transient_error_is_retried_by_a_later_sweep_under_the_same_key(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A transient failure leaves the attempt for a later sweep, with the same attempt key."""
    settings = make_settings()
    notice_id = make_notice(settings)
    transports = _wrap(settings, store, clock, "email", submit_errors=[TransientError("503")])
    first = run_sweep(store, settings, clock, transports)
    assert (first.errors, first.submitted) == (1, 0)
    assert phase(store, notice_id) == "primary_pending"
    clock.advance(settings.default_policy.retry_delays[0])
    run_sweep(store, settings, clock, transports)
    assert transports["email"].submits == [f"{notice_id}:email:1"] * 2
    assert phase(store, notice_id) == "accepted"


def test_one_notice_transport_error_never_stops_the_batch(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A permanent error on one notice's email leaves the others untouched."""
    settings = make_settings(policy={"default": {"channels": ["email"]}})
    ids = [make_notice(settings) for _ in range(4)]
    transports = _wrap(
        settings, store, clock, "email", submit_errors=[PermanentError("mailbox unavailable")]
    )
    summary = run_sweep(store, settings, clock, transports)
    assert (summary.claimed, summary.errors, summary.accepted, summary.failed) == (4, 1, 3, 1)
    assert sorted(phase(store, i) for i in ids) == ["accepted"] * 3 + ["failed"]


def test_a_leased_notice_is_left_alone_until_its_lease_passes(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """Another worker's live lease keeps a notice out of every claim; once it passes, it's due."""
    make_notice()
    (claim,) = store.claim_due("other", clock(), 60.0, 10)
    assert run_sweep(store, make_settings(), clock).claimed == 0
    clock.advance(60)
    summary = run_sweep(store, make_settings(), clock)
    assert (summary.claimed, summary.lease_recoveries, summary.accepted) == (1, 1, 1)
    kinds = [e["kind"] for e in store.event_rows(claim.notice_id)]
    assert kinds[0] == "lease_recovered"


def test_every_transition_is_one_event_row(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """Each recorded step is an event with phases, attempt key, status, polls and worker."""
    settings = make_settings(outbox={"email_status": "failed"})
    notice_id = make_notice(settings)
    seen: list[TransitionEvent] = []
    run_sweep(store, settings, clock, worker="w-1", listeners=[seen.append])
    rows = store.event_rows(notice_id)
    assert [(r["kind"], r["old_phase"], r["new_phase"]) for r in rows] == [
        ("intent", "queued", "primary_pending"),
        ("outcome", "primary_pending", "fallback_pending"),
        ("intent", "fallback_pending", "fallback_pending"),
        ("outcome", "fallback_pending", "accepted"),
    ]
    assert rows[1]["attempt_key"] == f"{notice_id}:email:1"
    assert rows[1]["status"] == "failed"
    assert {r["worker"] for r in rows} == {"w-1"}
    assert [(e.kind, e.new_phase) for e in seen] == [(r["kind"], r["new_phase"]) for r in rows]


def test_terminal_notice_loses_its_secrets_and_ignores_late_receipts(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """Contact data and URL are scrubbed at the end; a later receipt changes nothing."""
    notice_id = make_notice(PENDING)
    run_sweep(store, PENDING, clock, max_runtime=130)
    set_status(store, notice_id, "sms", "delivered", clock)
    clock.advance(20)
    run_sweep(store, PENDING, clock)
    assert phase(store, notice_id) == "accepted"
    assert store.load_contact(notice_id) is None
    set_status(store, notice_id, "email", "delivered", clock)
    clock.advance(60)
    assert run_sweep(store, PENDING, clock).claimed == 0
    assert phase(store, notice_id) == "accepted"


def test_sms_over_its_segment_limit_is_refused_not_sent(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """An SMS rendered over sms.max_segments is never sent; the channel counts as failed."""
    settings = make_settings(policy={"default": {"channels": ["sms"], "sms": {"max_segments": 1}}})
    notice_id = make_notice(settings, reset_url="https://shop.example/r/" + "x" * 200)
    summary = run_sweep(store, settings, clock)
    assert (summary.errors, summary.failed) == (1, 1)
    assert messages(store, notice_id) == []
    (attempt,) = store.attempt_rows(notice_id)
    assert attempt["state"] == "rejected"
    assert attempt["segments"] > 1


def test_evidence_written_mid_call_loses_the_race_but_not_the_notice(
    store: Store, db: str, clock: FakeClock, make_notice: Any
) -> None:
    """If another writer changes the row during the call, the outcome is kept and re-decided."""
    settings = make_settings(outbox={"email_status": "failed"})
    notice_id = make_notice(settings)
    transports = _wrap(settings, store, clock, "email")

    def concurrent_writer(message: Message, key: str) -> None:
        with Store(db) as other, other.transaction() as conn:
            conn.execute("UPDATE notices SET version = version + 1 WHERE id = ?", (notice_id,))

    transports["email"].on_submit = concurrent_writer
    summary = run_sweep(store, settings, clock, transports)
    assert summary.lost_races == 1
    assert phase(store, notice_id) == "accepted"
    email = next(a for a in store.attempt_rows(notice_id) if a["channel"] == "email")
    assert (email["state"], email["status"]) == ("submitted", "failed")
    assert len(messages(store, notice_id, "sms")) == 1
    assert "lost_race" in [e["kind"] for e in store.event_rows(notice_id)]


def test_outbox_content_is_scrubbed_with_the_notice_unless_kept(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A finished notice's rendered messages leave the outbox too, unless keep_content."""
    scrubbed = make_notice()
    run_sweep(store, make_settings(), clock)
    (message,) = messages(store, scrubbed)
    shown = store.outbox_message(message["message_id"])
    assert shown is not None
    assert shown.get("scrubbed") is True
    assert "text" not in shown
    assert "to" not in shown
    settings = make_settings(outbox={"keep_content": True})
    kept = make_notice(settings)
    run_sweep(store, settings, clock)
    (message,) = messages(store, kept)
    shown = store.outbox_message(message["message_id"])
    assert shown is not None
    assert "https://shop.example/reset/" in shown["text"]


class _Crash(BaseException):
    """Stands in for the process dying mid-call."""


def test_a_crash_mid_batch_leaves_at_most_one_keyless_submission_in_doubt(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """Without recovery by key, each notice goes intent-call-outcome alone: one in doubt."""
    settings = make_settings(policy={"default": {"channels": ["email"]}})
    ids = [make_notice(settings) for _ in range(3)]
    transports = _wrap(settings, store, clock, "email", recovers_by_key=False)
    email = transports["email"]

    def die_on_the_second_call(message: Message, key: str) -> None:
        if len(email.submits) == 2:
            raise _Crash

    email.on_submit = die_on_the_second_call
    with pytest.raises(_Crash):
        run_sweep(store, settings, clock, transports)
    states = {}
    for notice_id in ids:
        rows = store.attempt_rows(notice_id)
        states[notice_id] = (
            (rows[0]["state"], rows[0]["calls"], rows[0]["settled"]) if rows else None
        )
    assert sorted(states.values(), key=str) == sorted(
        [("submitted", 1, 1), ("intent", 1, 0), None], key=str
    )


def test_calls_are_rechecked_against_expiry_just_before_they_are_made(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """When earlier calls of a round used up the time, later ones are declined, not sent."""
    settings = make_settings(outbox={"email_status": "pending"})
    ids = [make_notice(settings, ttl="2m") for _ in range(5)]
    transports = _wrap(settings, store, clock, "email")

    def slow(message: Message, key: str) -> None:
        clock.advance(40)  # a provider taking 40 s to answer

    transports["email"].on_submit = slow
    summary = run_sweep(store, settings, clock, transports, lease=600)
    sent = [n for n in ids if messages(store, n)]
    assert len(sent) == 3  # at 0, 40 and 80 s; at 120 s less than send_reserve is left
    assert summary.declined == 2
    for notice_id in set(ids) - set(sent):
        # A declined call is not an attempt: nothing is left that could count as a retry.
        assert store.attempt_rows(notice_id) == []
        kinds = [e["kind"] for e in store.event_rows(notice_id)]
        assert "declined" in kinds
        loaded = store.load_notice(notice_id)
        assert loaded is not None
        assert (loaded.state.phase, loaded.reason) == ("expired", "link_expired")  # at 120 s


def test_a_late_receipt_never_rewrites_how_a_notice_ended(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A delivery reported after a notice expired is stored; phase and reason stay."""
    from resetctl.machine import Status
    from resetctl.observe import record_callback

    settings = make_settings(
        outbox={"email_status": "pending"},
        policy={"default": {"on_poll_budget_spent": "expire"}},
    )
    notice_id = make_notice(settings)
    run_sweep(store, settings, clock, max_runtime=120)
    before = store.load_notice(notice_id)
    assert before is not None
    assert (before.state.phase.value, before.reason) == ("expired", "budget_spent_expire")
    (message,) = messages(store, notice_id)
    record_callback(store, "outbox", message["message_id"], "delivered", Status.DELIVERED, clock())
    after = store.load_notice(notice_id)
    assert after is not None
    assert (after.state.phase.value, after.reason) == ("expired", "budget_spent_expire")
    assert after.state.attempts[0].status is Status.DELIVERED  # the evidence is kept


def test_a_transport_error_quoting_the_recipient_is_not_kept(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A plugin's error text that echoes the address or link is never stored: its kind
    and class are (tests/test_redaction.py feeds every path the encoded forms)."""
    settings = make_settings(policy={"default": {"channels": ["email"]}})
    notice_id = make_notice(settings, email="quoted.person@example.org")
    transports = _wrap(
        settings,
        store,
        clock,
        "email",
        submit_errors=[PermanentError("550 <quoted.person@example.org> unknown user")],
    )
    run_sweep(store, settings, clock, transports)
    (attempt,) = store.attempt_rows(notice_id)
    assert "quoted.person" not in attempt["last_error"]
    assert attempt["last_error"].startswith("permanent: ScriptedTransport raised PermanentError")


class CountingOutbox(OutboxTransport):
    """The outbox, counting its status calls; ``fail_reads`` makes the next batch read
    raise (once) and ``forget`` removes messages from what a batch read returns."""

    def __init__(self, store: Store, clock: FakeClock) -> None:
        super().__init__(store, "pending", clock)
        self.single_reads = 0
        self.batch_reads: list[list[str]] = []
        self.fail_reads: TransientError | None = None
        self.forget: set[str] = set()

    def status(self, message_id: str) -> ProviderStatus:
        self.single_reads += 1
        return super().status(message_id)

    def statuses(self, message_ids: Sequence[str]) -> Mapping[str, ProviderStatus]:
        self.batch_reads.append(list(message_ids))
        if self.fail_reads is not None:
            error, self.fail_reads = self.fail_reads, None
            raise error
        found = super().statuses(message_ids)
        return {k: v for k, v in found.items() if k not in self.forget}


def test_a_round_reads_its_outbox_statuses_in_one_call(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """Polls due together are one batch read per channel; each notice folds its own."""
    ids = [make_notice(PENDING) for _ in range(3)]
    outbox = CountingOutbox(store, clock)
    transports = {"email": outbox, "sms": outbox}
    run_sweep(store, PENDING, clock, transports)
    set_status(store, ids[0], "email", "delivered", clock)
    set_status(store, ids[1], "email", "failed", clock)
    clock.advance(15)
    summary = run_sweep(store, PENDING, clock, transports)
    assert summary.polled == 3
    assert outbox.single_reads == 0
    assert [len(batch) for batch in outbox.batch_reads] == [3]
    assert [phase(store, n) for n in ids] == ["accepted", "fallback_pending", "primary_pending"]


def test_a_failed_batch_read_falls_back_to_one_read_each(
    store: Store, clock: FakeClock, make_notice: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch read that raises is not charged to every notice in it: the round reads
    those messages one by one. A message missing from a batch's answer is a permanent
    error for that one poll only, as a single read of it would be."""
    ids = [make_notice(PENDING) for _ in range(2)]
    outbox = CountingOutbox(store, clock)
    transports = {"email": outbox, "sms": outbox}
    run_sweep(store, PENDING, clock, transports)
    outbox.fail_reads = TransientError("database busy")
    clock.advance(15)
    summary = run_sweep(store, PENDING, clock, transports)
    assert (summary.polled, summary.errors, outbox.single_reads) == (2, 0, 2)
    assert "status read of 2 messages failed (transient)" in caplog.text
    (first,) = messages(store, ids[0], "email")
    outbox.forget = {first["message_id"]}
    clock.advance(30)
    summary = run_sweep(store, PENDING, clock, transports)
    assert (summary.polled, summary.errors, outbox.single_reads) == (2, 1, 2)
    for notice_id in ids:
        assert phase(store, notice_id) == "primary_pending"
        loaded = store.load_notice(notice_id)
        assert loaded is not None
        email = loaded.state.attempt("email")
        assert email is not None
        assert email.polls == 2
    raws = {
        notice_id: [
            row[0]
            for row in store.conn.execute(
                "SELECT o.raw_status FROM observations o JOIN attempts a"
                " ON a.attempt_key = o.attempt_key"
                " WHERE o.source = 'poll' AND a.notice_id = ? ORDER BY o.id",
                (notice_id,),
            )
        ]
        for notice_id in ids
    }
    assert raws == {ids[0]: ["pending", "error:permanent"], ids[1]: ["pending", "pending"]}


def test_a_message_stored_under_an_older_id_is_the_one_polled(
    store: Store, clock: FakeClock, make_notice: Any
) -> None:
    """A sweep of an older resetctl stored this key's message under the old id form: the
    resubmission is the same message, the attempt points at the stored id, polls find it."""
    notice_id = make_notice(PENDING)
    key = f"{notice_id}:email:1"
    with store.transaction() as conn:  # what the older sweep wrote before it died
        conn.execute(
            "INSERT INTO outbox (message_id, attempt_key, notice_id, channel, status,"
            " submitted_at, updated_at, content) VALUES ('obx_0123456789abcdef', ?, ?,"
            " 'email', 'pending', ?, ?, '{}')",
            (key, notice_id, clock(), clock()),
        )
    run_sweep(store, PENDING, clock)
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    email = loaded.state.attempt("email")
    assert email is not None
    assert email.message_id == "obx_0123456789abcdef"
    assert len(messages(store, notice_id)) == 1
    assert store.outbox_set_status("obx_0123456789abcdef", "delivered", clock())
    clock.advance(15)
    summary = run_sweep(store, PENDING, clock)
    assert (summary.accepted, summary.errors) == (1, 0)
    # The same holds for a submission outside a sweep's rounds.
    assert store.outbox_submit(key, notice_id, "email", {}, "pending", clock()) == (
        "obx_0123456789abcdef",
        "delivered",
    )
