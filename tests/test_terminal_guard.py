"""The store's own guard that a terminal notice never moves, tested below the machine.

The machine never decides to move a terminal notice, so sweep and callback tests cannot
see whether the database would refuse to. These tests hand Store.write_step (and
record_step) decisions that try to, with a matching row version and lease token, and
check that the row keeps its phase, reason and phase_since.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import T0, FakeClock

from resetctl.machine import ActionKind, Decision, Phase, Reason, Status
from resetctl.store import IntentFacts, LoadedNotice, ObservationFacts, Step, Store

#: How each terminal phase is reached, with the reason the machine records.
ENDINGS = [
    (Phase.ACCEPTED, Reason.ACCEPTED),
    (Phase.FAILED, Reason.CHANNELS_EXHAUSTED),
    (Phase.EXPIRED, Reason.LINK_EXPIRED),
    (Phase.CANCELLED, Reason.COMPLETED),
]
#: A decision that would move a notice into each phase.
MOVES = {
    Phase.QUEUED: Decision(Phase.QUEUED, ActionKind.SUBMIT, "email", T0 + 40, Reason.RETRY),
    Phase.PRIMARY_PENDING: Decision(
        Phase.PRIMARY_PENDING, ActionKind.POLL, "email", T0 + 40, Reason.POLL_SCHEDULED
    ),
    Phase.FALLBACK_PENDING: Decision(
        Phase.FALLBACK_PENDING, ActionKind.SUBMIT, "sms", T0 + 40, Reason.PRIMARY_FAILED
    ),
    Phase.ACCEPTED: Decision(Phase.ACCEPTED, ActionKind.NONE, None, None, Reason.ACCEPTED),
    Phase.FAILED: Decision(Phase.FAILED, ActionKind.NONE, None, None, Reason.CHANNELS_EXHAUSTED),
    Phase.EXPIRED: Decision(Phase.EXPIRED, ActionKind.NONE, None, None, Reason.LINK_EXPIRED),
    Phase.CANCELLED: Decision(Phase.CANCELLED, ActionKind.NONE, None, None, Reason.WITHDRAWN),
}
ENDED_AT = T0 + 5
LATER = T0 + 30
#: Every (terminal phase, phase a writer tries to move it to) pair.
ATTEMPTED_MOVES = [
    pytest.param(ending, target, id=f"{ending[0]}->{target}")
    for ending in ENDINGS
    for target in Phase
    if target is not ending[0]
]

EndedNotice = Callable[[Phase, Reason], str]


def _loaded(store: Store, notice_id: str) -> LoadedNotice:
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    return loaded


def _step(
    loaded: LoadedNotice,
    decision: Decision,
    *,
    lease_token: str | None,
    release: bool,
    facts: IntentFacts | ObservationFacts | None = None,
    kind: str = "tick",
    now: float = LATER,
) -> Step:
    return Step(
        notice_id=loaded.state.notice_id,
        version=loaded.version,
        lease_token=lease_token,
        old_phase=loaded.state.phase,
        decision=decision,
        release=release,
        facts=facts,
        kind=kind,
        worker="late-writer",
        now=now,
    )


@pytest.fixture
def ended(store: Store, make_notice: Callable[..., str], clock: FakeClock) -> EndedNotice:
    """A notice whose email was submitted and which then ended in the given phase."""

    def make(phase: Phase, reason: Reason) -> str:
        notice_id = make_notice()
        (claim,) = store.claim_due("w", clock(), 60.0, 1)
        first = Decision(
            Phase.PRIMARY_PENDING, ActionKind.SUBMIT, "email", T0, Reason.FIRST_SUBMISSION
        )
        intent = IntentFacts(f"{notice_id}:email:1", "email", "outbox", "v1", None, True)
        loaded = _loaded(store, notice_id)
        step = _step(
            loaded, first, lease_token=claim.lease_token, release=False, facts=intent, now=T0
        )
        assert store.record_step(step).won
        end = Decision(phase, ActionKind.NONE, None, None, reason)
        step = _step(
            _loaded(store, notice_id),
            end,
            lease_token=claim.lease_token,
            release=True,
            now=ENDED_AT,
        )
        assert store.record_step(step).won
        after = _loaded(store, notice_id)
        assert (after.state.phase, after.reason, after.phase_since) == (phase, reason, ENDED_AT)
        return notice_id

    return make


def _assert_unmoved(store: Store, notice_id: str, phase: Phase, reason: Reason) -> None:
    after = _loaded(store, notice_id)
    assert after.state.phase is phase
    assert after.reason == reason
    assert after.phase_since == ENDED_AT


@pytest.mark.parametrize("release", [True, False], ids=["release", "keep-lease"])
@pytest.mark.parametrize(("ending", "target"), ATTEMPTED_MOVES)
def test_record_step_never_moves_a_terminal_notice(
    store: Store,
    ended: EndedNotice,
    ending: tuple[Phase, Reason],
    target: Phase,
    release: bool,
) -> None:
    """A lease-less writer (a callback) with the current version cannot move a terminal notice."""
    notice_id = ended(*ending)
    step = _step(_loaded(store, notice_id), MOVES[target], lease_token=None, release=release)

    store.record_step(step)

    _assert_unmoved(store, notice_id, *ending)


@pytest.mark.parametrize(("ending", "target"), ATTEMPTED_MOVES)
def test_write_step_inside_a_transaction_never_moves_a_terminal_notice(
    store: Store, ended: EndedNotice, ending: tuple[Phase, Reason], target: Phase
) -> None:
    """write_step in the caller's transaction keeps a terminal notice where it is."""
    notice_id = ended(*ending)
    step = _step(_loaded(store, notice_id), MOVES[target], lease_token=None, release=False)

    with store.transaction():
        store.write_step(step)

    _assert_unmoved(store, notice_id, *ending)


