"""Instance health is shared through the database: a sweep process that saw an instance
fail takes it out of use for every other process (on one SQLite file, and on
PostgreSQL), so the next process sends new work straight to the next instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import reset_request, resetctl
from providers_http import closed_port_url
from providers_twilio import FakeTwilio
from test_transport_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER

from resetctl.failover import InstanceState
from resetctl.store import Store

pytestmark = pytest.mark.slow

ENV = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}


def _config(tmp_path: Path, down: str, up: FakeTwilio) -> Path:
    config = tmp_path / "resetctl.toml"
    config.write_text(
        f"""
[transport]
sms = ["sms_main", "sms_backup"]

[providers.sms_main]
kind = "twilio"
base_url = "{down}"
from = "{SENDER}"

[providers.sms_backup]
kind = "twilio"
base_url = "{up.base_url}"
from = "{SENDER}"

[failover]
after = 1
cooldown = "10m"

[policy.default]
channels = ["sms", "email"]
""",
        encoding="utf-8",
    )
    return config


def _enqueue(db: str, config: Path, key: str) -> str:
    done = resetctl(
        "enqueue",
        "--config",
        str(config),
        input=json.dumps(reset_request(idempotency_key=key)) + "\n",
        db=db,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    notice_id: str = json.loads(done.stdout.splitlines()[0])["notice_id"]
    return notice_id


def test_two_sweep_processes_agree_an_instance_is_out_of_use(
    store: Store, db: str, tmp_path: Path, twilio: FakeTwilio
) -> None:
    """One process's failure opens the instance; the next process never calls it and sends
    its new notice on the backup at once."""
    config = _config(tmp_path, closed_port_url(), twilio)
    first = _enqueue(db, config, "first")
    swept = resetctl("sweep", "--config", str(config), "--json", db=db, env=ENV)
    assert swept.returncode == 0, swept.stderr
    (attempt,) = [a for a in store.attempt_rows(first) if a["channel"] == "sms"]
    assert (attempt["transport"], attempt["state"]) == ("sms_main", "intent")
    health = store.instance_health()["sms_main"]
    assert health.state(health.last_failure_at or 0) is InstanceState.OPEN

    second = _enqueue(db, config, "second")
    swept = resetctl("sweep", "--config", str(config), "--json", db=db, env=ENV)
    assert swept.returncode == 0, swept.stderr

    (attempt,) = [a for a in store.attempt_rows(second) if a["channel"] == "sms"]
    assert (attempt["transport"], attempt["state"], attempt["calls"]) == (
        "sms_backup",
        "submitted",
        1,
    )
    assert store.instance_health()["sms_main"].total_failures == 1  # never called again
    assert len(twilio.messages) == 1
