"""Release-blocking: contact data and reset URLs never leave the secrets row.

Notices carrying distinctive canary values run end to end through the real command line
(an enqueue rejected by a bad line, an email accepted, an email bounced to SMS, a link too
short for its fallback, an SMS too long to send, and an email still awaiting its poll),
with transition logging on. Then every surface an operator or a log pipeline sees is
searched for the canaries: enqueue's errors, sweep's output and logs (text and JSON),
`inspect` in both formats, `health --telemetry --storage --json`, the metrics textfile
(distributions and counters), and every table but the secrets row and the outbox (the
development mail catcher, which holds rendered messages by design).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import resetctl

#: Policies shared by every config, so the stored policy records agree.
POLICIES = """
[policy.textonly]
channels = ["sms"]
[policy.textonly.sms]
max_segments = 1
"""
CONFIGS = {
    "accepting": POLICIES,
    "bouncing": '[outbox]\nemail_status = "failed"\n' + POLICIES,
    "pending": '[outbox]\nemail_status = "pending"\n' + POLICIES,
}


@dataclass(frozen=True)
class Canary:
    """One notice's request, every field a value that must never leak."""

    label: str
    config: str
    expected_phase: str
    email: str
    phone: str
    token: str
    display_name: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reset_url(self) -> str:
        return f"https://shop.example/reset/{self.token}"

    def request(self) -> dict[str, Any]:
        return {
            "idempotency_key": f"privacy-{self.label}",
            "email": self.email,
            "phone": self.phone,
            "reset_url": self.reset_url,
            "display_name": self.display_name,
            **self.extra,
        }

    def secrets(self) -> list[str]:
        return [
            self.email,
            self.email.split("@")[0],
            self.phone,
            self.phone.removeprefix("+"),
            self.reset_url,
            self.token,
            self.display_name,
        ]


# A URL long enough that the one-segment SMS policy refuses to render it.
LONG_TOKEN = "CANARY-TOKEN-longsms-" + "7c2d9e" * 12

CANARIES = [
    Canary(
        "accepted",
        "accepting",
        "accepted",
        "zq.privacy.canary@example.org",
        "+61491570157",
        "CANARY-TOKEN-8f3e1c",
        "Quokka Canary-Alpha",
    ),
    Canary(
        "fallback",
        "bouncing",
        "accepted",
        "zq.fallback.canary@example.org",
        "+61491570158",
        "CANARY-TOKEN-2b7a44",
        "Quokka Canary-Bravo",
    ),
    Canary(
        "expired",
        "bouncing",
        "expired",
        "zq.expired.canary@example.org",
        "+61491578813",
        "CANARY-TOKEN-9d01f5",
        "Quokka Canary-Charlie",
        {"ttl": "2m"},
    ),
    Canary(
        "refused",
        "bouncing",
        "failed",
        "zq.refused.canary@example.org",
        "+61491579212",
        LONG_TOKEN,
        "Quokka Canary-Delta",
        {"region": "textonly"},
    ),
    Canary(
        "waiting",
        "pending",
        "primary_pending",
        "zq.waiting.canary@example.org",
        "+61491570110",
        "CANARY-TOKEN-e5c3a0",
        "Quokka Canary-Echo",
    ),
]

#: The invalid second line of the rejected enqueue: each value must not be echoed.
BAD_LINE = {
    "idempotency_key": "privacy-bad-line",
    "email": "zq.badmail.canary@@example.org",
    "phone": "+447700900123",
    "reset_url": "http://shop.example/reset/CANARY-TOKEN-badurl-5a7b",
    "display_name": "Quokka\u0007Canary-Bell",
}
BAD_SECRETS = [
    "zq.badmail.canary",
    "+447700900123",
    "447700900123",
    "CANARY-TOKEN-badurl-5a7b",
    "Canary-Bell",
]
ALL_SECRETS = [s for c in CANARIES for s in c.secrets()] + BAD_SECRETS + ["Quokka"]
SCANNED_TABLES = ["events", "attempts", "observations", "notices", "policies", "meta"]


@dataclass
class Journey:
    """What the end-to-end run left behind."""

    db: Path
    rejected: Any = None
    sweeps: dict[str, Any] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    created: dict[str, bool] = field(default_factory=dict)
    inspect_json: dict[str, str] = field(default_factory=dict)
    inspect_text: dict[str, str] = field(default_factory=dict)
    #: what health --telemetry --storage --json and the metrics textfile show
    numbers: dict[str, str] = field(default_factory=dict)


