"""Several workers on one database file: races, lease takeovers and crashes mid-notice.

The process tests run the real command line (`python -m resetctl sweep`) against one
SQLite file; crashes are the sweep's own failpoints (SIGKILL at a boundary). Recovery
then runs in-process under a FakeClock set past the dead worker's lease, so no test
waits for a lease to pass.

Transport calls are counted where they are made, not inferred from the outbox: the
outbox keeps one message per attempt key, so a second call under the same key would
leave no trace there. The process tests send through ``countbox`` (soakbox.py: the
outbox plus a call log every process appends to); the in-process ones through
ScriptedTransport, which records each submit. What is asserted holds however slow the
machine is: a lapsed lease may cause a recovery call, never an unexplained one.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import pytest
import soakbox
from conftest import FakeClock, later, make_settings, reset_request, resetctl, run_sweep
from fakes import ScriptedTransport, calls_per_key

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase, Status, attempt_key
from resetctl.observe import CallbackResult, record_callback
from resetctl.store import LoadedNotice, Store, outbox_message_id
from resetctl.sweep import LEASE_MARGIN, Sweeper, SweepSummary
from resetctl.transports import Message, Transport, build_transports
from resetctl.work import SweepOptions

#: The email fails at once, so every notice needs its SMS fallback in the same sweep.
FAILING_EMAIL = {"outbox": {"email_status": "failed", "sms_status": "delivered"}}
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


def _child_env(db: Path | str) -> dict[str, str]:
    """The environment conftest's `resetctl()` gives a child: no stray RESETCTL_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env["RESETCTL_DB"] = str(db)
    if "RESETCTL_HASH_KEY" in os.environ:  # PostgreSQL's: a server keeps no key beside it
        env["RESETCTL_HASH_KEY"] = os.environ["RESETCTL_HASH_KEY"]
    return env


@dataclass(frozen=True)
class CountedOutbox:
    """FAILING_EMAIL's outbox as the plugin ``countbox``, which logs every call to `log`.

    `site` holds the plugin package; children find it on PYTHONPATH, this process on
    sys.path.
    """

    site: Path
    log: Path
    #: seconds each submission takes (the child processes' provider)
    latency: float = 0.0

    @property
    def settings(self) -> Settings:
        """Settings for an in-process sweep (its calls go to the same log)."""
        return make_settings(
            transport={"email": "countbox", "sms": "countbox"},
            countbox={**FAILING_EMAIL["outbox"], "call_log": str(self.log)},
        )

    @property
    def toml(self) -> str:
        """The same settings as a config file for a child process."""
        return (
            '[transport]\nemail = "countbox"\nsms = "countbox"\n'
            '[countbox]\nemail_status = "failed"\nsms_status = "delivered"\n'
            f"call_log = {json.dumps(str(self.log))}\nlatency = {self.latency!r}\n"
        )

    def write_config(self, tmp_path: Path) -> Path:
        path = tmp_path / "resetctl.toml"
        path.write_text(self.toml, encoding="utf-8")
        return path

    def env(self, db: Path | str) -> dict[str, str]:
        """A child's environment: conftest's, with the plugin importable."""
        env = _child_env(db)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.site), env.get("PYTHONPATH")]))
        return env

    def calls(self) -> Counter[str]:
        """Transport calls per attempt key, by every process so far."""
        return Counter(call.attempt_key for call in soakbox.read_calls(self.log))


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CountedOutbox:
    """The counted outbox, installed for child processes and for this one."""
    site = tmp_path / "site"
    soakbox.install(site)
    monkeypatch.syspath_prepend(str(site))
    return CountedOutbox(site, tmp_path / "calls.log")


