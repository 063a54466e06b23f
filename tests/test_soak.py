"""Soak: four `resetctl sweep --max-runtime` processes on one file under accelerated time.

Thousands of notices arrive over two simulated minutes; their recipients' fates (see
soakbox.py: accepted, failed, never answered, late) are fixed by a hash, so the outcome
of every notice is known in advance. The sweeps share one clock running
RESETCTL_TIME_SCALE times faster than real time, so the 10-minute links, the poll
schedules and the leases play out in about a minute (12x for 10,000 notices).

What the test asserts holds however slow the machine is: nothing is lost (every notice
ends, unleased and scrubbed, once the sweeps and one more cron run are done), no
transport call is unexplained (each attempt counts exactly the calls its key got, by
soakbox's call log, and an extra call follows a lease takeover), and every ending agrees
with what the transport reported. How well the sweeps kept to the schedule (endings as
predicted, waits, endings after expiry) depends on the CPU, so it is reported, not
asserted: ``python bench/soak.py`` runs this soak and prints those figures.

RESETCTL_SOAK_NOTICES sets the size (default 10,000); RESETCTL_SOAK_SCALE the speed-up;
RESETCTL_SOAK_REPORT a file to write the report to (JSON). A larger soak by hand, e.g.
``RESETCTL_SOAK_NOTICES=50000 pytest tests/test_soak.py -s``, picks a slower clock by
itself so the sweeps keep up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import soakbox
from conftest import FakeClock, make_settings, reset_request, run_sweep
from test_races import Finished, _assert_exited_cleanly, _child_env

from resetctl.clocks import clock_from_env
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase, Status
from resetctl.store import LoadedNotice, Store

NOTICES = int(os.environ.get("RESETCTL_SOAK_NOTICES", "10000"))
#: How much faster than real time the sweeps' shared clock runs. Four sweeps on two
#: cores keep to the schedule for about 1,000 notice arrivals per real second (10,000
#: over two simulated minutes at 12x); larger soaks get a slower clock to match.
SCALE = float(os.environ.get("RESETCTL_SOAK_SCALE") or max(1.5, min(12.0, 120_000 / NOTICES)))
WORKERS = 4
#: Simulated seconds over which the notices arrive, in evenly spaced groups.
ARRIVALS = 120.0
ARRIVAL_GROUPS = 60
TTL = 600.0
#: The sweeps run until every link has expired, plus this much simulated time.
OVERRUN = 10.0
#: Simulated seconds each sweep process runs for.
RUNTIME = ARRIVALS + TTL + OVERRUN
#: Real seconds a process may take beyond its simulated runtime (start-up, its last
#: call): generous, because a loaded machine may start and stop them slowly.
EXIT_GRACE = 180.0
#: The whole test's bound: the sweeps' real running time and grace, plus enqueueing and
#: checking 10,000 notices on a loaded machine.
SOAK_TIMEOUT = round(RUNTIME / SCALE + EXIT_GRACE + 300.0)
#: The sweeps' `--json` summaries, added up in the printed report.
SUMMARY_KEYS = (
    "claimed",
    "submitted",
    "polled",
    "escalated",
    "declined",
    "lease_recoveries",
    "lost_races",
    "errors",
)
#: The statuses a channel's attempt can show for each fate (an open status for all).
OPEN = {Status.PENDING, Status.UNKNOWN}
REACHABLE = {
    ("email", "accept"): OPEN | {Status.ACCEPTED},
    ("email", "late"): OPEN | {Status.ACCEPTED},
    ("email", "fail"): OPEN | {Status.FAILED},
    ("email", "never"): OPEN,
    ("sms", "accept"): OPEN | {Status.DELIVERED},
    ("sms", "late"): OPEN | {Status.DELIVERED},
    ("sms", "fail"): OPEN | {Status.FAILED},
    ("sms", "never"): OPEN,
}
#: The built-in policy's success statuses per channel.
SUCCESS = {"email": {Status.ACCEPTED, Status.DELIVERED}, "sms": {Status.DELIVERED}}


@pytest.fixture
def soakbox_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """soakbox.py installed as the plugin package resetctl-soakbox; returns its directory."""
    site = tmp_path / "site"
    soakbox.install(site)
    monkeypatch.syspath_prepend(str(site))
    return site


def _soak_config(call_log: Path) -> str:
    return (
        '[transport]\nemail = "soakbox"\nsms = "soakbox"\n'
        f"[soakbox]\ncall_log = {json.dumps(str(call_log))}\n"
    )


def _predicted(n: int) -> Phase:
    """The phase notice ``n`` ends in when every sweep keeps to the schedule."""
    if soakbox.fate_of("email", n) == "accept":
        return Phase.ACCEPTED
    sms = soakbox.fate_of("sms", n)
    if sms == "accept":
        return Phase.ACCEPTED
    return Phase.FAILED if sms == "fail" else Phase.EXPIRED


def _enqueue_arrivals(db: Path, settings: Settings, first_arrival: float) -> list[str]:
    """Enqueue NOTICES notices in ARRIVAL_GROUPS groups spread over ARRIVALS seconds."""
    ids: list[str] = []
    per_group = -(-NOTICES // ARRIVAL_GROUPS)
    with Store(db) as store:
        for group in range(ARRIVAL_GROUPS):
            numbers = range(group * per_group, min(NOTICES, (group + 1) * per_group))
            requests = [
                reset_request(
                    idempotency_key=f"soak-{n}",
                    email=soakbox.email_for(n),
                    phone=soakbox.phone_for(n),
                    reset_url=f"https://shop.example/reset/soak-{n}",
                )
                for n in numbers
            ]
            at = first_arrival + group * ARRIVALS / ARRIVAL_GROUPS
            ids += [r.notice_id for r in enqueue(store, settings, requests, at)]
    assert len(ids) == NOTICES
    return ids


def _shared_clock_env(first_arrival: float) -> dict[str, str]:
    """Clock settings under which the accelerated clock reads ``first_arrival`` right now.

    The clock reads origin + (real - origin) * SCALE; solving for the origin that makes
    it read ``first_arrival`` at this instant lets the enqueue above take however long it
    takes without eating into the notices' lifetimes.
    """
    assert SCALE > 1, "RESETCTL_SOAK_SCALE must be above 1"
    origin = (SCALE * time.time() - first_arrival) / (SCALE - 1)
    return {"RESETCTL_TIME_SCALE": repr(SCALE), "RESETCTL_TIME_ORIGIN": repr(origin)}


def _start_sweep(
    tmp_path: Path, worker: str, config: Path, env: dict[str, str]
) -> tuple[str, subprocess.Popen[str], Path, Path]:
    """Start one `resetctl sweep --max-runtime` process, its output going to files."""
    command = [
        sys.executable, "-m", "resetctl", "--log-level", "warning", "sweep",
        "--max-runtime", f"{RUNTIME:.0f}s", "--batch-size", "50", "--json",
        "--worker-id", worker, "--config", str(config),
    ]  # fmt: skip
    out, err = tmp_path / f"{worker}.out", tmp_path / f"{worker}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, env=env)
    return worker, proc, out, err


def _run_soak(
    tmp_path: Path, db: Path, site: Path, clock_env: dict[str, str], call_log: Path
) -> list[Finished]:
    """Run WORKERS sweep processes on one clock for RUNTIME simulated seconds each."""
    env = _child_env(db) | clock_env
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    config = tmp_path / "soak.toml"
    config.write_text(_soak_config(call_log), encoding="utf-8")
    started: list[tuple[str, subprocess.Popen[str], Path, Path]] = []
    try:
        for n in range(WORKERS):
            started.append(_start_sweep(tmp_path, f"soak-{n}", config, env))
        finished = []
        for worker, proc, out, err in started:
            returncode = proc.wait(timeout=RUNTIME / SCALE + EXIT_GRACE)
            finished.append(Finished(worker, returncode, out.read_text(), err.read_text()))
        return finished
    finally:
        for _, proc, _, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=EXIT_GRACE)


@dataclass
class Endings:
    """How the notices ended, and how closely the sweeps kept to the schedule.

    The schedule figures depend on how fast the machine is: reported, never asserted.
    """

    #: notices per terminal phase
    phases: Counter[Phase] = field(default_factory=Counter)
    #: notices per phase and the channels they were attempted on, e.g. "accepted:email+sms"
    routes: Counter[str] = field(default_factory=Counter)
    #: notices that ended other than their recipients' fates say (late sweeps change fates)
    off_prediction: int = 0
    #: simulated seconds from each notice's arrival to its email's first call
    email_waits: list[float] = field(default_factory=list)
    #: the longest simulated time any notice took to end
    longest_life: float = 0.0
    #: notices whose ending was recorded after their link expired, and by how much at most
    ended_late: int = 0
    most_late: float = 0.0
    #: transport calls made at or after the notice's expiry (a sweep stalled mid-batch)
    calls_after_expiry: int = 0
    #: calls beyond the first under a key (recoveries of calls left in doubt)
    repeated_calls: int = 0


def _loaded(store: Store, notice_id: str) -> LoadedNotice:
    loaded = store.load_notice(notice_id)
    assert loaded is not None, notice_id
    return loaded


def _assert_each_notice_ended_once(
    store: Store, notice_ids: list[str], calls: list[soakbox.Call]
) -> Endings:
    """Per notice: terminal, unleased and scrubbed; at most one attempt and one message
    per channel; each attempt counts exactly the transport calls its key got, and an
    extra call follows a lease takeover; every status is one its recipient's fate allows,
    and the phase agrees with the statuses seen. Returns the figures for the report."""
    calls_per_key = Counter(call.attempt_key for call in calls)
    messages = store.outbox_messages()
    per_channel = Counter((m["notice_id"], m["channel"]) for m in messages)
    assert set(per_channel.values()) <= {1}
    by_key = {m["attempt_key"]: m["message_id"] for m in messages}
    assert len(by_key) == len(messages)
    expires_at: dict[str, float] = {}
    endings = Endings()
    for n, notice_id in enumerate(notice_ids):
        loaded = _loaded(store, notice_id)
        state = loaded.state
        assert state.phase.terminal, (notice_id, state.phase)
        assert loaded.lease_owner is None, notice_id
        assert store.load_contact(notice_id) is None, notice_id
        channels = [a.channel for a in state.attempts]
        assert len(channels) == len(set(channels)), notice_id
        for attempt in state.attempts:
            expires_at[attempt.key] = state.expires_at
            made = calls_per_key[attempt.key]
            assert made == attempt.calls, (attempt.key, made, attempt.calls)
            # A call made is a message stored under its key and bound to its attempt.
            assert attempt.message_id == by_key.get(attempt.key), attempt.key
            fate = soakbox.fate_of(attempt.channel, n)
            assert attempt.status in REACHABLE[attempt.channel, fate], (attempt.key, fate)
            if made > 1:
                takeovers = [
                    e for e in store.event_rows(notice_id) if e["kind"] == "lease_recovered"
                ]
                assert made - 1 <= len(takeovers), (attempt.key, made)
                endings.repeated_calls += made - 1
            if attempt.channel == "email":
                endings.email_waits.append(attempt.started_at - loaded.created_at)
        statuses = {a.status for a in state.attempts if a.status in SUCCESS[a.channel]}
        if state.phase is Phase.ACCEPTED:
            assert statuses, (notice_id, "accepted without a success status")
        if state.phase is Phase.FAILED:
            assert any(a.status is Status.FAILED for a in state.attempts), notice_id
        endings.phases[state.phase] += 1
        endings.routes[f"{state.phase}:{'+'.join(channels)}"] += 1
        endings.off_prediction += state.phase is not _predicted(n)
        endings.longest_life = max(endings.longest_life, loaded.phase_since - loaded.created_at)
        if loaded.phase_since > state.expires_at:
            endings.ended_late += 1
            endings.most_late = max(endings.most_late, loaded.phase_since - state.expires_at)
    # No call under a key nobody attempted, and no message without its attempt.
    assert set(calls_per_key) <= set(expires_at), set(calls_per_key) - set(expires_at)
    assert set(by_key) <= set(expires_at), set(by_key) - set(expires_at)
    endings.calls_after_expiry = sum(1 for c in calls if c.at >= expires_at[c.attempt_key])
    return endings


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [0.0]
    return {
        "p50": round(ordered[len(ordered) // 2], 1),
        "p99": round(ordered[len(ordered) * 99 // 100], 1),
        "max": round(ordered[-1], 1),
    }


@pytest.mark.slow
@pytest.mark.timeout(SOAK_TIMEOUT)
def test_four_sweeps_end_every_notice_with_each_call_accounted_for(
    tmp_path: Path, db_path: Path, soakbox_installed: Path
) -> None:
    """Four sweeps on one accelerated clock lose no notice and make no unexplained call."""
    call_log = tmp_path / "calls.log"
    settings = make_settings(
        transport={"email": "soakbox", "sms": "soakbox"}, soakbox={"call_log": str(call_log)}
    )
    first_arrival = time.time()
    began = time.monotonic()
    notice_ids = _enqueue_arrivals(db_path, settings, first_arrival)
    enqueued = time.monotonic()
    clock_env = _shared_clock_env(first_arrival)
    last_expiry = first_arrival + ARRIVALS + TTL

    finished = _run_soak(tmp_path, db_path, soakbox_installed, clock_env, call_log)

    swept = time.monotonic()
    _assert_exited_cleanly(finished)
    totals: Counter[str] = Counter()
    for result in finished:
        totals.update(result.summary)
    assert totals["errors"] == 0
    shared_clock, _ = clock_from_env(clock_env)
    # --max-runtime counts on the shared clock, so this holds however slow the sweeps ran.
    assert shared_clock() > last_expiry, "the sweeps stopped before the last link expired"
    swept_calls = len(soakbox.read_calls(call_log))
    assert totals["submitted"] == swept_calls
    with Store(db_path) as store:
        # The next cron run: a sweep that stopped at its bound handed back what it held.
        check = run_sweep(store, settings, FakeClock(shared_clock()), worker="checker")
        # Every link has expired, so nothing may be sent any more.
        assert check.submitted == 0
        calls = soakbox.read_calls(call_log)
        assert len(calls) == swept_calls
        endings = _assert_each_notice_ended_once(store, notice_ids, calls)

    report: dict[str, Any] = {
        "notices": NOTICES,
        "scale": SCALE,
        "enqueue_s": round(enqueued - began, 1),
        "sweeps_s": round(swept - enqueued, 1),
        "outcomes": {str(p): n for p, n in endings.phases.most_common()},
        "routes": dict(endings.routes.most_common()),
        "off_prediction": endings.off_prediction,
        "email_wait_s": _percentiles(endings.email_waits),
        "longest_life_s": round(endings.longest_life, 1),
        "ended_after_expiry": endings.ended_late,
        "most_late_s": round(endings.most_late, 1),
        "calls_after_expiry": endings.calls_after_expiry,
        "repeated_calls": endings.repeated_calls,
        "left_for_next_run": check.claimed,
        "sweeps": {k: totals[k] for k in SUMMARY_KEYS},
    }
    print("soak:", json.dumps(report))
    if target := os.environ.get("RESETCTL_SOAK_REPORT"):
        Path(target).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
