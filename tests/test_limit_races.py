"""Abuse limits hold across processes: several enqueues for one recipient at once, on one
database, never let more through than the limit (the counts are rows in the database,
read under a lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resetctl.config import load_settings
from resetctl.store import Store

#: Processes that enqueue at once, each a batch of LINES requests for one address.
PROCESSES = 6
LINES = 3
LIMIT = 4
#: Bound on any wait for a child process.
PROCESS_TIMEOUT_SECONDS = 60.0

#: A child: opens the database, says "ready", waits for the go file, enqueues its batch
#: and prints how many lines were accepted and refused.
_ENQUEUER = """
import json, os, sys, time
import resetctl
n, lines, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
requests = [
    {"idempotency_key": f"p{n}-{i}", "region": "eu", "email": "target@example.com",
     "reset_url": f"https://shop.example/r/{n}-{i}"}
    for i in range(lines)
]
with resetctl.open(os.environ["RESETCTL_DB"], os.environ["RESETCTL_CONFIG"], create=False) as h:
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    results = h.enqueue(requests)
print(json.dumps([r.refused is None for r in results]), flush=True)
"""


@pytest.mark.slow
def test_racing_enqueues_for_one_recipient_never_pass_the_limit(tmp_path: Path, db: str) -> None:
    """With one notice for an address stored, six processes enqueue three requests each
    for it at the same moment, under limits.per_recipient = 4: exactly three more are
    stored, every other line is refused as rate_limited, and the count row agrees."""
    config = tmp_path / "resetctl.toml"
    config.write_text(f"[policy.eu]\nversion = 1\n[policy.eu.limits]\nper_recipient = {LIMIT}\n")
    settings = load_settings(config)
    import resetctl

    # One notice first: the schema, the key file and the count's row exist before the
    # children race, so every child reads the same row at once.
    with resetctl.open(db, settings) as handle:
        handle.enqueue([_request("first")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env.update(RESETCTL_DB=db, RESETCTL_CONFIG=str(config))
    if "RESETCTL_HASH_KEY" in os.environ:
        env["RESETCTL_HASH_KEY"] = os.environ["RESETCTL_HASH_KEY"]
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _ENQUEUER, str(n), str(LINES), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n", child.stderr
        go.write_text("go")
        accepted = 0
        for child in children:
            out, errors = child.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
            assert child.returncode == 0, errors
            accepted += sum(json.loads(out))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert accepted == LIMIT - 1
    with Store(db) as store:
        (stored,) = store.conn.execute("SELECT COUNT(*) FROM notices").fetchone()
        assert stored == LIMIT
        ((counts,),) = store.conn.execute(
            "SELECT counts FROM limit_counts WHERE rule = 'recipient'"
        ).fetchall()
        assert sum(n for _, n in json.loads(counts)) == LIMIT
        refused = store.refusal_counts(0.0)
        assert refused == [("eu", "rate_limited", PROCESSES * LINES - (LIMIT - 1))]


def _request(key: str) -> dict[str, str]:
    return {
        "idempotency_key": key,
        "region": "eu",
        "email": "target@example.com",
        "reset_url": f"https://shop.example/r/{key}",
    }


@pytest.mark.slow
def test_racing_sweeps_never_send_more_sms_to_a_country_than_its_cap(
    tmp_path: Path, db: str
) -> None:
    """Three sweep processes at once over 30 SMS-first notices to one country, under
    limits.sms_per_country_per_hour = 10: exactly 10 texts go out; the other 20 skip
    their SMS (country_cap) and are sent by email."""
    config = tmp_path / "resetctl.toml"
    config.write_text(
        '[policy.eu]\nversion = 1\nchannels = ["sms", "email"]\n'
        "[policy.eu.limits]\nsms_per_country_per_hour = 10\n"
    )
    import resetctl

    requests = [
        {**_request(f"n{i}"), "email": f"user{i}@example.com", "phone": "+14155550123"}
        for i in range(30)
    ]
    with resetctl.open(db, str(config)) as handle:
        handle.enqueue(requests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env.update(RESETCTL_DB=db, RESETCTL_CONFIG=str(config))
    if "RESETCTL_HASH_KEY" in os.environ:
        env["RESETCTL_HASH_KEY"] = os.environ["RESETCTL_HASH_KEY"]
    sweeps = [
        subprocess.Popen(
            [sys.executable, "-m", "resetctl", "sweep", "--batch-size", "4", "--json"],
            env={**env, "RESETCTL_WORKER": f"w{n}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    try:
        for sweep in sweeps:
            _, errors = sweep.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
            assert sweep.returncode == 0, errors
    finally:
        for sweep in sweeps:
            if sweep.poll() is None:
                sweep.kill()
    with Store(db) as store:
        channels = [m["channel"] for m in store.outbox_messages()]
        assert channels.count("sms") == 10
        assert channels.count("email") == 20
        skips = [e for e in store.all_events() if e["kind"] == "skipped"]
        assert len(skips) == 20
        assert {e["reason"] for e in skips} == {"country_cap"}
