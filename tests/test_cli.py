"""The real command line in child processes: output shapes, exit codes, options, env.

Each child process costs about a third of a second, so setup that is not under test
(enqueueing, sweeping) runs in-process at the real current time, which is the clock the
child processes read too.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
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
# The fleet's region "eu" has no table of its own: it goes under [policy.default].
PENDING_TOML = 'unknown_region = "default"\n[outbox]\nemail_status = "pending"\n'
BOUNCING_TOML = '[outbox]\nemail_status = "failed"\nkeep_content = true\n'
UNKNOWN_NOTICE = "ntc_0000000000000000"
UNKNOWN_MESSAGE = "obx_0000000000000000"

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


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def jsonl(*requests: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


def table_count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(count)


def write_config(directory: Path, text: str, name: str = "resetctl.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def prepare(db: Path, config: Path | None, *requests: dict[str, Any], sweep: bool) -> list[str]:
    """Enqueue (and optionally sweep) in-process, now; returns the notice ids."""
    settings: Settings = load_settings(config)
    clock = FakeClock(time.time())
    with Store(db) as store:
        ids = [r.notice_id for r in enqueue(store, settings, list(requests), clock())]
        if sweep:
            run_sweep(store, settings, clock)
    return ids


def cli_json(*args: str, db: Path, config: Path | None = None) -> Any:
    """Run a command that prints JSON; it must succeed."""
    extra = ["--config", str(config)] if config else []
    done = resetctl(*args, *extra, "--db", str(db))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass(frozen=True)
class Fleet:
    """One database swept through the CLI: a notice awaiting its poll, one that fell back."""

    db: Path
    waiting: str
    waiting_expires_at: str
    waiting_summary: dict[str, Any]
    fell_back: str
    fell_back_summary: dict[str, Any]
    reset_url: str


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """Enqueue and sweep two notices with the real CLI, under two outbox configs."""
    root = tmp_path_factory.mktemp("fleet")
    db = root / "fleet.db"
    pending = write_config(root, PENDING_TOML, "pending.toml")
    bouncing = write_config(root, BOUNCING_TOML, "bouncing.toml")
    expires_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 600))
    reset_url = "https://shop.example/reset/fleet-fallback"

    def enqueue_one(fields: dict[str, Any], config: Path) -> str:
        done = resetctl("enqueue", "--config", str(config), db=db, input=jsonl(request(**fields)))
        assert done.returncode == 0, done.stderr
        notice_id: str = json.loads(done.stdout)["notice_id"]
        return notice_id

    waiting = enqueue_one({"expires_at": expires_at, "region": "eu"}, pending)
    waiting_summary = cli_json("sweep", "--json", db=db, config=pending)
    fell_back = enqueue_one({"reset_url": reset_url}, bouncing)
    fell_back_summary = cli_json("sweep", "--json", db=db, config=bouncing)
    return Fleet(db, waiting, expires_at, waiting_summary, fell_back, fell_back_summary, reset_url)


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
    assert options <= {"--input", "--send", "--db", "--config", "--help"}


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
    assert [set(r) for r in created] == [{"notice_id", "idempotency_key", "created"}] * 2
    assert [r["idempotency_key"] for r in created] == [r["idempotency_key"] for r in requests]
    assert [r["created"] for r in created] == [True, True]
    assert [r["notice_id"] for r in replayed] == [r["notice_id"] for r in created]
    assert [r["created"] for r in replayed] == [False, False]
    assert table_count(db, "notices") == 2


def test_enqueue_reused_key_with_other_fields_exits_2(tmp_path: Path) -> None:
    """The same key with a ttl written differently is refused and changes nothing."""
    db = tmp_path / "r.db"
    original = request(ttl="10m")
    prepare(db, None, original, sweep=False)

    done = resetctl("enqueue", db=db, input=jsonl(request(), {**original, "ttl": "600"}))

    assert done.returncode == 2
    assert done.stdout == ""
    assert "line 2: idempotency_key: already used with different fields" in done.stderr
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
    assert "line 2: email: not a valid email address" in done.stderr
    assert "line 2: reset_url: must be an absolute https:// URL" in done.stderr
    assert "line 3: phone: not a valid E.164 number" in done.stderr
    assert "line 1" not in done.stderr
    assert not db.exists()


def test_enqueue_contact_the_policy_cannot_use_exits_2(tmp_path: Path) -> None:
    """An email-only request under an SMS-only policy is an input error, not a silent no-op."""
    config = write_config(tmp_path, '[policy.default]\nchannels = ["sms"]\n')

    done = resetctl(
        "enqueue", "--config", str(config), db=tmp_path / "r.db", input=jsonl(request(phone=None))
    )

    assert done.returncode == 2
    assert "line 1: email/phone:" in done.stderr


def test_sweep_json_summaries(fleet: Fleet) -> None:
    """sweep --json counts what it did: a first submission, then a bounce and a fallback."""
    assert fleet.waiting_summary.keys() >= SUMMARY_KEYS
    assert {k: fleet.waiting_summary[k] for k in SUMMARY_KEYS} == {
        "claimed": 1,
        "submitted": 1,
        "polled": 0,
        "escalated": 0,
        "expired": 0,
        "errors": 0,
    }
    assert {k: fleet.fell_back_summary[k] for k in SUMMARY_KEYS | {"accepted"}} == {
        "claimed": 1,
        "submitted": 2,
        "polled": 0,
        "escalated": 1,
        "expired": 0,
        "accepted": 1,
        "errors": 0,
    }


def _poll_hits_a_vanished_message(tmp_path: Path, db: Path) -> Path:
    """A submitted email whose first poll is due and whose message the outbox lost."""
    config = write_config(tmp_path, PENDING_TOML)
    prepare(db, config, request(), sweep=True)
    # Stand-in for the 15 s until the first poll: move the schedule back, not the clock.
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE attempts SET submitted_at = submitted_at - 20")
        conn.execute("UPDATE notices SET due_at = due_at - 20")
        conn.execute("DELETE FROM outbox")
    return config


def _sms_too_long_to_send(tmp_path: Path, db: Path) -> Path:
    """An SMS-only policy whose text, with this notice's long URL, needs too many segments."""
    config = write_config(
        tmp_path,
        '[policy.default]\nchannels = ["sms"]\n[policy.default.sms]\nmax_segments = 1\n',
    )
    long_url = "https://shop.example/reset/" + "token" * 30
    prepare(db, config, request(email=None, reset_url=long_url), sweep=False)
    return config


