"""The real command line in child processes: output shapes, exit codes, options, env."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, resetctl, run_sweep

from resetctl.config import Settings, load_settings
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.store import Store
from resetctl.transports.outbox import OutboxTransport

TERMINAL = {"accepted", "failed", "expired"}
REPORT_KEYS = {
    "notice_id",
    "phase",
    "region",
    "policy_version",
    "expires_at",
    "remaining_seconds",
    "state_age_seconds",
    "attempts",
    "next_action",
    "lease",
    "history",
}
ATTEMPT_KEYS = {"channel", "attempt_key", "state", "last_observation"}
SUMMARY_KEYS = {"claimed", "submitted", "polled", "escalated", "expired", "errors"}
OUTBOX_ROW_KEYS = {"message_id", "notice_id", "channel", "attempt_key", "status", "submitted_at"}

_keys = iter(range(1, 10**9))


def request(**fields: Any) -> dict[str, Any]:
    """An enqueue request with distinct defaults; pass a field as None to drop it."""
    n = next(_keys)
    base: dict[str, Any] = {
        "idempotency_key": f"cli-{n}",
        "email": f"user{n}@example.com",
        "phone": "+14155550123",
        "reset_url": f"https://shop.example/reset/token-{n}",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def jsonl(*requests: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


def table_count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(count)


def write_config(tmp_path: Path, text: str, name: str = "resetctl.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def enqueue_ok(db: Path, *requests: dict[str, Any], config: Path | None = None) -> list[str]:
    """Enqueue through the CLI; returns the notice ids."""
    args = ["enqueue"] + (["--config", str(config)] if config else [])
    done = resetctl(*args, db=db, input=jsonl(*requests))
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["notice_id"] for line in done.stdout.splitlines()]


def sweep_json(db: Path, config: Path | None = None) -> dict[str, Any]:
    args = ["sweep", "--json"] + (["--config", str(config)] if config else [])
    done = resetctl(*args, db=db)
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def inspect_json(db: Path, notice_id: str) -> dict[str, Any]:
    done = resetctl("inspect", notice_id, "--json", "--db", str(db))
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def outbox_rows(db: Path) -> list[dict[str, Any]]:
    done = resetctl("outbox", "list", "--json", "--db", str(db))
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


@pytest.fixture
def pending_config(tmp_path: Path) -> Path:
    """Outbox emails stay pending, so a notice waits for its first poll."""
    return write_config(tmp_path, '[outbox]\nemail_status = "pending"\n', "pending.toml")


@pytest.fixture
def bouncing_config(tmp_path: Path) -> Path:
    """Outbox emails fail at once, so the notice falls back to SMS within one sweep."""
    return write_config(tmp_path, '[outbox]\nemail_status = "failed"\n', "bouncing.toml")


def test_module_help_lists_every_command() -> None:
    """`python -m resetctl --help` works and names the commands."""
    done = resetctl("--help")

    assert done.returncode == 0, done.stderr
    for command in ("enqueue", "sweep", "inspect", "outbox", "demo"):
        assert command in done.stdout


def test_enqueue_takes_no_secret_as_an_argument() -> None:
    """enqueue has no option that takes an address, a number or a URL (argv is public)."""
    done = resetctl("enqueue", "--help", env={"COLUMNS": "200"})

    assert done.returncode == 0, done.stderr
    options = set(re.findall(r"--[a-z][a-z-]*", done.stdout))
    assert {"--input", "--db", "--config"} <= options
    assert options <= {"--input", "--db", "--config", "--help"}


def test_enqueue_prints_one_result_per_line_and_replays_idempotently(tmp_path: Path) -> None:
    """stdin and --input both work; a replay reports the same ids with created false."""
    db = tmp_path / "r.db"
    requests = [request(ttl="10m"), request(ttl="90s", email=None)]
    first = resetctl("enqueue", db=db, input=jsonl(*requests))
    (tmp_path / "again.jsonl").write_text(jsonl(*requests), encoding="utf-8")
    again = resetctl("enqueue", "--input", str(tmp_path / "again.jsonl"), db=db)

    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    created = [json.loads(line) for line in first.stdout.splitlines()]
    replayed = [json.loads(line) for line in again.stdout.splitlines()]
    assert [r["idempotency_key"] for r in created] == [r["idempotency_key"] for r in requests]
    assert [r["created"] for r in created] == [True, True]
    assert [set(r) for r in created] == [{"notice_id", "idempotency_key", "created"}] * 2
    assert [r["notice_id"] for r in replayed] == [r["notice_id"] for r in created]
    assert [r["created"] for r in replayed] == [False, False]
    assert table_count(db, "notices") == 2


def test_enqueue_reused_key_with_other_fields_exits_2(tmp_path: Path) -> None:
    """The same key with a different ttl as written is refused and changes nothing."""
    db = tmp_path / "r.db"
    original = request(ttl="10m")
    enqueue_ok(db, original)

    done = resetctl("enqueue", db=db, input=jsonl(request(), {**original, "ttl": "600"}))

    assert done.returncode == 2
    assert "line 2: idempotency_key: already used with different fields" in done.stderr
    assert done.stdout == ""
    assert table_count(db, "notices") == 1


def test_enqueue_invalid_input_lists_every_error_exits_2_writes_nothing(tmp_path: Path) -> None:
    """Any invalid line: every problem listed by line number, exit 2, no notice written."""
    db = tmp_path / "r.db"
    lines = jsonl(
        request(),
        request(email="nope", reset_url="http://shop.example/r/x"),
        request(phone="+44 7700 900"),
    )

    done = resetctl("enqueue", db=db, input=lines)

    assert done.returncode == 2
    assert done.stdout == ""
    errors = done.stderr
    assert "line 2: email: not a valid email address" in errors
    assert "line 2: reset_url: must be an absolute https:// URL" in errors
    assert "line 3: phone: not a valid E.164 number" in errors
    assert "line 1" not in errors
    assert table_count(db, "notices") == 0


@pytest.mark.xfail(
    reason="enqueue.validate_request: a request whose only contact is not among the policy's"
    " channels is silently dropped (exit 0, no output, nothing written) instead of rejected",
    strict=True,
)
def test_enqueue_contact_the_policy_cannot_use_exits_2(tmp_path: Path) -> None:
    """An email-only request under an SMS-only policy is an input error, not a silent no-op."""
    config = write_config(tmp_path, '[policy.default]\nchannels = ["sms"]\n')

    done = resetctl(
        "enqueue", "--config", str(config), db=tmp_path / "r.db", input=jsonl(request(phone=None))
    )

    assert done.returncode == 2
    assert "line 1: email/phone:" in done.stderr


def test_sweep_json_summary_for_an_accepted_email(tmp_path: Path) -> None:
    """sweep --json reports the counts; an accepted email ends the notice in one sweep."""
    db = tmp_path / "r.db"
    enqueue_ok(db, request())

    summary = sweep_json(db)

    assert summary.keys() >= SUMMARY_KEYS
    assert {k: summary[k] for k in SUMMARY_KEYS | {"accepted"}} == {
        "claimed": 1,
        "submitted": 1,
        "polled": 0,
        "escalated": 0,
        "expired": 0,
        "accepted": 1,
        "errors": 0,
    }


def _poll_hits_a_vanished_message(tmp_path: Path, db: Path) -> Path | None:
    """Submit a pending email, then make its first poll due and its message unknown."""
    config = write_config(tmp_path, '[outbox]\nemail_status = "pending"\n')
    enqueue_ok(db, request(), config=config)
    sweep_json(db, config)
    # Stand-in for the 15 s until the first poll: move the schedule back, not the clock.
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE attempts SET submitted_at = submitted_at - 20")
        conn.execute("UPDATE notices SET due_at = due_at - 20")
        conn.execute("DELETE FROM outbox")
    return config


def _sms_too_long_to_send(tmp_path: Path, db: Path) -> Path | None:
    """An SMS-only policy whose rendered text needs more segments than it allows."""
    config = write_config(
        tmp_path,
        f'support_label = "{"Acme Market customer support team " * 6}"\n'
        '[policy.default]\nchannels = ["sms"]\n[policy.default.sms]\nmax_segments = 1\n',
    )
    enqueue_ok(db, request(email=None), config=config)
    return config


@pytest.mark.parametrize("arrange", [_poll_hits_a_vanished_message, _sms_too_long_to_send])
def test_sweep_exits_0_when_a_delivery_errors(
    tmp_path: Path, arrange: Callable[[Path, Path], Path | None]
) -> None:
    """A per-notice transport or rendering error is counted, not turned into an exit code."""
    db = tmp_path / "r.db"
    config = arrange(tmp_path, db)

    done = resetctl("sweep", "--json", "--config", str(config), db=db)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["errors"] == 1


def test_inspect_json_for_a_notice_waiting_on_its_first_poll(
    tmp_path: Path, pending_config: Path
) -> None:
    """inspect --json shows phase, timing, the attempt, the due poll and the history."""
    db = tmp_path / "r.db"
    expires = time.time() + 600
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
    [notice_id] = enqueue_ok(db, request(expires_at=at, region="eu"), config=pending_config)
    sweep_json(db, pending_config)

    report = inspect_json(db, notice_id)

    assert report.keys() >= REPORT_KEYS
    assert report["notice_id"] == notice_id
    assert (report["phase"], report["region"], report["policy_version"]) == (
        "primary_pending",
        "eu",
        1,
    )
    assert report["expires_at"] == at
    assert 500 < report["remaining_seconds"] <= 600
    assert 0 <= report["state_age_seconds"] < 60
    [attempt] = report["attempts"]
    assert attempt.keys() >= ATTEMPT_KEYS
    assert (attempt["channel"], attempt["attempt_key"], attempt["state"]) == (
        "email",
        f"{notice_id}:email:1",
        "submitted",
    )
    assert attempt["last_observation"]["status"] == "pending"
    action = report["next_action"]
    assert (action["action"], action["channel"]) == ("poll", "email")
    assert 0 < action["due_in_seconds"] <= 15
    assert report["lease"] is None
    assert [h["kind"] for h in report["history"]] == ["intent", "outcome"]


def test_inspect_shows_a_fallback_that_was_accepted(
    tmp_path: Path, bouncing_config: Path
) -> None:
    """After a bounce and an SMS fallback, both attempts and the terminal phase show."""
    db = tmp_path / "r.db"
    [notice_id] = enqueue_ok(db, request(), config=bouncing_config)
    summary = sweep_json(db, bouncing_config)

    report = inspect_json(db, notice_id)
    text = resetctl("inspect", notice_id, "--db", str(db))

    assert (summary["escalated"], summary["accepted"]) == (1, 1)
    assert report["phase"] == "accepted"
    assert report["next_action"] is None
    statuses = {a["channel"]: a["last_observation"]["status"] for a in report["attempts"]}
    assert statuses == {"email": "failed", "sms": "delivered"}
    assert text.returncode == 0, text.stderr
    assert notice_id in text.stdout
    assert "phase accepted" in text.stdout
    assert "next: nothing (terminal)" in text.stdout


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_inspect_unknown_notice_exits_1_with_one_line(tmp_path: Path, json_flag: list[str]) -> None:
    """An unknown id is a one-line error on stderr and exit 1."""
    done = resetctl("inspect", "ntc_0000000000000000", *json_flag, db=tmp_path / "r.db")

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == ["error: no notice 'ntc_0000000000000000'"]


def test_outbox_list_and_show_both_channels(tmp_path: Path, bouncing_config: Path) -> None:
    """outbox list names each message; show gives an email's parts and an SMS body."""
    db = tmp_path / "r.db"
    reset_url = "https://shop.example/reset/outbox-show-1"
    [notice_id] = enqueue_ok(db, request(reset_url=reset_url), config=bouncing_config)
    sweep_json(db, bouncing_config)

    rows = outbox_rows(db)
    shown = {}
    for row in rows:
        done = resetctl("outbox", "show", row["message_id"], "--json", "--db", str(db))
        assert done.returncode == 0, done.stderr
        shown[row["channel"]] = json.loads(done.stdout)

    assert [set(r) for r in rows] == [OUTBOX_ROW_KEYS, OUTBOX_ROW_KEYS]
    assert {(r["channel"], r["status"]) for r in rows} == {("email", "failed"), ("sms", "delivered")}
    assert {r["attempt_key"] for r in rows} == {f"{notice_id}:email:1", f"{notice_id}:sms:1"}
    assert shown["email"].keys() >= {"subject", "text", "html"}
    assert reset_url in shown["email"]["text"]
    assert reset_url not in shown["email"]["subject"]
    assert reset_url in shown["sms"]["body"]


