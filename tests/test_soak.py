"""Soak: four `resetctl sweep --max-runtime` processes on one file under accelerated time.

Thousands of notices arrive over two simulated minutes; their recipients' fates (see
soakbox.py: accepted, failed, never answered, late) are fixed by a hash, so the outcome
of every notice is known in advance. The sweeps share one clock running
RESETCTL_TIME_SCALE times faster than real time, so the 10-minute links, the poll
schedules and the leases play out in about a minute (12x for 10,000 notices).

RESETCTL_SOAK_NOTICES sets the size (default 10,000); RESETCTL_SOAK_SCALE the speed-up.
A larger soak by hand, e.g. ``RESETCTL_SOAK_NOTICES=50000 pytest tests/test_soak.py -s``,
picks a slower clock by itself so the sweeps keep up.
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

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase
from resetctl.store import Store
from resetctl.sweep import clock_from_env

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
#: Real seconds a process may take beyond its simulated runtime (start-up, last batch).
EXIT_GRACE = 60.0
#: The sweeps' `--json` summaries, added up in the printed report.
SUMMARY_KEYS = (
    "claimed",
    "submitted",
    "polled",
    "escalated",
    "lease_recoveries",
    "lost_races",
    "errors",
)
SOAK_CONFIG = '[transport]\nemail = "soakbox"\nsms = "soakbox"\n'


@pytest.fixture
def soakbox_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """soakbox.py installed as the plugin package resetctl-soakbox; returns its directory."""
    site = tmp_path / "site"
    site.mkdir()
    source = Path(soakbox.__file__).read_text(encoding="utf-8")
    (site / "resetctl_soakbox.py").write_text(source, encoding="utf-8")
    dist = site / "resetctl_soakbox-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: resetctl-soakbox\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[resetctl.transports]\nsoakbox = resetctl_soakbox:PLUGIN\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(site))
    return site


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
    tmp_path: Path, worker: str, runtime: float, env: dict[str, str]
) -> tuple[str, subprocess.Popen[str], Path, Path]:
    """Start one `resetctl sweep --max-runtime` process, its output going to files."""
    config = tmp_path / "soak.toml"
    config.write_text(SOAK_CONFIG, encoding="utf-8")
    command = [
        sys.executable, "-m", "resetctl", "--log-level", "warning", "sweep",
        "--max-runtime", f"{runtime:.0f}s", "--batch-size", "50", "--json",
        "--worker-id", worker, "--config", str(config),
    ]  # fmt: skip
    out, err = tmp_path / f"{worker}.out", tmp_path / f"{worker}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, env=env)
    return worker, proc, out, err


def _run_soak(
    tmp_path: Path, db: Path, site: Path, clock_env: dict[str, str], runtime: float
) -> list[Finished]:
    """Run WORKERS sweep processes on one clock for ``runtime`` simulated seconds each."""
    env = _child_env(db) | clock_env
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    started: list[tuple[str, subprocess.Popen[str], Path, Path]] = []
    try:
        for n in range(WORKERS):
            started.append(_start_sweep(tmp_path, f"soak-{n}", runtime, env))
        finished = []
        for worker, proc, out, err in started:
            returncode = proc.wait(timeout=runtime / SCALE + EXIT_GRACE)
            finished.append(Finished(worker, returncode, out.read_text(), err.read_text()))
        return finished
    finally:
        for _, proc, _, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=EXIT_GRACE)


@dataclass
class Endings:
    """How the notices ended."""

    #: notices per terminal phase
    phases: Counter[Phase] = field(default_factory=Counter)
    #: notices per phase and the channels they were attempted on, e.g. "accepted:email+sms"
    routes: Counter[str] = field(default_factory=Counter)
    #: notices that ended other than their recipients' fates say
    off_prediction: int = 0
    #: simulated seconds from each notice's arrival to its email's submission
    email_waits: list[float] = field(default_factory=list)
    #: the longest simulated time any notice took to end
    longest_life: float = 0.0


@pytest.mark.slow
def test_four_sweeps_end_every_notice_in_time_with_one_attempt_per_channel(
    tmp_path: Path, db_path: Path, soakbox_installed: Path
) -> None:
    """Four sweeps on one accelerated clock end every notice by its expiry, once per channel."""
    settings = make_settings(transport={"email": "soakbox", "sms": "soakbox"})
    first_arrival = time.time()
    began = time.monotonic()
    notice_ids = _enqueue_arrivals(db_path, settings, first_arrival)
    enqueued = time.monotonic()
    clock_env = _shared_clock_env(first_arrival)
    last_expiry = first_arrival + ARRIVALS + TTL

    finished = _run_soak(
        tmp_path, db_path, soakbox_installed, clock_env, runtime=ARRIVALS + TTL + OVERRUN
    )

    swept = time.monotonic()
    _assert_exited_cleanly(finished)
    assert all("locked" not in f.stderr.lower() for f in finished)
    totals: Counter[str] = Counter()
    for result in finished:
        totals.update(result.summary)
    shared_clock, _ = clock_from_env(clock_env)
    assert shared_clock() > last_expiry, "the sweeps stopped before the last link expired"
    with Store(db_path) as store:
        check = run_sweep(store, settings, FakeClock(shared_clock()), worker="checker")
        assert check.claimed == 0, "a notice was still live after every link had expired"
        endings = _assert_each_notice_ended_in_time_once(store, notice_ids)

    waits = sorted(endings.email_waits)
    report: dict[str, Any] = {
        "notices": NOTICES,
        "scale": SCALE,
        "enqueue_s": round(enqueued - began, 1),
        "sweeps_s": round(swept - enqueued, 1),
        "outcomes": {str(p): n for p, n in endings.phases.most_common()},
        "routes": dict(endings.routes.most_common()),
        "off_prediction": endings.off_prediction,
        "email_wait_s": {
            "p50": round(waits[len(waits) // 2], 1),
            "p99": round(waits[len(waits) * 99 // 100], 1),
            "max": round(waits[-1], 1),
        },
        "longest_life_s": round(endings.longest_life, 1),
        "sweeps": {k: totals[k] for k in SUMMARY_KEYS},
    }
    print("soak:", json.dumps(report))
    assert totals["errors"] == 0
    # The fates make about 80% accepted, 7.5% failed and 12.5% expired, and sweeps that
    # keep to the schedule end each notice exactly as its fates say.
    assert endings.off_prediction <= NOTICES // 100, report
    mix = endings.phases
    assert 0.70 * NOTICES < mix[Phase.ACCEPTED] < 0.90 * NOTICES, report
    assert 0.03 * NOTICES < mix[Phase.FAILED] < 0.15 * NOTICES, report
    assert 0.06 * NOTICES < mix[Phase.EXPIRED] < 0.20 * NOTICES, report


def _assert_each_notice_ended_in_time_once(store: Store, notice_ids: list[str]) -> Endings:
    """Per notice: terminal by its expiry, at most one attempt and message per channel,
    every attempt begun before expiry and bound to its one outbox message."""
    messages = store.outbox_messages()
    per_channel = Counter((m["notice_id"], m["channel"]) for m in messages)
    assert max(per_channel.values()) == 1
    by_key = {m["attempt_key"]: m["message_id"] for m in messages}
    assert len(by_key) == len(messages)
    attempted = 0
    endings = Endings()
    for n, notice_id in enumerate(notice_ids):
        loaded = store.load_notice(notice_id)
        assert loaded is not None, notice_id
        state = loaded.state
        assert state.phase.terminal, (notice_id, state.phase)
        assert loaded.phase_since <= state.expires_at, (notice_id, loaded.reason)
        assert loaded.lease_owner is None, notice_id
        channels = [a.channel for a in state.attempts]
        assert len(channels) == len(set(channels)), notice_id
        for attempt in state.attempts:
            assert attempt.started_at < state.expires_at, (notice_id, attempt.channel)
            assert attempt.message_id == by_key[attempt.key], (notice_id, attempt.channel)
            if attempt.channel == "email":
                endings.email_waits.append(attempt.started_at - loaded.created_at)
        attempted += len(state.attempts)
        endings.phases[state.phase] += 1
        endings.routes[f"{state.phase}:{'+'.join(channels)}"] += 1
        endings.off_prediction += state.phase is not _predicted(n)
        endings.longest_life = max(endings.longest_life, loaded.phase_since - loaded.created_at)
    assert attempted == len(messages)
    return endings