@pytest.mark.parametrize("arrange", [_poll_hits_a_vanished_message, _sms_too_long_to_send])
def test_sweep_exits_0_when_a_delivery_errors(
    tmp_path: Path, arrange: Callable[[Path, Path], Path]
) -> None:
    """A per-notice transport or rendering error is counted, not turned into an exit code."""
    db = tmp_path / "r.db"
    config = arrange(tmp_path, db)

    summary = cli_json("sweep", "--json", db=db, config=config)

    assert summary["errors"] == 1


def test_inspect_json_for_a_notice_waiting_on_its_first_poll(fleet: Fleet) -> None:
    """inspect --json shows phase, timing, the attempt, the due poll and the history."""
    report = cli_json("inspect", fleet.waiting, "--json", db=fleet.db)

    assert report.keys() >= REPORT_KEYS
    assert report["notice_id"] == fleet.waiting
    assert (report["phase"], report["region"], report["policy_version"]) == (
        "primary_pending",
        "eu",
        1,
    )
    assert report["expires_at"] == fleet.waiting_expires_at
    assert 500 < report["remaining_seconds"] <= 600
    assert 0 <= report["state_age_seconds"] < 60
    [attempt] = report["attempts"]
    assert attempt.keys() >= ATTEMPT_KEYS
    assert (attempt["channel"], attempt["attempt_key"], attempt["state"]) == (
        "email",
        f"{fleet.waiting}:email:1",
        "submitted",
    )
    assert attempt["last_observation"]["status"] == "pending"
    action = report["next_action"]
    assert (action["action"], action["channel"]) == ("poll", "email")
    assert action["due_in_seconds"] <= 15
    due_after_submission = _seconds(action["due_at"]) - _seconds(attempt["submitted_at"])
    assert 14 <= due_after_submission <= 16
    assert report["lease"] is None
    assert [h["kind"] for h in report["history"]] == ["intent", "outcome"]