def test_outbox_set_status_changes_what_the_next_poll_reads(
    tmp_path: Path, pending_config: Path
) -> None:
    """set-status scripts the status the transport reports on the next poll."""
    db = tmp_path / "r.db"
    enqueue_ok(db, request(), config=pending_config)
    sweep_json(db, pending_config)
    [row] = outbox_rows(db)

    done = resetctl("outbox", "set-status", row["message_id"], "delivered", "--db", str(db))

    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in outbox_rows(db)] == ["delivered"]
    with Store(db) as store:
        read = OutboxTransport(store, "pending", time.time).status(row["message_id"])
    assert read.status is Status.DELIVERED


@pytest.mark.parametrize(
    ("target", "status", "exit_code", "message"),
    [
        ("real", "read", 2, "error: status: must be one of"),
        ("obx_0000000000000000", "failed", 1, "error: no outbox message 'obx_0000000000000000'"),
    ],
)
def test_outbox_set_status_rejects_bad_status_or_unknown_message(
    tmp_path: Path, pending_config: Path, target: str, status: str, exit_code: int, message: str
) -> None:
    """A status outside the vocabulary exits 2; an unknown message exits 1; nothing changes."""
    db = tmp_path / "r.db"
    enqueue_ok(db, request(), config=pending_config)
    sweep_json(db, pending_config)
    with sqlite3.connect(db) as conn:
        [(message_id,)] = conn.execute("SELECT message_id FROM outbox").fetchall()

    done = resetctl("outbox", "set-status", message_id if target == "real" else target, status, db=db)

    assert done.returncode == exit_code
    assert done.stderr.startswith(message)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM outbox").fetchall() == [("pending",)]


