"""Sweeps on many hosts, simulated: several real `resetctl sweep` processes with distinct
worker ids on one database, any of them under a skewed clock (RESETCTL_CLOCK_SKEW), over
notices sent through the outbox with a simulated provider latency ([outbox] latency).

Shared by tests/test_multi_host.py and bench/scale.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resetctl.config import settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store

#: Every sweep process's command line, as cron runs it on each host.
SWEEP = (sys.executable, "-m", "resetctl", "sweep", "--json")
#: The key every host hashes recipients with (a server database keeps none beside it).
HASH_KEY = "multi-host-simulation-key-0123456789"


@dataclass(frozen=True)
class Host:
    """One simulated host: its worker id and how far its clock is off (seconds)."""

    worker: str
    skew: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """What a run of sweeps achieved."""

    notices: int
    seconds: float
    terminal: int
    #: transport calls beyond one per attempt (attempts.calls - 1, summed)
    duplicate_calls: int
    #: attempts beyond one per notice and channel (the schema forbids them)
    duplicate_attempts: int
    #: claims that took over a lease its holder had not released
    takeovers: int
    #: lease takeovers whose previous holder's lease was still live on the database
    live_takeovers: int
    summaries: tuple[dict[str, Any], ...]
    #: from the sweeps' first transition to their last (without interpreters' start-up)
    working: float = 0.0

    @property
    def per_second(self) -> float:
        return self.notices / self.seconds if self.seconds else 0.0

    @property
    def per_working_second(self) -> float:
        return self.notices / self.working if self.working else 0.0


def config_text(latency: str) -> str:
    """The sweep's config: the outbox with a simulated provider latency per call."""
    return f'[outbox]\nlatency = "{latency}"\n'


def populate(db: str, count: int, now: float, chunk: int = 1000) -> list[str]:
    """Enqueue ``count`` notices due at ``now`` (email first, accepted at once)."""
    settings = settings_from_mapping({}, "multihost")
    ids: list[str] = []
    os.environ.setdefault("RESETCTL_HASH_KEY", HASH_KEY)
    with Store(db) as store:
        for start in range(0, count, chunk):
            requests = [
                {
                    "idempotency_key": f"mh-{n}",
                    "email": f"user{n}@example.com",
                    "phone": "+14155550123",
                    "reset_url": f"https://shop.example/reset/token-{n}",
                }
                for n in range(start, min(start + chunk, count))
            ]
            ids += [r.notice_id for r in enqueue(store, settings, requests, now)]
    return ids


def run_hosts(
    db: str,
    hosts: Sequence[Host],
    config: Path,
    *,
    lease: str = "20s",
    batch_size: int = 20,
    timeout: float = 600.0,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """Start one sweep per host at once and wait for all; returns (wall seconds, the
    `--json` summaries)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    base.update({"RESETCTL_DB": db, "RESETCTL_HASH_KEY": HASH_KEY, **(extra_env or {})})
    started = time.monotonic()
    procs = []
    for host in hosts:
        env = {**base, "RESETCTL_CLOCK_SKEW": repr(host.skew)} if host.skew else dict(base)
        args = ["--config", str(config), "--worker-id", host.worker, "--lease", lease]
        procs.append(
            subprocess.Popen(
                [*SWEEP, *args, "--batch-size", str(batch_size)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, "RESETCTL_LOG_LEVEL": "warning"},
            )
        )
    summaries = []
    for host, proc in zip(hosts, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{host.worker} exited {proc.returncode}: {err[-2000:]}")
        summaries.append(json.loads(out))
    return time.monotonic() - started, summaries


def verify(db: str, notice_ids: Sequence[str], seconds: float, summaries: Any) -> Outcome:
    """Count terminal notices, duplicate calls and attempts, and takeovers."""
    with Store(db) as store:
        phases = store.phase_counts()
        terminal = sum(phases.get(p, 0) for p in ("accepted", "failed", "expired"))
        (calls,) = store.conn.execute("SELECT COALESCE(SUM(calls - 1), 0) FROM attempts").fetchone()
        (attempts,) = store.conn.execute(
            "SELECT COUNT(*) - COUNT(DISTINCT notice_id || ':' || channel) FROM attempts"
        ).fetchone()
        (takeovers,) = store.conn.execute(
            "SELECT COALESCE(SUM(lease_recoveries), 0) FROM notices"
        ).fetchone()
        # A takeover of a live lease would show as a lost race of its holder's writes.
        (live,) = store.conn.execute(
            "SELECT COUNT(*) FROM events WHERE kind IN ('lost_race', 'lease_recovered')"
        ).fetchone()
        first, last = store.conn.execute(
            "SELECT MIN(at), MAX(at) FROM events WHERE kind IN ('intent', 'outcome')"
        ).fetchone()
    return Outcome(
        notices=len(notice_ids),
        seconds=seconds,
        terminal=int(terminal),
        duplicate_calls=int(calls),
        duplicate_attempts=int(attempts),
        takeovers=int(takeovers),
        live_takeovers=int(live),
        summaries=tuple(summaries),
        working=float(last - first) if first is not None else 0.0,
    )


def simulate(
    db: str, tmp: Path, count: int, hosts: Sequence[Host], latency: str, **kw: Any
) -> Outcome:
    """Populate, sweep with every host at once, and verify."""
    config = tmp / "sweep.toml"
    config.write_text(config_text(latency), encoding="utf-8")
    ids = populate(db, count, time.time())
    seconds, summaries = run_hosts(db, hosts, config, **kw)
    return verify(db, ids, seconds, summaries)