def _enqueue_due_now(db: Path | str, settings: Settings, count: int, **fields: Any) -> list[str]:
    """Enqueue at the real time, so sweep processes (which read the real clock) find them due."""
    with Store(db) as store:
        results = enqueue(
            store, settings, [reset_request(**fields) for _ in range(count)], time.time()
        )
    return [r.notice_id for r in results]


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
def _racing_sweeps(
    tmp_path: Path, db: Path | str, counted: CountedOutbox, count: int, *args: str
) -> Iterator[list[Finished]]:
    """Start `count` real `resetctl sweep --json` processes on `db`, released together.

    They read the counted outbox's config.

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
                    env=counted.env(db),
                )
            procs.append((worker, proc, out, err))
        _release_together(fifos, counted.toml)
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
    store: Store,
    notice_ids: Sequence[str],
    calls: Counter[str],
    channels: Sequence[str] = ("email", "sms"),
    *,
    never_called: Counter[str] | None = None,
) -> int:
    """Every notice is terminal, unleased, and has one attempt and one message per channel.

    Each attempt's message id is the outbox row stored under the attempt's key. `calls`
    are the transport calls made, per key. Each was begun by a winning intent, so an
    attempt counts exactly the calls made under its key (less `never_called`: intents a
    crash cut off before their call). A second call on a key only ever recovers an
    in-doubt one: it follows a recovery intent, and a lease taken over from a worker
    that never released it (whose call was in doubt). No call was made under a key that
    has no attempt. Returns the number of transport calls made.
    """
    never_called = never_called or Counter()
    messages = store.outbox_messages()
    sent = Counter((m["notice_id"], m["channel"]) for m in messages)
    expected = {(notice_id, channel): 1 for notice_id in notice_ids for channel in channels}
    assert dict(sent) == expected
    by_key = {m["attempt_key"]: m["message_id"] for m in messages}
    assert len(by_key) == len(messages)
    attempt_keys = set()
    for notice_id in notice_ids:
        attempts = store.attempt_rows(notice_id)
        assert sorted(a["channel"] for a in attempts) == sorted(channels), notice_id
        events = store.event_rows(notice_id)
        takeovers = sum(1 for e in events if e["kind"] == "lease_recovered")
        for attempt in attempts:
            key = attempt["attempt_key"]
            attempt_keys.add(key)
            assert key == attempt_key(notice_id, attempt["channel"])
            assert attempt["message_id"] == by_key[key]
            assert calls[key] == attempt["calls"] - never_called[key], key
            # Counting intents against calls would have to tell a declined call's lost
            # race from an outcome's; the call log makes that unnecessary. What matters
            # is that every extra call came from a recovery (or a retry) of the key.
            intents = [
                e["reason"] for e in events if e["kind"] == "intent" and e["attempt_key"] == key
            ]
            recoveries = sum(1 for r in intents if r in ("recover_by_key", "retry"))
            extra = calls[key] - 1
            assert extra <= recoveries, (key, calls[key], intents)
            assert extra <= takeovers, (key, calls[key], takeovers)
        loaded = _loaded(store, notice_id)
        assert loaded.state.phase.terminal, (notice_id, loaded.state.phase)
        assert loaded.lease_owner is None
        assert store.load_contact(notice_id) is None
    assert set(calls) <= attempt_keys, set(calls) - attempt_keys
    return sum(calls.values())


def _recorded(transports: dict[str, Transport]) -> dict[str, ScriptedTransport]:
    """Each transport wrapped so that its submit calls are recorded."""
    return {channel: ScriptedTransport(inner=t) for channel, t in transports.items()}


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
    tmp_path: Path, db: str, counted: CountedOutbox
) -> None:
    """Three sweeps released together over 150 failing emails send each message exactly once."""
    notice_ids = _enqueue_due_now(db, counted.settings, 150)
    # 2 ms per call, so one sweep cannot finish all 300 calls before the others start,
    # however fast the machine (the premise that they overlap is asserted below).
    counted = replace(counted, latency=0.002)

    with _racing_sweeps(tmp_path, db, counted, 3, "--batch-size", "5") as finished:
        _assert_exited_cleanly(finished)

    summaries = [f.summary for f in finished]
    assert sum(s["claimed"] for s in summaries) >= 150
    assert sum(s["escalated"] for s in summaries) == 150
    assert sum(s["accepted"] for s in summaries) == 150
    assert sum(s["errors"] for s in summaries) == 0
    assert sum(1 for s in summaries if s["claimed"] > 0) >= 2, "the sweeps never overlapped"
    calls = counted.calls()
    with Store(db) as store:
        made = _assert_sent_once_each(store, notice_ids, calls)
        assert sum(s["submitted"] for s in summaries) == made
        assert _phases(store, notice_ids) == {Phase.ACCEPTED}
        assert sum(s["lost_races"] for s in summaries) == len(_events_of(store, "lost_race"))
    if sum(s["lease_recoveries"] for s in summaries) == 0:
        # No 60 s lease ran out, so no call was ever in doubt: one call per attempt key.
        # (On a machine stalled for a minute a lease may lapse and its notice's call be
        # recovered by key; the rules checked above hold either way.)
        assert made == 300
        assert set(calls.values()) == {1}, [k for k, n in calls.items() if n > 1]


@pytest.mark.slow
def test_racing_sweeps_whose_leases_run_out_mid_batch_never_send_twice(
    tmp_path: Path, db: str, counted: CountedOutbox
) -> None:
    """With leases that lapse mid-batch, workers take over each other's notices yet send once."""
    notice_ids = _enqueue_due_now(db, counted.settings, 150, ttl="1h")
    # A claim starts a transport call only while its lease covers the call plus a quarter
    # of the lease (at most LEASE_MARGIN), so a 40 ms lease gives each claim of 50 about
    # 30 ms of work: with 2 ms per call (however fast the machine), the rest of every
    # batch lapses and is claimed again, by this sweep or another, often between a
    # notice's email and its SMS.
    assert LEASE_MARGIN > 0.04
    lease = "40ms"
    counted = replace(counted, latency=0.002)

    with _racing_sweeps(
        tmp_path, db, counted, 3, "--batch-size", "50", "--lease", lease
    ) as finished:
        _assert_exited_cleanly(finished)

    summaries = [f.summary for f in finished]
    assert sum(s["claimed"] for s in summaries) > 150, "no lease ran out mid-batch"
    with Store(db) as store:
        # Anything a lapsed lease left behind is finished by one more sweep, long before
        # the hour-long links expire.
        last = run_sweep(store, counted.settings, later(store, 120))
        calls = _assert_sent_once_each(store, notice_ids, counted.calls())
        # Every call made was counted by the sweep that made it: a call declined because
        # its lease ran short before it started undid its intent and was never made.
        assert sum(s["submitted"] for s in summaries) + last.submitted == calls
        assert _phases(store, notice_ids) == {Phase.ACCEPTED}
        lost_races = sum(s["lost_races"] for s in summaries) + last.lost_races
        assert lost_races == len(_events_of(store, "lost_race"))


