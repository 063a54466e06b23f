"""A sweep process killed with SIGKILL at each boundary of a submission, then recovered.

The boundaries are the sweep's failpoints: after the claim, after the intent commit,
after the transport accepted (before the outcome is recorded), and during the outcome
write (its statements ran, its COMMIT never did). The crash interrupts an email the
outbox accepts at once, an email it fails (so recovery must go on to the SMS fallback),
or the SMS fallback itself, claimed after a poll found the email failed. Recovery runs
in-process under a FakeClock past the dead worker's lease, sweep after sweep until
nothing is due.

Every process sends through ``countbox`` (soakbox.py: the outbox with the shape's
statuses, plus a call log every process appends to), so transport calls are counted
where they are made: the outbox keeps one message per attempt key, and writes it only
with the round's outcomes, so its rows cannot show a call the crash cut short.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import soakbox
from conftest import (
    FakeClock,
    database_follows,
    later,
    make_settings,
    reset_request,
    resetctl,
    run_sweep,
)
from test_races import (
    CountedOutbox,
    _assert_sent_once_each,
    _enqueue_due_now,
    _events_of,
    _loaded,
    _phases,
)

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase, attempt_key
from resetctl.store import Store, outbox_message_id

NOTICES = 20
#: The dying sweep claims this many; the rest wait, untouched, for the recovery.
BATCH = 5
LEASE = 30.0
#: Recovery sweeps before the test gives up on the notices ever settling.
MAX_RECOVERY_SWEEPS = 10
FAILPOINTS = ("after_claim", "after_intent", "after_submit", "during_outcome")
#: How long before the dying sweep the in-flight notices were enqueued: their emails'
#: polls are all due by then.
IN_FLIGHT_AGE = 120.0


@dataclass(frozen=True)
class Shape:
    """What the notices look like when the sweep that dies claims them."""

    #: the status the outbox gives each new email
    email_status: str
    #: the channels every notice ends up attempted on
    channels: tuple[str, ...]
    #: the channel whose submission the crash interrupts
    crashed: str
    #: the notices' phase before that submission's intent
    phase_before: Phase
    #: their phase once that intent is committed
    phase_after: Phase
    #: the emails went out earlier (still pending) and have failed since: the sweep that
    #: dies polls them and claims the SMS fallback
    in_flight: bool = False


SHAPES = {
    "email_accepted": Shape("accepted", ("email",), "email", Phase.QUEUED, Phase.PRIMARY_PENDING),
    "email_failed_sms_fallback": Shape(
        "failed", ("email", "sms"), "email", Phase.QUEUED, Phase.PRIMARY_PENDING
    ),
    "sms_fallback_after_a_failed_poll": Shape(
        "pending", ("email", "sms"), "sms", Phase.PRIMARY_PENDING, Phase.FALLBACK_PENDING, True
    ),
}


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CountedOutbox:
    """The counted outbox, installed for the sweep process and for this one.

    Only its plugin, call log, environment and call counts serve here: `_settings` gives
    it the shape's statuses.
    """
    site = tmp_path / "site"
    soakbox.install(site)
    monkeypatch.syspath_prepend(str(site))
    return CountedOutbox(site, tmp_path / "calls.log")


def _settings(shape: Shape, counted: CountedOutbox) -> tuple[Settings, str]:
    """The shape's settings, and the same as a config file for the sweep process."""
    outbox = {"email_status": shape.email_status, "sms_status": "delivered"}
    countbox = {**outbox, "call_log": str(counted.log)}
    transport = {"email": "countbox", "sms": "countbox"}
    toml = (
        "[transport]\n"
        + "".join(f"{key} = {json.dumps(value)}\n" for key, value in transport.items())
        + "[countbox]\n"
        + "".join(f"{key} = {json.dumps(value)}\n" for key, value in countbox.items())
    )
    return make_settings(transport=transport, countbox=countbox), toml


def _enqueue(db: Path | str, settings: Settings, shape: Shape) -> list[str]:
    """NOTICES notices due now: new ones, or ones whose pending emails have just failed."""
    if not shape.in_flight:
        return _enqueue_due_now(db, settings, NOTICES)
    # Enqueued IN_FLIGHT_AGE ago and their emails sent at once (10-minute links: plenty
    # left); the outbox has reported each email failed since.
    earlier = FakeClock(time.time() - IN_FLIGHT_AGE)
    with Store(db) as store:
        requests = [reset_request() for _ in range(NOTICES)]
        notice_ids = [r.notice_id for r in enqueue(store, settings, requests, earlier())]
        sent = run_sweep(store, settings, earlier, worker="earlier")
        assert sent.submitted == NOTICES
        for message in store.outbox_messages():
            assert store.outbox_set_status(message["message_id"], "failed", earlier.advance(1))
    return notice_ids


def _recover_until_idle(store: Store, settings: Settings, clock: FakeClock) -> Counter[str]:
    """Sweep, moving the clock to the next due time, until no notice is live."""
    totals: Counter[str] = Counter()
    for _ in range(MAX_RECOVERY_SWEEPS):
        totals.update(run_sweep(store, settings, clock, worker="rescuer").to_json())
        due = store.next_due_at()
        if due is None:
            return totals
        clock.now = max(clock.now, due)
        database_follows(store, clock)
    pytest.fail(f"notices still live after {MAX_RECOVERY_SWEEPS} recovery sweeps")