def test_outbox_show_unknown_message_exits_1(tmp_path: Path) -> None:
    """Showing a message that does not exist is a one-line error and exit 1."""
    done = resetctl("outbox", "show", "obx_0000000000000000", "--json", db=tmp_path / "r.db")

    assert done.returncode == 1
    assert done.stderr.splitlines() == ["error: no outbox message 'obx_0000000000000000'"]


def test_db_option_wins_over_the_environment(tmp_path: Path) -> None:
    """--db names the file; RESETCTL_DB is used when --db is absent."""
    flagged, from_env = tmp_path / "flag.db", tmp_path / "env.db"

    by_flag = resetctl("enqueue", "--db", str(flagged), db=from_env, input=jsonl(request()))
    by_env = resetctl("enqueue", db=from_env, input=jsonl(request(), request()))

    assert (by_flag.returncode, by_env.returncode) == (0, 0), by_flag.stderr + by_env.stderr
    assert (table_count(flagged, "notices"), table_count(from_env, "notices")) == (1, 2)


def test_config_from_the_environment_is_used(tmp_path: Path) -> None:
    """RESETCTL_CONFIG selects the TOML file: its region policy resolves at enqueue."""
    db = tmp_path / "r.db"
    config = write_config(
        tmp_path, '[policy.apac]\nversion = 4\nchannels = ["sms", "email"]\nttl = "15m"\n'
    )
    done = resetctl(
        "enqueue", db=db, input=jsonl(request(region="apac")), env={"RESETCTL_CONFIG": str(config)}
    )
    assert done.returncode == 0, done.stderr
    notice_id = json.loads(done.stdout)["notice_id"]

    report = inspect_json(db, notice_id)

    assert (report["policy"], report["policy_version"]) == ("apac", 4)
    assert report["channels"] == ["sms", "email"]
    assert 840 < report["remaining_seconds"] <= 900