def test_a_worker_whose_lease_lapsed_mid_call_loses_the_race_and_sends_nothing_more(
    db: str, clock: FakeClock
) -> None:
    """A worker whose lease lapsed during its email call loses the write; the SMS goes once."""
    settings = make_settings(**FAILING_EMAIL)
    with Store(db) as slow_store, Store(db) as quick_store:
        (notice_id,) = [
            r.notice_id for r in enqueue(slow_store, settings, [reset_request()], clock())
        ]
        quick_summaries: list[SweepSummary] = []
        quick = _recorded(build_transports(settings, quick_store, clock))

        def lapse_and_take_over(message: Message, key: str) -> None:
            # While the slow worker is inside its email call, its 60 s lease passes and
            # another worker claims the notice and finishes it.
            if key == attempt_key(notice_id, "email") and not quick_summaries:
                clock.advance(61)
                summary = run_sweep(
                    quick_store, settings, clock, dict[str, Any](quick), worker="quick"
                )
                quick_summaries.append(summary)

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
        calls = calls_per_key(slow_email, slow_sms, *quick.values())
        # The email: the slow worker's call, and the quick worker's recovery by key.
        assert calls == {attempt_key(notice_id, "email"): 2, attempt_key(notice_id, "sms"): 1}
        _assert_sent_once_each(slow_store, [notice_id], calls)
        assert _phases(slow_store, [notice_id]) == {Phase.ACCEPTED}
        lost = _events_of(slow_store, "lost_race")
        assert [(e["worker"], e["attempt_key"]) for e in lost] == [
            ("slow", attempt_key(notice_id, "email"))
        ]