def _assert_no_rolled_back_outcome(store: Store, notice_ids: Sequence[str]) -> None:
    """One outcome event per attempt whose outcome is recorded, and none for any other."""
    attempts = [a for notice_id in notice_ids for a in store.attempt_rows(notice_id)]
    settled = {a["attempt_key"] for a in attempts if a["settled"] > 0}
    outcomes = Counter(e["attempt_key"] for e in _events_of(store, "outcome"))
    assert outcomes == dict.fromkeys(settled, 1)


def _assert_crash_left(
    store: Store, failpoint: str, notice_ids: Sequence[str], shape: Shape, calls: Counter[str]
) -> dict[str, str | None]:
    """What the dead sweep left: leases, and intents whose outcomes were never recorded.

    `calls` are the transport calls the dead sweep made, per attempt key.

    Returns the notices whose submission on the crashed channel was left in doubt, each
    with the id of the outbox message the transport gave it (None: the transport was
    never called). The outbox writes its messages with the round's outcomes, so none of
    them was stored; its ids follow from the attempt key.
    """
    leased = {n for n in notice_ids if _loaded(store, n).lease_owner == "doomed"}
    assert len(leased) == BATCH
    _assert_no_rolled_back_outcome(store, notice_ids)
    channel = shape.crashed
    attempts = {n: {a["channel"]: a for a in store.attempt_rows(n)} for n in notice_ids}
    in_doubt = {n: on[channel] for n, on in attempts.items() if channel in on}
    messages = {m["attempt_key"]: m for m in store.outbox_messages() if m["channel"] == channel}
    if failpoint == "after_claim":
        assert in_doubt == {}
        assert messages == {}
        assert calls == {}
        assert _phases(store, notice_ids) == {shape.phase_before}
        return {}
    # Intents committed (the last state written for these notices); no outcome survived,
    # nor the observation or the fallback claim that came with it.
    assert in_doubt
    assert set(in_doubt) <= leased
    for notice_id, attempt in in_doubt.items():
        assert attempt["attempt_key"] == attempt_key(notice_id, channel)
        assert attempt["state"] == "intent"
        assert (attempt["calls"], attempt["settled"]) == (1, 0)
        assert attempt["message_id"] is None
        assert attempt["status"] is None
    assert _phases(store, list(in_doubt)) == {shape.phase_after}
    assert messages == {}
    if failpoint == "after_intent":
        assert calls == {}
        return dict.fromkeys(in_doubt)
    # The transport took every one of them, once, before the process died; their
    # messages were to be written with the outcomes, which never committed.
    assert calls == {a["attempt_key"]: 1 for a in in_doubt.values()}
    return {n: outbox_message_id(a["attempt_key"]) for n, a in in_doubt.items()}


@pytest.mark.slow
@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_a_sweep_killed_at_a_boundary_loses_nothing_and_sends_once(
    tmp_path: Path, db: str, counted: CountedOutbox, failpoint: str, shape_name: str
) -> None:
    """A sweep SIGKILLed at a boundary: recovery ends every notice, one message per channel."""
    shape = SHAPES[shape_name]
    settings, toml = _settings(shape, counted)
    notice_ids = _enqueue(db, settings, shape)
    config = tmp_path / "resetctl.toml"
    config.write_text(toml, encoding="utf-8")
    before = counted.calls()

    killed = resetctl(
        "sweep", "--batch-size", str(BATCH), "--lease", f"{LEASE:.0f}s",
        "--worker-id", "doomed", "--config", str(config),
        db=db, env={**counted.env(db), "RESETCTL_FAILPOINTS": failpoint},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with Store(db) as store:
        in_doubt = _assert_crash_left(store, failpoint, notice_ids, shape, counted.calls() - before)

        recovery = _recover_until_idle(store, settings, later(store, LEASE + 1))

        assert recovery["lease_recoveries"] == BATCH
        assert recovery["errors"] == 0
        assert store.phase_counts() == {"accepted": NOTICES}
        # An intent the crash cut off before its call counts on its attempt, not in the log.
        cut_off = Counter(
            attempt_key(notice_id, shape.crashed)
            for notice_id, message_id in in_doubt.items()
            if message_id is None
        )
        _assert_sent_once_each(
            store, notice_ids, counted.calls(), shape.channels, never_called=cut_off
        )
        _assert_no_rolled_back_outcome(store, notice_ids)
        for notice_id, message_id in in_doubt.items():
            # Each call left in doubt was made once more under its key; where the transport
            # had taken the message, that call got the very same message back.
            (attempt,) = [a for a in store.attempt_rows(notice_id) if a["channel"] == shape.crashed]
            assert (attempt["state"], attempt["calls"], attempt["settled"]) == ("submitted", 2, 2)
            if message_id is not None:
                assert attempt["message_id"] == message_id
            intents = [
                e["reason"]
                for e in store.event_rows(notice_id)
                if e["kind"] == "intent" and e["attempt_key"] == attempt["attempt_key"]
            ]
            assert intents[1:] == ["recover_by_key"]
