"""Several workers on one database file: races, lease takeovers and crashes mid-notice.

The process tests run the real command line (`python -m resetctl sweep`) against one
SQLite file; crashes are the sweep's own failpoints (SIGKILL at a boundary). Recovery
then runs in-process under a FakeClock set past the dead worker's lease, so no test
waits for a lease to pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep
from fakes import ScriptedTransport

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase, attempt_key
from resetctl.store import LoadedNotice, Store
from resetctl.sweep import LEASE_MARGIN, Sweeper, SweepOptions, SweepSummary
from resetctl.transports import Message, build_transports

#: The email fails at once, so every notice needs its SMS fallback in the same sweep.
FAILING_EMAIL = {"outbox": {"email_status": "failed", "sms_status": "delivered"}}
FAILING_EMAIL_TOML = '[outbox]\nemail_status = "failed"\nsms_status = "delivered"\n'
#: The real command line, as cron runs it.
SWEEP = (sys.executable, "-m", "resetctl", "sweep", "--json")
#: Bound on any wait for a child process (starting up, finishing its sweep).
PROCESS_TIMEOUT = 60.0


@dataclass(frozen=True)
class Finished:
    """A sweep process that has exited."""

    worker: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict[str, Any]:
        """The `--json` summary it printed."""
        parsed: dict[str, Any] = json.loads(self.stdout)
        return parsed


def _child_env(db: Path) -> dict[str, str]:
    """The environment conftest's `resetctl()` gives a child: no stray RESETCTL_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env["RESETCTL_DB"] = str(db)
    return env


def _enqueue_due_now(db: Path, settings: Settings, count: int, **fields: Any) -> list[str]:
    """Enqueue at the real time, so sweep processes (which read the real clock) find them due."""
    with Store(db) as store:
        results = enqueue(
            store, settings, [reset_request(**fields) for _ in range(count)], time.time()
        )
    return [r.notice_id for r in results]


def _write_config(tmp_path: Path) -> Path:
    path = tmp_path / "resetctl.toml"
    path.write_text(FAILING_EMAIL_TOML, encoding="utf-8")
    return path


def _release_together(fifos: Sequence[Path], config_text: str) -> None:
    """Hand every waiting process its config at the same moment.

    Each process blocks opening its config FIFO once its imports are done; opening the
    write end returns only when the reader is there, so after all opens every process is
    at the same line, and closing the writers releases them together.
    """
    writers: list[TextIO] = []
    all_open = threading.Event()

    def open_all() -> None:
        for fifo in fifos:
            writers.append(open(fifo, "w", encoding="utf-8"))  # noqa: SIM115 closed below
        all_open.set()

    threading.Thread(target=open_all, daemon=True).start()
    if not all_open.wait(PROCESS_TIMEOUT):
        pytest.fail("a sweep process never reached its config file")
    for writer in writers:
        writer.write(config_text)
        writer.flush()
    for writer in writers:
        writer.close()


@contextmanager
def _racing_sweeps(tmp_path: Path, db: Path, count: int, *args: str) -> Iterator[list[Finished]]:
    """Start `count` real `resetctl sweep --json` processes on `db`, released together.

    They read FAILING_EMAIL_TOML as their config.

    Yields their results once all have exited; kills any still running on the way out.
    """
    procs: list[tuple[str, subprocess.Popen[str], Path, Path]] = []
    fifos: list[Path] = []
    try:
        for n in range(count):
            worker = f"racer-{n}"
            fifo = tmp_path / f"{worker}.toml"
            os.mkfifo(fifo)
            fifos.append(fifo)
            out, err = tmp_path / f"{worker}.out", tmp_path / f"{worker}.err"
            with out.open("w") as stdout, err.open("w") as stderr:
                proc = subprocess.Popen(
                    [*SWEEP, "--config", str(fifo), "--worker-id", worker, *args],
                    stdout=stdout,
                    stderr=stderr,
                    text=True,
                    env=_child_env(db),
                )
            procs.append((worker, proc, out, err))
        _release_together(fifos, FAILING_EMAIL_TOML)
        finished = []
        for worker, proc, out, err in procs:
            returncode = proc.wait(timeout=PROCESS_TIMEOUT)
            finished.append(Finished(worker, returncode, out.read_text(), err.read_text()))
        yield finished
    finally:
        for _, proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=PROCESS_TIMEOUT)