BAD_CONFIGS = [
    ('[policy.default]\nfallback_reserve = "20m"\n', "policy.default.fallback_reserve"),
    ('[policy.eu]\nchannels = ["email", "fax"]\n', "policy.eu.channels"),
    ("[policy.default]\nlease = 0\n", "policy.default.lease"),
    ("[policy.default.email]\npoll_delays = [15, 600]\n", "policy.default.email.poll_delays"),
    ('[policy.default]\non_poll_budget_spent = "shrug"\n', "policy.default.on_poll_budget_spent"),
    ("[policy.default]\nbatchsize = 5\n", "policy.default.batchsize"),
    ('[outbox]\nemail_status = "sent"\n', "outbox.email_status"),
    ("support_label = 3\n", "support_label"),
    ("[policy.default\n", "resetctl.toml"),
]


@pytest.mark.parametrize(("text", "key"), BAD_CONFIGS)
def test_bad_config_exits_2_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    """An invalid config file is refused with exit 2 and a message naming the key."""
    config = write_config(tmp_path, text)

    done = resetctl("sweep", "--config", str(config), db=tmp_path / "r.db")

    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert key in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["enqueue"],
        ["sweep"],
        ["inspect", "ntc_0000000000000000"],
        ["outbox", "list"],
        ["outbox", "show", "obx_0000000000000000"],
        ["outbox", "set-status", "obx_0000000000000000", "failed"],
    ],
)
def test_every_command_reads_the_config_from_the_environment(
    tmp_path: Path, command: list[str]
) -> None:
    """Each command loads RESETCTL_CONFIG and refuses a bad one before doing anything."""
    config = write_config(tmp_path, '[policy.default]\nfallback_reserve = "20m"\n')
    db = tmp_path / "r.db"

    done = resetctl(
        *command, db=db, input=jsonl(request()), env={"RESETCTL_CONFIG": str(config)}
    )

    assert done.returncode == 2
    assert "policy.default.fallback_reserve: must be shorter than ttl" in done.stderr
    assert not db.exists() or table_count(db, "notices") == 0


def test_demo_ends_with_every_sample_terminal(tmp_path: Path) -> None:
    """The demo prints transitions and finishes with every sample notice terminal."""
    db = tmp_path / "demo.db"

    done = resetctl("demo", "--db", str(db))

    assert done.returncode == 0, done.stderr
    assert "→" in done.stdout
    finals = re.findall(r"^(ntc_[0-9a-f]+)\s+(\w+)\s+\S", done.stdout, flags=re.MULTILINE)
    assert len(finals) == 5
    assert {phase for _, phase in finals} <= TERMINAL
    assert {"accepted", "expired"} <= {phase for _, phase in finals}
    with sqlite3.connect(db) as conn:
        phases = {row[0] for row in conn.execute("SELECT phase FROM notices")}
        (secrets,) = conn.execute("SELECT count(*) FROM notice_secrets").fetchone()
    assert phases <= TERMINAL
    assert secrets == 0