@pytest.mark.parametrize("sms_recovers_by_key", [True, False], ids=["keyed-sms", "keyless-sms"])
def test_a_fallback_whose_claim_loses_to_a_late_success_is_never_sent(
    db: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, sms_recovers_by_key: bool
) -> None:
    """A receipt landing between the fallback decision and its claim: the SMS is never called."""
    settings = make_settings(outbox={"email_status": "pending", "sms_status": "delivered"})
    with Store(db) as store, Store(db) as callbacks:
        (notice_id,) = [r.notice_id for r in enqueue(store, settings, [reset_request()], clock())]
        transports = _recorded(build_transports(settings, store, clock))
        # Keyed and keyless transports take different paths from intent to call.
        transports["sms"].recovers_by_key = sms_recovers_by_key
        assert run_sweep(store, settings, clock, dict[str, Any](transports)).submitted == 1
        email = _loaded(store, notice_id).state.attempt("email")
        assert email is not None
        assert email.message_id is not None
        message_id = email.message_id
        receipts: list[CallbackResult] = []
        load_contacts = store.load_contacts

        def receipt_then_load(notice_ids: Sequence[str]) -> dict[str, Any]:
            # The sweep has decided to claim the SMS fallback and reads the contact to
            # render it; the email's receipt arrives before the claim (its intent) commits.
            if not receipts:
                receipts.append(
                    record_callback(
                        callbacks, "outbox", message_id, "accepted", Status.ACCEPTED, clock()
                    )
                )
            return dict(load_contacts(notice_ids))

        clock.advance(105)  # the email's last poll: still pending, so the policy escalates
        monkeypatch.setattr(store, "load_contacts", receipt_then_load)
        summary = run_sweep(store, settings, clock, dict[str, Any](transports))

        assert receipts, "the sweep no longer reads contacts between deciding and claiming"
        assert receipts[0].new_phase == Phase.ACCEPTED
        assert summary.lost_races == 1
        assert transports["sms"].submits == []
        calls = calls_per_key(*transports.values())
        assert calls == {attempt_key(notice_id, "email"): 1}
        _assert_sent_once_each(store, [notice_id], calls, channels=("email",))
        assert _phases(store, [notice_id]) == {Phase.ACCEPTED}