def _assert_exited_cleanly(finished: Sequence[Finished]) -> None:
    for result in finished:
        assert result.returncode == 0, (result.worker, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        assert "database is locked" not in result.stderr.lower(), result.stderr


def _assert_sent_once_each(
    store: Store, notice_ids: Sequence[str], channels: Sequence[str] = ("email", "sms")
) -> int:
    """Every notice is terminal, unleased, and has one attempt and one message per channel.

    Each attempt's message id is the outbox row stored under the attempt's key, and each
    transport call was begun by a winning intent; a second call on a channel only ever
    recovers an in-doubt one by its key. Returns the number of transport calls begun.
    """
    calls = 0
    messages = store.outbox_messages()
    sent = Counter((m["notice_id"], m["channel"]) for m in messages)
    expected = {(notice_id, channel): 1 for notice_id in notice_ids for channel in channels}
    assert dict(sent) == expected
    by_key = {m["attempt_key"]: m["message_id"] for m in messages}
    assert len(by_key) == len(messages)
    for notice_id in notice_ids:
        attempts = store.attempt_rows(notice_id)
        assert sorted(a["channel"] for a in attempts) == sorted(channels), notice_id
        for attempt in attempts:
            assert attempt["attempt_key"] == attempt_key(notice_id, attempt["channel"])
            assert attempt["message_id"] == by_key[attempt["attempt_key"]]
            intents: list[str] = []
            for e in store.event_rows(notice_id):
                if e["attempt_key"] != attempt["attempt_key"]:
                    continue
                if e["kind"] == "intent":
                    intents.append(e["reason"])
                elif e["kind"] == "declined":
                    # A call not made because its lease ran short undoes its intent.
                    intents.pop()
            assert len(intents) == attempt["calls"], (notice_id, intents)
            # A later intent recovers an in-doubt call by key, or retries a transient one.
            assert set(intents[1:]) <= {"recover_by_key", "retry"}, (notice_id, intents)
            calls += attempt["calls"]
        loaded = _loaded(store, notice_id)
        assert loaded.state.phase.terminal, (notice_id, loaded.state.phase)
        assert loaded.lease_owner is None
        assert store.load_contact(notice_id) is None
    return calls


def _loaded(store: Store, notice_id: str) -> LoadedNotice:
    loaded = store.load_notice(notice_id)
    assert loaded is not None, notice_id
    return loaded


def _phases(store: Store, notice_ids: Sequence[str]) -> set[Phase]:
    return {_loaded(store, n).state.phase for n in notice_ids}


def _events_of(store: Store, kind: str) -> list[dict[str, Any]]:
    return [e for e in store.all_events() if e["kind"] == kind]


@pytest.mark.slow
def test_three_racing_sweeps_send_one_email_and_one_sms_per_notice(
    tmp_path: Path, db_path: Path
) -> None:
    """Three sweeps released together over 150 failing emails send each message exactly once."""
    notice_ids = _enqueue_due_now(db_path, make_settings(**FAILING_EMAIL), 150)

    with _racing_sweeps(tmp_path, db_path, 3, "--batch-size", "5") as finished:
        _assert_exited_cleanly(finished)

    summaries = [f.summary for f in finished]
    assert sum(s["claimed"] for s in summaries) == 150
    assert sum(s["submitted"] for s in summaries) == 300
    assert sum(s["escalated"] for s in summaries) == 150
    assert sum(s["accepted"] for s in summaries) == 150
    assert sum(s["errors"] for s in summaries) == 0
    assert sum(1 for s in summaries if s["claimed"] > 0) >= 2, "the sweeps never overlapped"
    with Store(db_path) as store:
        # Nobody's 60 s lease ran out, so no call was ever in doubt: one call per message.
        assert _assert_sent_once_each(store, notice_ids) == 300
        assert _phases(store, notice_ids) == {Phase.ACCEPTED}
        assert sum(s["lost_races"] for s in summaries) == len(_events_of(store, "lost_race"))


@pytest.mark.slow
def test_racing_sweeps_whose_leases_run_out_mid_batch_never_send_twice(
    tmp_path: Path, db_path: Path
) -> None:
    """With leases that lapse mid-batch, workers take over each other's notices yet send once."""
    notice_ids = _enqueue_due_now(db_path, make_settings(**FAILING_EMAIL), 150, ttl="1h")
    # A claim starts a transport call only while a quarter of its lease (at most
    # LEASE_MARGIN) is left, so a 40 ms lease gives each claim of 50 about 30 ms of work:
    # the rest of every batch lapses and is claimed again, by this sweep or another,
    # often between a notice's email and its SMS.
    assert LEASE_MARGIN > 0.04
    lease = "40ms"

    with _racing_sweeps(tmp_path, db_path, 3, "--batch-size", "50", "--lease", lease) as finished:
        _assert_exited_cleanly(finished)

    summaries = [f.summary for f in finished]
    assert sum(s["claimed"] for s in summaries) > 150, "no lease ran out mid-batch"
    with Store(db_path) as store:
        # Anything a lapsed lease left behind is finished by one more sweep, long before
        # the hour-long links expire.
        last = run_sweep(store, make_settings(**FAILING_EMAIL), FakeClock(time.time() + 120))
        calls = _assert_sent_once_each(store, notice_ids)
        # Every call an attempt counts was made: a call declined because its lease ran
        # short before it started undid its intent and counts nowhere.
        assert sum(s["submitted"] for s in summaries) + last.submitted == calls
        assert _phases(store, notice_ids) == {Phase.ACCEPTED}
        lost_races = sum(s["lost_races"] for s in summaries) + last.lost_races
        assert lost_races == len(_events_of(store, "lost_race"))


def test_a_worker_whose_lease_lapsed_mid_call_loses_the_race_and_sends_nothing_more(
    db_path: Path, clock: FakeClock
) -> None:
    """A worker whose lease lapsed during its email call loses the write; the SMS goes once."""
    settings = make_settings(**FAILING_EMAIL)
    with Store(db_path) as slow_store, Store(db_path) as quick_store:
        (notice_id,) = [
            r.notice_id for r in enqueue(slow_store, settings, [reset_request()], clock())
        ]
        quick_summaries: list[SweepSummary] = []

        def lapse_and_take_over(message: Message, key: str) -> None:
            # While the slow worker is inside its email call, its 60 s lease passes and
            # another worker claims the notice and finishes it.
            if key == attempt_key(notice_id, "email") and not quick_summaries:
                clock.advance(61)
                quick_summaries.append(run_sweep(quick_store, settings, clock, worker="quick"))

        transports = build_transports(settings, slow_store, clock)
        slow_email = ScriptedTransport(inner=transports["email"], on_submit=lapse_and_take_over)
        slow_sms = ScriptedTransport(inner=transports["sms"])
        scripted: dict[str, Any] = {"email": slow_email, "sms": slow_sms}
        slow = Sweeper(slow_store, settings, scripted, clock=clock).run(
            SweepOptions("slow", batch_size=10, lease=60.0)
        )

        assert slow.lost_races == 1
        assert slow_sms.submits == []
        assert quick_summaries[0].lease_recoveries == 1
        _assert_sent_once_each(slow_store, [notice_id])
        assert _phases(slow_store, [notice_id]) == {Phase.ACCEPTED}
        lost = _events_of(slow_store, "lost_race")
        assert [(e["worker"], e["attempt_key"]) for e in lost] == [
            ("slow", attempt_key(notice_id, "email"))
        ]


@pytest.mark.slow
def test_sigkill_after_the_claim_leaves_leased_notices_that_a_later_sweep_recovers(
    tmp_path: Path, db_path: Path
) -> None:
    """A sweep killed right after its claim leaves leases only; recovery sends each once."""
    settings = make_settings(**FAILING_EMAIL)
    notice_ids = _enqueue_due_now(db_path, settings, 8)
    config = _write_config(tmp_path)

    killed = resetctl(
        "sweep", "--batch-size", "5", "--lease", "30s", "--worker-id", "doomed",
        "--config", str(config), db=db_path, env={"RESETCTL_FAILPOINTS": "after_claim"},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL
    with Store(db_path) as store:
        leased = [n for n in notice_ids if _loaded(store, n).lease_owner == "doomed"]
        assert len(leased) == 5
        assert all(store.attempt_rows(n) == [] for n in notice_ids)
        assert store.outbox_messages() == []

        summary = run_sweep(store, settings, FakeClock(time.time() + 60), worker="rescuer")

        assert summary.lease_recoveries == 5
        _assert_sent_once_each(store, notice_ids)
        recovered = _events_of(store, "lease_recovered")
        assert sorted(e["notice_id"] for e in recovered) == sorted(leased)
        assert {e["worker"] for e in recovered} == {"rescuer"}


@pytest.mark.slow
def test_sigkill_after_the_intent_commit_is_recovered_without_a_duplicate(
    tmp_path: Path, db_path: Path
) -> None:
    """A sweep killed between its intent commit and the call: recovery sends it once, loses none."""
    settings = make_settings(**FAILING_EMAIL)
    notice_ids = _enqueue_due_now(db_path, settings, 5)
    config = _write_config(tmp_path)

    killed = resetctl(
        "sweep", "--batch-size", "5", "--lease", "30s", "--config", str(config),
        db=db_path, env={"RESETCTL_FAILPOINTS": "after_intent"},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL
    with Store(db_path) as store:
        # The batch's intents are committed together before any call.
        in_doubt = [a for n in notice_ids for a in store.attempt_rows(n)]
        assert len(in_doubt) == 5
        for attempt in in_doubt:
            assert (attempt["channel"], attempt["state"]) == ("email", "intent")
            assert (attempt["calls"], attempt["settled"]) == (1, 0)
            assert attempt["message_id"] is None
        assert store.outbox_messages() == []

        run_sweep(store, settings, FakeClock(time.time() + 60), worker="rescuer")

        _assert_sent_once_each(store, notice_ids)
        assert _phases(store, notice_ids) == {Phase.ACCEPTED}


@pytest.mark.slow
def test_sigkill_after_the_transport_accepted_resubmits_under_the_same_key(
    tmp_path: Path, db_path: Path
) -> None:
    """A sweep killed after the outbox took the email: recovery gets the same message back."""
    settings = make_settings(**FAILING_EMAIL)
    notice_ids = _enqueue_due_now(db_path, settings, 5)
    config = _write_config(tmp_path)

    killed = resetctl(
        "sweep", "--batch-size", "5", "--lease", "30s", "--config", str(config),
        db=db_path, env={"RESETCTL_FAILPOINTS": "after_submit"},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL
    with Store(db_path) as store:
        # Every email of the batch reached the outbox; no outcome was recorded.
        stored = store.outbox_messages()
        assert len(stored) == 5
        for message in stored:
            (attempt,) = store.attempt_rows(message["notice_id"])
            assert attempt["attempt_key"] == message["attempt_key"]
            assert (attempt["state"], attempt["calls"], attempt["settled"]) == ("intent", 1, 0)
            assert attempt["message_id"] is None

        run_sweep(store, settings, FakeClock(time.time() + 60), worker="rescuer")

        _assert_sent_once_each(store, notice_ids)
        for message in stored:
            (email,) = [
                a for a in store.attempt_rows(message["notice_id"]) if a["channel"] == "email"
            ]
            assert email["message_id"] == message["message_id"]
            assert email["state"] == "submitted"
        keys = {m["attempt_key"] for m in stored}
        recovered_intents = [
            e
            for e in _events_of(store, "intent")
            if e["attempt_key"] in keys and e["worker"] == "rescuer"
        ]
        assert [e["reason"] for e in recovered_intents] == ["recover_by_key"] * 5


class _ProcessDied(BaseException):
    """Stands in for the worker process dying mid-call (not an error a sweep may catch)."""


def test_a_non_recoverable_email_in_doubt_is_never_resent_and_escalates_after_its_budget(
    db_path: Path, clock: FakeClock
) -> None:
    """A keyless transport's email left in doubt by a crash is never resent; one SMS follows."""
    settings = make_settings(**FAILING_EMAIL)

    def die(message: Message, key: str) -> None:
        raise _ProcessDied

    with Store(db_path) as store:
        (notice_id,) = [r.notice_id for r in enqueue(store, settings, [reset_request()], clock())]
        email_key = attempt_key(notice_id, "email")
        outbox = build_transports(settings, store, clock)
        dying = ScriptedTransport(inner=outbox["email"], recovers_by_key=False, on_submit=die)
        crashing: dict[str, Any] = {"email": dying, "sms": outbox["sms"]}
        crashed_at = clock()
        with pytest.raises(_ProcessDied):
            run_sweep(store, settings, clock, crashing, worker="dead", lease=60.0)
        assert dying.submits == [email_key]

        email = ScriptedTransport(inner=outbox["email"], recovers_by_key=False)
        sms = ScriptedTransport(inner=outbox["sms"])
        transports: dict[str, Any] = {"email": email, "sms": sms}
        clock.now = crashed_at + 61  # past the dead worker's lease
        recovery = run_sweep(store, settings, clock, transports, worker="rescuer")
        assert recovery.lease_recoveries == 1
        # The email's last poll would have come 105 s after the call: until then, wait.
        clock.now = crashed_at + 104
        assert run_sweep(store, settings, clock, transports).claimed == 0
        clock.now = crashed_at + 105
        escalation = run_sweep(store, settings, clock, transports)
        clock.now = crashed_at + 400
        run_sweep(store, settings, clock, transports)

        assert email.submits == []
        assert sms.submits == [attempt_key(notice_id, "sms")]
        assert escalation.escalated == 1
        assert [m["channel"] for m in store.outbox_messages()] == ["sms"]
        loaded = _loaded(store, notice_id)
        assert loaded.state.phase is Phase.ACCEPTED
        in_doubt = loaded.state.attempt("email")
        assert in_doubt is not None
        assert (in_doubt.state, in_doubt.calls, in_doubt.settled) == ("intent", 1, 0)
        assert not in_doubt.recoverable
        reasons = [(e["kind"], e["reason"]) for e in store.event_rows(notice_id)]
        assert ("tick", "await_budget") in reasons
        assert ("intent", "budget_spent_escalate") in reasons