def jsonl(*requests: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


def table_text(db: Path, table: str) -> str:
    with sqlite3.connect(db) as conn:
        return "\n".join(repr(row) for row in conn.execute(f"SELECT * FROM {table}"))


@pytest.fixture(scope="module")
def journey(tmp_path_factory: pytest.TempPathFactory) -> Journey:
    """Run every canary notice through the CLI once; later tests only read the results."""
    root = tmp_path_factory.mktemp("privacy")
    run = Journey(db=root / "privacy.db")
    configs = {}
    for name, text in CONFIGS.items():
        configs[name] = root / f"{name}.toml"
        configs[name].write_text(text, encoding="utf-8")

    first = CANARIES[0]
    run.rejected = resetctl(
        "enqueue",
        "--config",
        str(configs[first.config]),
        db=run.db,
        input=jsonl(first.request(), BAD_LINE),
    )
    for config in CONFIGS:
        batch = [c for c in CANARIES if c.config == config]
        done = resetctl(
            "enqueue",
            "--config",
            str(configs[config]),
            db=run.db,
            input=jsonl(*(c.request() for c in batch)),
        )
        assert done.returncode == 0, done.stderr
        for canary, line in zip(batch, done.stdout.splitlines(), strict=True):
            result = json.loads(line)
            run.ids[canary.label] = result["notice_id"]
            run.created[canary.label] = result["created"]
        run.sweeps[config] = resetctl(
            "sweep",
            "--json",
            "--config",
            str(configs[config]),
            db=run.db,
            # One sweep logs JSON lines (with the attempt key and poll count).
            env={"RESETCTL_LOG_LEVEL": "INFO"}
            | ({"RESETCTL_LOG_FORMAT": "json"} if config == "pending" else {}),
        )
    health = resetctl("health", "--json", "--telemetry", "--storage", db=run.db)
    textfile = run.db.parent / "resetctl.prom"
    metrics = resetctl("metrics", "--textfile", str(textfile), db=run.db)
    assert (health.returncode, metrics.returncode) == (0, 0), health.stderr + metrics.stderr
    run.numbers["health --telemetry"] = health.stdout + health.stderr
    run.numbers["metrics"] = textfile.read_text() + metrics.stderr
    for label, notice_id in run.ids.items():
        as_json = resetctl("inspect", notice_id, "--json", db=run.db)
        as_text = resetctl("inspect", notice_id, db=run.db, env={"COLUMNS": "200"})
        assert (as_json.returncode, as_text.returncode) == (0, 0), as_json.stderr + as_text.stderr
        run.inspect_json[label] = as_json.stdout + as_json.stderr
        run.inspect_text[label] = as_text.stdout + as_text.stderr
    return run


def surfaces(run: Journey) -> dict[str, str]:
    """Every output and table an operator, a log pipeline or a backup sees."""
    found = {
        "enqueue errors": run.rejected.stdout + run.rejected.stderr,
        "inspect --json": "\n".join(run.inspect_json.values()),
        "inspect text": "\n".join(run.inspect_text.values()),
    }
    for config, done in run.sweeps.items():
        found[f"sweep {config} output and logs"] = done.stdout + done.stderr
    for table in SCANNED_TABLES:
        found[f"table {table}"] = table_text(run.db, table)
    found.update(run.numbers)
    return found


SURFACES = [
    "enqueue errors",
    "inspect --json",
    "inspect text",
    *(f"sweep {config} output and logs" for config in CONFIGS),
    *(f"table {table}" for table in SCANNED_TABLES),
    "health --telemetry",
    "metrics",
]


def test_every_path_was_taken(journey: Journey) -> None:
    """The journey reached each intended phase, so the scans below are not vacuous."""
    phases = {label: json.loads(report)["phase"] for label, report in journey.inspect_json.items()}

    assert phases == {c.label: c.expected_phase for c in CANARIES}
    assert all(done.returncode == 0 for done in journey.sweeps.values())
    assert "INFO resetctl transition" in journey.sweeps["accepting"].stderr
    assert "submission failed" in journey.sweeps["bouncing"].stderr
    assert '"attempt_key":' in journey.sweeps["pending"].stderr
    assert "resetctl_sms_segments_total" in journey.numbers["metrics"]
    assert json.loads(journey.sweeps["bouncing"].stdout)["escalated"] == 1


def test_rejected_enqueue_lists_errors_and_writes_nothing(journey: Journey) -> None:
    """The bad second line fails the whole enqueue with errors by field, not by value."""
    errors = journey.rejected.stderr

    assert journey.rejected.returncode == 2
    assert journey.rejected.stdout == ""
    for fragment in (
        "line 2: email: not a valid email address",
        "line 2: phone: not a valid E.164 number",
        "line 2: reset_url: must be an absolute https:// URL",
        "line 2: display_name: contains control characters",
    ):
        assert fragment in errors
    assert "line 1" not in errors
    # Its valid first line was not written: enqueued again later, it was new.
    assert journey.created["accepted"] is True


@pytest.mark.parametrize("surface", SURFACES)
def test_no_secret_reaches(journey: Journey, surface: str) -> None:
    """No email, phone (with or without '+'), reset URL, token or display name appears."""
    text = surfaces(journey)[surface]

    leaked = [secret for secret in ALL_SECRETS if secret in text]

    assert text.strip(), f"{surface} is empty: the scan would prove nothing"
    assert leaked == []


@pytest.mark.parametrize("canary", CANARIES, ids=lambda c: c.label)
def test_secrets_are_scrubbed_once_terminal(journey: Journey, canary: Canary) -> None:
    """A terminal notice has no secrets row; a live one keeps it for the next worker."""
    with sqlite3.connect(journey.db) as conn:
        rows = conn.execute(
            "SELECT email, phone, reset_url, display_name FROM notice_secrets WHERE notice_id = ?",
            (journey.ids[canary.label],),
        ).fetchall()

    if canary.expected_phase == "primary_pending":
        assert rows == [(canary.email, canary.phone, canary.reset_url, canary.display_name)]
    else:
        assert rows == []


def test_the_only_secrets_rows_belong_to_live_notices(journey: Journey) -> None:
    """Nothing from the rejected enqueue or a finished notice survives in notice_secrets."""
    with sqlite3.connect(journey.db) as conn:
        owners = [row[0] for row in conn.execute("SELECT notice_id FROM notice_secrets")]

    assert owners == [journey.ids["waiting"]]