def test_inspect_shows_a_fallback_that_was_accepted(fleet: Fleet) -> None:
    """After a bounce and an SMS fallback, both attempts and the terminal phase show."""
    report = cli_json("inspect", fleet.fell_back, "--json", db=fleet.db)
    text = resetctl("inspect", fleet.fell_back, "--db", str(fleet.db))

    assert report["phase"] == "accepted"
    assert report["next_action"] is None
    statuses = {a["channel"]: a["last_observation"]["status"] for a in report["attempts"]}
    assert statuses == {"email": "failed", "sms": "delivered"}
    assert [(h["old_phase"], h["new_phase"]) for h in report["history"]] == [
        ("queued", "primary_pending"),
        ("primary_pending", "fallback_pending"),
        ("fallback_pending", "fallback_pending"),
        ("fallback_pending", "accepted"),
    ]
    assert text.returncode == 0, text.stderr
    assert fleet.fell_back in text.stdout
    assert "phase accepted" in text.stdout
    assert "next: nothing (terminal)" in text.stdout


def test_inspect_unknown_notice_exits_1_with_one_line(tmp_path: Path) -> None:
    """An unknown id is a one-line error on stderr and exit 1."""
    Store(tmp_path / "r.db").close()
    done = resetctl("inspect", UNKNOWN_NOTICE, "--json", db=tmp_path / "r.db")

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"error: no notice '{UNKNOWN_NOTICE}'"]


def test_outbox_list_and_show_both_channels(fleet: Fleet) -> None:
    """outbox list names each message; show gives an email's parts and an SMS body."""
    rows = cli_json("outbox", "list", "--json", db=fleet.db)
    mine = [r for r in rows if r["notice_id"] == fleet.fell_back]
    shown = {
        r["channel"]: cli_json("outbox", "show", r["message_id"], "--json", db=fleet.db)
        for r in mine
    }

    assert [set(r) for r in rows] == [OUTBOX_ROW_KEYS] * 3
    assert {(r["channel"], r["status"], r["attempt_key"]) for r in mine} == {
        ("email", "failed", f"{fleet.fell_back}:email:1"),
        ("sms", "delivered", f"{fleet.fell_back}:sms:1"),
    }
    assert shown["email"].keys() >= {"subject", "text", "html"}
    assert fleet.reset_url in shown["email"]["text"]
    assert fleet.reset_url not in shown["email"]["subject"]
    assert fleet.reset_url in shown["sms"]["body"]


def test_outbox_show_unknown_message_exits_1(tmp_path: Path) -> None:
    """Showing a message that does not exist is a one-line error and exit 1."""
    Store(tmp_path / "r.db").close()
    done = resetctl("outbox", "show", UNKNOWN_MESSAGE, "--json", db=tmp_path / "r.db")

    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"error: no outbox message '{UNKNOWN_MESSAGE}'"]


@pytest.fixture
def pending_message(tmp_path: Path) -> tuple[Path, str]:
    """A database holding one submitted email whose outbox status is pending."""
    db = tmp_path / "r.db"
    prepare(db, write_config(tmp_path, PENDING_TOML), request(), sweep=True)
    with sqlite3.connect(db) as conn:
        [(message_id,)] = conn.execute("SELECT message_id FROM outbox").fetchall()
    return db, message_id


def test_outbox_set_status_changes_what_the_next_poll_reads(
    pending_message: tuple[Path, str],
) -> None:
    """set-status scripts the status the transport reports on the next poll."""
    db, message_id = pending_message

    done = resetctl("outbox", "set-status", message_id, "delivered", "--db", str(db))

    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        read = OutboxTransport(store, "pending", time.time).status(message_id)
    assert (read.raw_status, read.status) == ("delivered", Status.DELIVERED)