@pytest.mark.slow
def test_sigkill_after_the_claim_leaves_leased_notices_that_a_later_sweep_recovers(
    tmp_path: Path, db: str, counted: CountedOutbox
) -> None:
    """A sweep killed right after its claim leaves leases only; recovery sends each once."""
    notice_ids = _enqueue_due_now(db, counted.settings, 8)
    config = counted.write_config(tmp_path)

    killed = resetctl(
        "sweep", "--batch-size", "5", "--lease", "30s", "--worker-id", "doomed",
        "--config", str(config), db=db,
        env={**counted.env(db), "RESETCTL_FAILPOINTS": "after_claim"},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL
    assert counted.calls() == {}
    with Store(db) as store:
        leased = [n for n in notice_ids if _loaded(store, n).lease_owner == "doomed"]
        assert len(leased) == 5
        assert all(store.attempt_rows(n) == [] for n in notice_ids)
        assert store.outbox_messages() == []

        summary = run_sweep(store, counted.settings, later(store, 60), worker="rescuer")

        assert summary.lease_recoveries == 5
        calls = counted.calls()
        assert set(calls.values()) == {1}
        _assert_sent_once_each(store, notice_ids, calls)
        recovered = _events_of(store, "lease_recovered")
        assert sorted(e["notice_id"] for e in recovered) == sorted(leased)
        assert {e["worker"] for e in recovered} == {"rescuer"}


@pytest.mark.slow
def test_sigkill_after_the_intent_commit_is_recovered_without_a_duplicate(
    tmp_path: Path, db: str, counted: CountedOutbox
) -> None:
    """A sweep killed between its intent commit and the call: recovery sends it once, loses none."""
    notice_ids = _enqueue_due_now(db, counted.settings, 5)
    config = counted.write_config(tmp_path)

    killed = resetctl(
        "sweep", "--batch-size", "5", "--lease", "30s", "--config", str(config),
        db=db, env={**counted.env(db), "RESETCTL_FAILPOINTS": "after_intent"},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL
    assert counted.calls() == {}, "the killed sweep made a call after its failpoint"
    with Store(db) as store:
        # The batch's intents are committed together before any call.
        in_doubt = [a for n in notice_ids for a in store.attempt_rows(n)]
        assert len(in_doubt) == 5
        for attempt in in_doubt:
            assert (attempt["channel"], attempt["state"]) == ("email", "intent")
            assert (attempt["calls"], attempt["settled"]) == (1, 0)
            assert attempt["message_id"] is None
        assert store.outbox_messages() == []

        run_sweep(store, counted.settings, later(store, 60), worker="rescuer")

        # Each email was called once, by the rescuer; its attempt also counts the intent
        # the dead sweep committed but never acted on.
        calls = counted.calls()
        assert set(calls.values()) == {1}
        cut_off = Counter(a["attempt_key"] for a in in_doubt)
        _assert_sent_once_each(store, notice_ids, calls, never_called=cut_off)
        assert _phases(store, notice_ids) == {Phase.ACCEPTED}


@pytest.mark.slow
def test_sigkill_after_the_transport_accepted_resubmits_under_the_same_key(
    tmp_path: Path, db: str, counted: CountedOutbox
) -> None:
    """A sweep killed after the outbox took the email: recovery gets the same message back.

    The embedded outbox writes its messages in the round's outcome transaction, so the
    kill loses them with the outcomes; the message id follows from the attempt key, so
    the resubmission under the same key is the very message the first call returned.
    """
    notice_ids = _enqueue_due_now(db, counted.settings, 5)
    config = counted.write_config(tmp_path)

    killed = resetctl(
        "sweep", "--batch-size", "5", "--lease", "30s", "--config", str(config),
        db=db, env={**counted.env(db), "RESETCTL_FAILPOINTS": "after_submit"},
    )  # fmt: skip

    assert killed.returncode == -signal.SIGKILL
    keys = {attempt_key(n, "email") for n in notice_ids}
    with Store(db) as store:
        # Every email of the batch was handed to the outbox; nothing after was committed.
        assert counted.calls() == dict.fromkeys(keys, 1)
        assert store.outbox_messages() == []
        for notice_id in notice_ids:
            (attempt,) = store.attempt_rows(notice_id)
            assert (attempt["state"], attempt["calls"], attempt["settled"]) == ("intent", 1, 0)
            assert attempt["message_id"] is None

        run_sweep(store, counted.settings, later(store, 60), worker="rescuer")

        # The emails were called twice each, under one key: the outbox, like a provider
        # that dedupes by key, returned the first message; each SMS was called once.
        calls = counted.calls()
        assert sorted(calls.values()) == [1] * 5 + [2] * 5
        assert {key for key, n in calls.items() if n == 2} == keys
        _assert_sent_once_each(store, notice_ids, calls)
        for notice_id in notice_ids:
            (email,) = [a for a in store.attempt_rows(notice_id) if a["channel"] == "email"]
            assert email["message_id"] == outbox_message_id(email["attempt_key"])
            assert email["state"] == "submitted"
        recovered_intents = [
            e
            for e in _events_of(store, "intent")
            if e["attempt_key"] in keys and e["worker"] == "rescuer"
        ]
        assert [e["reason"] for e in recovered_intents] == ["recover_by_key"] * 5


class _ProcessDied(BaseException):
    """Stands in for the worker process dying mid-call (not an error a sweep may catch)."""


def test_a_non_recoverable_email_in_doubt_is_never_resent_and_escalates_at_once(
    db: str, clock: FakeClock
) -> None:
    """A keyless transport's email left in doubt by a crash is never resent; one SMS follows."""
    settings = make_settings(**FAILING_EMAIL)

    def die(message: Message, key: str) -> None:
        raise _ProcessDied

    with Store(db) as store:
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
        # Nothing can resolve an SMTP-like doubt: no key, no lookup, no status without
        # a message id. Waiting protects nothing, so the recovery escalates at once.
        escalation = run_sweep(store, settings, clock, transports, worker="rescuer")
        assert escalation.lease_recoveries == 1
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
        assert ("intent", "budget_spent_escalate") in reasons


#: A process that cancels the given notices one by one (reason completed): it says
#: "ready" once its database is open, and starts when a sweep made its first call.
_CANCELLER = """
import json, os, random, sys, time
import resetctl
ids, log = json.loads(sys.argv[1]), sys.argv[2]
random.Random(7).shuffle(ids)
with resetctl.open(os.environ["RESETCTL_DB"], create=False) as handle:
    print("ready", flush=True)
    while not os.path.exists(log):
        time.sleep(0.001)
    for notice_id in ids:  # about as fast as the sweeps escalate, so both win some
        handle.cancel(notice_id, reason="completed")
        time.sleep(0.005)
"""


@pytest.mark.slow
def test_a_cancel_racing_sweeps_about_to_escalate_sends_nothing_after_it(
    tmp_path: Path, db: str, counted: CountedOutbox
) -> None:
    """Three sweeps escalate 90 notices (every email fails at once) while another process
    cancels them: a notice's SMS is claimed before its cancel or never; no intent follows
    a cancel, no message is sent twice, every notice ends."""
    notice_ids = _enqueue_due_now(db, counted.settings, 90)
    # 10 ms per call: the sweeps' 180 calls overlap the canceller's 90 cancels.
    counted = replace(counted, latency=0.01)
    canceller = subprocess.Popen(
        [sys.executable, "-c", _CANCELLER, json.dumps(notice_ids), str(counted.log)],
        env=counted.env(db),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert canceller.stdout is not None
        assert canceller.stdout.readline() == "ready\n", canceller.stderr
        with _racing_sweeps(tmp_path, db, counted, 3, "--batch-size", "10") as finished:
            _assert_exited_cleanly(finished)
        _, errors = canceller.communicate(timeout=PROCESS_TIMEOUT)
    finally:
        if canceller.poll() is None:
            canceller.kill()
    assert canceller.returncode == 0, errors
    calls = counted.calls()
    outcomes: Counter[str] = Counter()
    with Store(db) as store:
        messages = Counter((m["notice_id"], m["channel"]) for m in store.outbox_messages())
        for notice_id in notice_ids:
            events = store.event_rows(notice_id)
            cancels = [i for i, e in enumerate(events) if e["kind"] == "cancel"]
            intents = [i for i, e in enumerate(events) if e["kind"] == "intent"]
            assert len(cancels) <= 1, events
            if cancels:
                assert all(i < cancels[0] for i in intents), events
            attempts = store.attempt_rows(notice_id)
            for attempt in attempts:
                assert messages[(notice_id, attempt["channel"])] == 1, notice_id
                assert calls[attempt["attempt_key"]] == attempt["calls"], attempt
            assert sum(n for (n_id, _), n in messages.items() if n_id == notice_id) == len(attempts)
            loaded = _loaded(store, notice_id)
            assert loaded.state.phase in (Phase.CANCELLED, Phase.ACCEPTED), loaded.state.phase
            assert store.load_contact(notice_id) is None
            sent = "+".join(sorted(a["channel"] for a in attempts)) or "nothing"
            outcomes[f"{loaded.state.phase.value}:{sent}"] += 1
    assert set(calls) <= {attempt_key(n, c) for n in notice_ids for c in ("email", "sms")}
    # What the race did, for the reader (it differs run to run): e.g.
    # {'cancelled:nothing': 41, 'accepted:email+sms': 30, 'cancelled:email': 12, ...}
    print(dict(outcomes))
