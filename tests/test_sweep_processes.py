"""Real `resetctl` processes on one database file: a call that outlives its lease, the
run-time bound and SIGTERM, and `enqueue --send`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import later, make_settings, reset_request, resetctl, run_sweep

from resetctl.enqueue import enqueue
from resetctl.store import Store

pytestmark = pytest.mark.slow

#: A provider that stalls: its call blocks until the test drops a file, then is refused.
#: It declares a short time-out it does not keep, as a stalled process or a lying plugin
#: would, so the call outlives its lease.
STALL_PLUGIN = """
import os, time
from resetctl.machine import Status
from resetctl.transports.base import (
    PermanentError, ProviderStatus, StatusVocabulary, TransportPlugin,
)

GATE = os.environ["STALL_GATE"]


class Stall:
    name = "stall"
    recovers_by_key = False
    call_timeout = 0.1

    def __init__(self, context):
        pass

    def submit(self, message, attempt_key):
        open(GATE + ".entered", "w").close()
        while not os.path.exists(GATE):
            time.sleep(0.01)
        raise PermanentError("stall: the carrier refused it")

    def status(self, message_id):
        return ProviderStatus(message_id, "pending", Status.PENDING)

    def close(self):
        pass


PLUGIN = TransportPlugin(
    name="stall",
    channels=frozenset({"sms"}),
    create=Stall,
    vocabulary=StatusVocabulary("stall", frozenset({"pending"}), lambda raw: Status.PENDING),
)
"""
STALL_CONFIG = """
[transport]
sms = "stall"

[policy.default]
channels = ["sms", "email"]
lease = "2s"
"""
DEADLINE = 60.0


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Wait for a condition another process brings about (bounded; never a fixed sleep)."""
    give_up = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > give_up:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _install_stall(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "resetctl_stall.py").write_text(textwrap.dedent(STALL_PLUGIN), encoding="utf-8")
    dist = site / "resetctl_stall-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: resetctl-stall\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[resetctl.transports]\nstall = resetctl_stall:PLUGIN\n", encoding="utf-8"
    )
    config = tmp_path / "resetctl.toml"
    config.write_text(STALL_CONFIG, encoding="utf-8")
    return {
        "PYTHONPATH": str(site),
        "STALL_GATE": str(tmp_path / "gate"),
        "RESETCTL_CONFIG": str(config),
    }