@pytest.mark.parametrize(
    ("target", "status", "exit_code", "message"),
    [
        (None, "read", 2, "error: status: must be one of"),
        (UNKNOWN_MESSAGE, "failed", 1, f"error: no outbox message '{UNKNOWN_MESSAGE}'"),
    ],
)
def test_outbox_set_status_rejects_bad_status_or_unknown_message(
    pending_message: tuple[Path, str],
    target: str | None,
    status: str,
    exit_code: int,
    message: str,
) -> None:
    """A status outside the vocabulary exits 2; an unknown message exits 1; nothing changes."""
    db, message_id = pending_message

    done = resetctl("outbox", "set-status", target or message_id, status, db=db)

    assert done.returncode == exit_code
    assert done.stderr.startswith(message)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM outbox").fetchall() == [("pending",)]


def test_db_option_wins_over_the_environment(tmp_path: Path) -> None:
    """--db names the file even when RESETCTL_DB names another."""
    flagged, from_env = tmp_path / "flag.db", tmp_path / "env.db"

    done = resetctl("enqueue", "--db", str(flagged), db=from_env, input=jsonl(request()))

    assert done.returncode == 0, done.stderr
    assert table_count(flagged, "notices") == 1
    assert not from_env.exists()


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
    with Store(db) as store:
        loaded = store.load_notice(json.loads(done.stdout)["notice_id"])
    assert loaded is not None
    assert (loaded.policy_name, loaded.policy_version) == ("apac", 4)
    assert loaded.state.channels == ("sms", "email")
    assert loaded.state.expires_at - loaded.created_at == pytest.approx(900)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[policy.default]\nbatchsize = 5\n", "policy.default.batchsize: unknown key"),
        ('[outbox]\nemail_status = "sent"\n', "outbox.email_status: must be one of"),
        ("[policy.default\n", "resetctl.toml"),
    ],
)
def test_bad_config_file_exits_2_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    """An invalid --config file is refused with exit 2 and a message naming the key."""
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
        ["inspect", UNKNOWN_NOTICE],
        ["outbox", "list"],
        ["outbox", "show", UNKNOWN_MESSAGE],
        ["outbox", "set-status", UNKNOWN_MESSAGE, "failed"],
    ],
)
def test_every_command_refuses_a_bad_config_from_the_environment(
    tmp_path: Path, command: list[str]
) -> None:
    """Each command loads RESETCTL_CONFIG and refuses a bad one before touching the db."""
    config = write_config(tmp_path, '[policy.default]\nfallback_reserve = "20m"\n')
    db = tmp_path / "r.db"

    done = resetctl(*command, db=db, input=jsonl(request()), env={"RESETCTL_CONFIG": str(config)})

    assert done.returncode == 2
    assert done.stderr == (
        f"error: config {config}, line 2: policy.default.fallback_reserve:"
        " must be shorter than ttl\n"
    )
    assert not db.exists()


def test_demo_ends_with_every_sample_terminal(tmp_path: Path) -> None:
    """The demo prints transitions and finishes with every sample notice terminal."""
    db = tmp_path / "demo.db"

    done = resetctl("demo", "--db", str(db))

    assert done.returncode == 0, done.stderr
    assert "primary_pending → fallback_pending" in done.stdout
    finals = re.findall(r"^(ntc_[0-9a-f]+)\s+(\w+)\s+\S", done.stdout, flags=re.MULTILINE)
    assert len(finals) == 5
    assert {phase for _, phase in finals} <= TERMINAL
    with sqlite3.connect(db) as conn:
        phases = {row[0] for row in conn.execute("SELECT phase FROM notices")}
        (secrets,) = conn.execute("SELECT count(*) FROM notice_secrets").fetchone()
    assert phases <= TERMINAL
    assert secrets == 0