@pytest.mark.parametrize(("ending", "target"), ATTEMPTED_MOVES)
def test_even_the_rows_lease_holder_cannot_move_a_terminal_notice(
    store: Store, ended: EndedNotice, ending: tuple[Phase, Reason], target: Phase
) -> None:
    """A writer whose version and lease token both match the row still cannot move it."""
    notice_id = ended(*ending)
    # A terminal notice has no lease; give it one, so the token compare-and-set matches.
    with store.transaction() as conn:
        conn.execute(
            "UPDATE notices SET lease_owner = 'late-writer', lease_token = 'tok',"
            " lease_expires_at = ? WHERE id = ?",
            (LATER + 60, notice_id),
        )
    loaded = _loaded(store, notice_id)
    assert loaded.lease_token == "tok"
    step = _step(loaded, MOVES[target], lease_token="tok", release=True)

    assert store.record_step(step).won  # the compare-and-set matched: only the guard held

    _assert_unmoved(store, notice_id, *ending)


@pytest.mark.parametrize("ending", ENDINGS, ids=[str(phase) for phase, _ in ENDINGS])
@pytest.mark.parametrize("status", [Status.DELIVERED, Status.FAILED])
def test_late_evidence_on_a_terminal_notice_is_stored_not_acted_on(
    store: Store, ended: EndedNotice, ending: tuple[Phase, Reason], status: Status
) -> None:
    """A late receipt is kept as an observation; the notice stays where it ended."""
    notice_id = ended(*ending)
    receipt = ObservationFacts(f"{notice_id}:email:1", "callback", str(status), status)
    move = MOVES[Phase.FALLBACK_PENDING if status is Status.FAILED else Phase.ACCEPTED]
    step = _step(_loaded(store, notice_id), move, lease_token=None, release=False, facts=receipt)

    store.record_step(step)

    _assert_unmoved(store, notice_id, *ending)
    observed = store.conn.execute(
        "SELECT source, status, observed_at FROM observations WHERE attempt_key = ?",
        (f"{notice_id}:email:1",),
    ).fetchall()
    assert observed == [("callback", str(status), LATER)]


@pytest.mark.parametrize("ending", ENDINGS, ids=[str(phase) for phase, _ in ENDINGS])
def test_a_terminal_notice_is_never_claimed(
    store: Store, ended: EndedNotice, ending: tuple[Phase, Reason]
) -> None:
    """A terminal notice has no due time, so no claim, however late, picks it up."""
    notice_id = ended(*ending)
    assert _loaded(store, notice_id).due_at is None
    assert store.claim_due("sweeper", T0 + 10**6, 60.0, 50) == []


@pytest.mark.parametrize("ending", ENDINGS, ids=[str(phase) for phase, _ in ENDINGS])
def test_a_refused_move_leaves_no_trace_of_a_move(
    store: Store, ended: EndedNotice, ending: tuple[Phase, Reason]
) -> None:
    """A refused move neither makes the notice claimable nor logs a phase change."""
    notice_id = ended(*ending)
    step = _step(
        _loaded(store, notice_id), MOVES[Phase.FALLBACK_PENDING], lease_token=None, release=True
    )

    store.record_step(step)

    assert _loaded(store, notice_id).due_at is None
    assert store.claim_due("sweeper", LATER + 60, 60.0, 50) == []
    last = store.event_rows(notice_id)[-1]
    assert last["new_phase"] == str(ending[0])