def _child_env(db: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env.update({"RESETCTL_DB": str(db), **extra})
    return env


def test_a_call_that_outlives_its_lease_is_a_doubt_the_next_holder_escalates_at_once(
    tmp_path: Path, db_path: Path
) -> None:
    """A's call outlives its lease; B takes over a doubt no key or lookup can resolve and
    sends the email at once (waiting protects nothing); A's late `refused` comes back
    and is stored as evidence: one SMS call, one email, never a second of either."""
    env = _install_stall(tmp_path)
    gate = Path(env["STALL_GATE"])
    with Store(db_path) as store:
        settings = make_settings(policy={"default": {"channels": ["sms", "email"]}})
        (result,) = enqueue(store, settings, [reset_request()], time.time())
    notice_id = result.notice_id

    worker_a = subprocess.Popen(
        [sys.executable, "-m", "resetctl", "sweep", "--worker-id", "A", "--json"],
        env=_child_env(db_path, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(Path(str(gate) + ".entered").exists, "worker A's call to start")

        def lease_lapsed() -> bool:
            with Store(db_path) as store:
                loaded = store.load_notice(notice_id)
            assert loaded is not None
            return loaded.lease_expires_at is not None and loaded.lease_expires_at < time.time()

        _wait_for(lease_lapsed, "worker A's lease to lapse")
        taken = resetctl("sweep", "--worker-id", "B", "--json", db=db_path, env=env)
        assert taken.returncode == 0, taken.stderr
        summary = json.loads(taken.stdout)
        assert (summary["lease_recoveries"], summary["escalated"]) == (1, 1)
        with Store(db_path) as store:
            assert [m["channel"] for m in store.outbox_messages(notice_id)] == ["email"]
        gate.touch()
        _, a_err = worker_a.communicate(timeout=DEADLINE)
        assert worker_a.returncode == 0, a_err
    finally:
        gate.touch()
        if worker_a.poll() is None:
            worker_a.kill()
            worker_a.wait()
        for pipe in (worker_a.stdout, worker_a.stderr):
            if pipe is not None:
                pipe.close()

    following = resetctl("sweep", "--worker-id", "C", "--json", db=db_path, env=env)
    assert following.returncode == 0, following.stderr
    with Store(db_path) as store:
        assert [m["channel"] for m in store.outbox_messages(notice_id)] == ["email"]
        intents = [e for e in store.event_rows(notice_id) if e["kind"] == "intent"]
        assert [(e["attempt_key"].rsplit(":", 2)[1], e["reason"]) for e in intents] == [
            ("sms", "first_submission"),
            ("email", "budget_spent_escalate"),
        ]
        sms = next(a for a in store.attempt_rows(notice_id) if a["channel"] == "sms")
        assert sms["calls"] == 1
        assert sms["state"] == "rejected"  # A's late answer, kept as evidence
        loaded = store.load_notice(notice_id)
        assert loaded is not None
        assert loaded.state.phase == "accepted"


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file with 20,000 due notices, copied for each test that needs one."""
    path = tmp_path_factory.mktemp("backlog") / "backlog.db"
    with Store(path) as store:
        enqueue(store, make_settings(), [reset_request() for _ in range(20_000)], time.time())
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _copy(backlog: Path, to: Path) -> Path:
    to.write_bytes(backlog.read_bytes())
    return to


def _assert_nothing_lost(db: Path, summary: dict[str, float]) -> None:
    with Store(db) as store:
        live = store.live_notices()
        assert all(n.lease_owner is None for n in live)
        messages = store.outbox_messages()
        assert len(messages) == summary["submitted"]
        assert len({m["attempt_key"] for m in messages}) == len(messages)
        # Every notice not sent is live, due and unsent; none was sent twice.
        sent = {m["notice_id"] for m in messages}
        assert not sent & {n.state.notice_id for n in live}
        assert len(live) + len(messages) == 20_000


def test_max_runtime_is_a_bound_on_a_large_backlog(backlog: Path, tmp_path: Path) -> None:
    """`sweep --max-runtime 3s` over 20k due notices returns in time, leases handed back."""
    db = _copy(backlog, tmp_path / "resetctl.db")
    # A millisecond per provider call, so the backlog outlasts the bound on any machine
    # (a quiet one swept all 20k in-process outbox calls inside 3 s).
    config = tmp_path / "resetctl.toml"
    config.write_text('[outbox]\nlatency = "1ms"\n', encoding="utf-8")
    done = resetctl("sweep", "--max-runtime", "3s", "--json", "--config", str(config), db=db)

    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    # The bound is the run time plus the round in flight (generous for a loaded machine).
    assert summary["duration"] < 3 + 2
    assert 0 < summary["submitted"] < 20_000
    _assert_nothing_lost(db, summary)


def test_sigterm_ends_a_sweep_at_once_with_its_summary(backlog: Path, tmp_path: Path) -> None:
    """SIGTERM mid-run: no new claim or call, leases handed back, the summary printed."""
    db = _copy(backlog, tmp_path / "resetctl.db")
    env = _child_env(db, {})
    # Its log (a line per transition) goes to a file: a pipe nobody reads until the end
    # fills after a few hundred lines and stalls the sweep on its next log line.
    log = tmp_path / "sweep.log"
    with log.open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "resetctl", "sweep", "--max-runtime", "10m", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
        try:

            def working() -> bool:
                with Store(db) as store:
                    return len(store.outbox_messages()) > 100

            _wait_for(working, "the sweep to start sending")
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert proc.returncode == 0, log.read_text(encoding="utf-8")[-2000:]
    summary = json.loads(out)
    assert summary["duration"] < 300  # nowhere near the 10-minute run time
    assert summary["submitted"] < 20_000
    _assert_nothing_lost(db, summary)


def test_enqueue_send_submits_before_it_returns(db_path: Path) -> None:
    """`enqueue --send`: each line says submitted, and the message is already out."""
    lines = "\n".join(json.dumps(reset_request()) for _ in range(3))
    done = resetctl("enqueue", "--send", db=db_path, input=lines)

    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["submitted"] for r in results] == [True, True, True]
    with Store(db_path) as store:
        for result in results:
            assert len(store.outbox_messages(result["notice_id"])) == 1


def test_sigkill_with_full_lanes_leaves_at_most_the_calls_and_the_deck_in_doubt(
    backlog: Path, tmp_path: Path
) -> None:
    """A sweep of 16 slots over 20k due notices (5 ms a call, so its lane is full and
    keeps a deck) is killed mid-run: at most 16 calls and the lane's deck (2 for 16
    slots) are left as intents; a later sweep recovers them under their keys, and every
    message is stored once."""
    db = _copy(backlog, tmp_path / "resetctl.db")
    config = tmp_path / "resetctl.toml"
    config.write_text('[outbox]\nlatency = "5ms"\n', encoding="utf-8")
    log = tmp_path / "sweep.log"
    with log.open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "resetctl", "sweep", "--concurrency", "16"],
            env=_child_env(db, {"RESETCTL_CONFIG": str(config)}),
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
        try:

            def working() -> bool:
                with Store(db) as store:
                    return len(store.outbox_messages()) > 500

            _wait_for(working, "the sweep to be well under way")
            proc.kill()
            proc.wait(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    settings = make_settings(outbox={"latency": "5ms"})
    with Store(db) as store:
        (doubts,) = store.conn.execute(
            "SELECT count(*) FROM attempts WHERE state = 'intent'"
        ).fetchone()
        assert 0 < doubts <= 16 + 2
        before = {m["attempt_key"] for m in store.outbox_messages()}
        # Past the dead sweep's leases: their notices are recovered, the rest sent on.
        last = run_sweep(store, settings, later(store, 120), batch_size=500, concurrency=16)
        assert last.lease_recoveries >= doubts
        messages = store.outbox_messages()
        keys = [m["attempt_key"] for m in messages]
        assert len(keys) == len(set(keys)) == 20_000  # each once: none lost, none twice
        assert before <= set(keys)
        (left,) = store.conn.execute(
            "SELECT count(*) FROM attempts WHERE state = 'intent'"
        ).fetchone()
        assert left == 0
