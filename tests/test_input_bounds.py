"""Absurd input is refused with the line and field named, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import T0, make_settings, reset_request
from typer.testing import CliRunner

from resetctl.cli import app
from resetctl.cli_command import MAX_PROBLEMS
from resetctl.enqueue import enqueue
from resetctl.errors import InputError
from resetctl.store import Store


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"ttl": "99999999999999999999d"}, "ttl"),
        ({"ttl": 10**400}, "ttl"),
        ({"ttl": 1e308}, "ttl"),
        ({"ttl": "25h"}, "ttl"),
        ({"expires_at": "9999-12-31T23:59:59Z"}, "expires_at"),
        ({"expires_at": "2026-01-03T00:00:01Z"}, "expires_at"),
    ],
)
def test_lifetimes_beyond_max_ttl_are_refused(
    store: Store, fields: dict[str, object], field: str
) -> None:
    """ttl or expires_at beyond the policy's max_ttl (24 h) is an input error on its field."""
    with pytest.raises(InputError) as raised:
        enqueue(store, make_settings(), [reset_request(**fields)], T0)
    assert raised.value.problems == [
        f"line 1: {field}: more than policy.default.max_ttl (24h) from now"
    ]
    assert store.phase_counts() == {}


def test_max_ttl_is_a_policy_key(store: Store) -> None:
    """A policy's own max_ttl lets a longer link through, and a ttl over it is refused."""
    roomy = make_settings(policy={"default": {"max_ttl": "48h"}})
    (result,) = enqueue(store, roomy, [reset_request(ttl="30h")], T0)
    assert result.created
    from resetctl.config import settings_from_mapping
    from resetctl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^policy\.default\.ttl: must not exceed max_ttl"):
        settings_from_mapping({"policy": {"default": {"ttl": "2h", "max_ttl": "1h"}}})


def test_an_overflowing_ttl_exits_2_and_inspect_never_sees_it(tmp_path: Path) -> None:
    """The issue's line: exit 2 naming line and field, nothing enqueued, no traceback."""
    db = tmp_path / "r.db"
    line = json.dumps(
        {
            "idempotency_key": "k",
            "email": "a@example.com",
            "reset_url": "https://x.example/r",
            "ttl": "99999999999999999999d",
        }
    )
    result = CliRunner().invoke(app, ["enqueue", "--db", str(db)], input=line + "\n")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: line 1: ttl: more than policy.default.max_ttl (24h) from now"
    ]
    assert "Traceback" not in result.output


def test_errors_stop_at_the_first_hundred_plus_a_total(tmp_path: Path) -> None:
    """100k bad lines print 100 problems and one line with the total."""
    bad = "\n".join("{}" for _ in range(100_000)) + "\n"
    result = CliRunner().invoke(app, ["enqueue", "--db", str(tmp_path / "r.db")], input=bad)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[0].startswith("error: line 1: ")
    assert lines[-1] == (
        "error: 300000 problems in total (299900 more not shown); nothing was written"
    )


def test_inspect_reads_an_absurd_expiry_stored_before_max_ttl(store: Store, db_path: Path) -> None:
    """A notice an older resetctl stored with a year-9999+ expiry still inspects."""
    (result,) = enqueue(store, make_settings(), [reset_request()], T0)
    with store.transaction() as conn:
        conn.execute("UPDATE notices SET expires_at = 8.64e24 WHERE id = ?", (result.notice_id,))
    done = CliRunner().invoke(app, ["inspect", result.notice_id, "--json", "--db", str(db_path)])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["expires_at"] == "out of range"
