"""Retiring a template version: while live notices still use it, a sweep refuses to start,
`templates check` fails naming it, and `health` shows the live notices on each version.

Built the way it broke: a templates dir with v1 and v2, notices enqueued under a v1
policy, then the config moved to v2 and v1 removed (or broken).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import time_machine
from click.testing import Result
from conftest import T0, FakeClock, database_clock_at, make_settings, reset_request, resetctl
from typer.testing import CliRunner

from resetctl.cli import app
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.render import templates_root
from resetctl.store import Store
from resetctl.store.operations import LIVE_POLICY_COUNTS_SQL
from resetctl.templates import check_version, require_templates

#: What every refusal tells the operator to do.
KEEP = "keep a version until health shows no live notice on it"
RETIREMENTS = ["missing", "broken"]


@dataclass(frozen=True)
class Rollout:
    """A templates dir holding v1 and v2, and the config before and after the switch."""

    root: Path
    #: policy.default version 1 renders v1; version 2 renders v2
    before: Settings
    after: Settings
    after_toml: Path


def _settings(root: Path, version: int, template: str, **policy: Any) -> Settings:
    return make_settings(
        templates={"dir": str(root)},
        policy={"default": {"version": version, "template_version": template, **policy}},
    )


@pytest.fixture(autouse=True)
def _database_at_t0(request: pytest.FixtureRequest) -> None:
    """The commands run at T0 under time-machine; on PostgreSQL their decisions read the
    database's clock, which is set to T0 too."""
    if "db" in request.fixturenames:
        database_clock_at(request.getfixturevalue("db"), T0 + 1)


@pytest.fixture
def rollout(tmp_path: Path) -> Rollout:
    root = tmp_path / "templates"
    for version in ("v1", "v2"):
        shutil.copytree(templates_root() / "v1", root / version)
    after_toml = tmp_path / "v2.toml"
    after_toml.write_text(
        f'[templates]\ndir = "{root}"\n[policy.default]\nversion = 2\ntemplate_version = "v2"\n',
        encoding="utf-8",
    )
    return Rollout(root, _settings(root, 1, "v1"), _settings(root, 2, "v2"), after_toml)


def _enqueue(store: Store, settings: Settings, count: int, now: float) -> list[str]:
    results = enqueue(store, settings, [reset_request() for _ in range(count)], now)
    return [r.notice_id for r in results]


def _retire_v1(root: Path, how: str) -> None:
    if how == "missing":
        shutil.rmtree(root / "v1")
    else:
        (root / "v1" / "sms.mustache").unlink()


def _refusal(root: Path, how: str, count: int) -> str:
    """The one line naming v1 and the live notices that still use it."""
    used = f"and {count} live notice{' uses' if count == 1 else 's use'} it"
    if how == "missing":
        return f"templates: version v1 is missing from {root}, {used}; restore it ({KEEP})"
    return (
        f"templates: version v1 fails its check (v1/sms.mustache: missing), {used};"
        f" restore it (see resetctl templates check --version v1; {KEEP})"
    )


def _notice_rows(store: Store) -> list[tuple[Any, ...]]:
    """Each notice's phase, due time, row version and lease: what a sweep would change."""
    rows = store.conn.execute(
        "SELECT id, phase, due_at, version, lease_owner, lease_token FROM notices ORDER BY id"
    ).fetchall()
    return [tuple(row) for row in rows]


def _phases(store: Store, notice_ids: list[str]) -> set[str]:
    loaded = [store.load_notice(n) for n in notice_ids]
    return {n.state.phase.value for n in loaded if n is not None}


def _count(store: Store, table: str) -> int:
    (count,) = store.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(count)


def _cli(*args: str, now: float = T0 + 1) -> Result:
    """The command line in-process at ``now`` (stdout and stderr apart), as a process
    of its own: it has checked no template version yet."""
    check_version.cache_clear()
    with time_machine.travel(now, tick=False):
        return CliRunner().invoke(app, list(args), env={"RESETCTL_DB": ""})


def test_store_counts_live_notices_per_stored_policy(
    db: str, store: Store, rollout: Rollout, clock: FakeClock
) -> None:
    """Live notices are counted by the policy record they were enqueued under (which
    names their template version); finished notices are not counted."""
    finished = _enqueue(store, rollout.before, 2, clock())
    assert _cli("sweep", "--db", db, "--config", str(rollout.after_toml)).exit_code == 0
    assert _phases(store, finished) == {"accepted"}
    _enqueue(store, rollout.before, 3, clock())
    _enqueue(store, rollout.after, 1, clock())

    counted = [(p.name, p.version, p.template_version, n) for p, n in store.live_policy_counts()]

    assert counted == [("default", 1, "v1", 3), ("default", 2, "v2", 1)]


def test_live_counts_read_only_the_index_over_live_notices(
    db: str, store: Store, rollout: Rollout, clock: FakeClock
) -> None:
    """The count reads notices through the partial index over live ones, never the
    finished notices."""
    finished = _enqueue(store, rollout.before, 200, clock())
    assert _cli("sweep", "--db", db, "--config", str(rollout.after_toml)).exit_code == 0
    assert _phases(store, finished) == {"accepted"}
    _enqueue(store, rollout.before, 3, clock())
    if store.backend == "sqlite":
        store.conn.execute("ANALYZE")
        explained = store.conn.execute("EXPLAIN QUERY PLAN " + LIVE_POLICY_COUNTS_SQL)
        plan = [str(row[-1]) for row in explained]
        on_notices = [line for line in plan if re.search(r"\bnotices\b", line)]
        assert on_notices
        assert all("USING INDEX notices_due" in line for line in on_notices), plan
    else:
        # A table this small is cheaper to scan whole: forbid that, to see the index used.
        store.conn.execute("ANALYZE notices")
        store.conn.execute("SET enable_seqscan = off")
        plan = [str(row[0]) for row in store.conn.execute("EXPLAIN " + LIVE_POLICY_COUNTS_SQL)]
        assert any("notices_due" in line for line in plan), plan
        assert not any("Seq Scan on notices" in line for line in plan), plan


@pytest.mark.slow
@pytest.mark.parametrize("how", RETIREMENTS)
def test_sweep_refuses_while_live_notices_use_a_retired_version(
    db: str, store: Store, rollout: Rollout, clock: FakeClock, how: str
) -> None:
    """`resetctl sweep` exits 2 naming v1 and its 3 live notices, sends nothing and
    changes no notice."""
    _enqueue(store, rollout.before, 3, clock())
    _retire_v1(rollout.root, how)
    before = _notice_rows(store)

    swept = resetctl("sweep", "--config", str(rollout.after_toml), db=db)

    assert swept.returncode == 2
    assert swept.stdout == ""
    assert swept.stderr == f"error: {_refusal(rollout.root, how, 3)}\n"
    assert _notice_rows(store) == before
    assert [_count(store, t) for t in ("attempts", "events", "outbox")] == [0, 0, 0]


@pytest.mark.parametrize("how", RETIREMENTS)
def test_templates_check_lists_versions_in_use_beside_configured_and_fails(
    db: str, store: Store, rollout: Rollout, clock: FakeClock, how: str
) -> None:
    """`templates check --db` shows v2 configured, v1 and v2 in use with their counts,
    and exits 2 naming v1 once it is retired; before that it passes."""
    _enqueue(store, rollout.before, 3, clock())
    _enqueue(store, rollout.after, 1, clock())
    args = ("templates", "check", "--db", db, "--config", str(rollout.after_toml))
    summary = "configured: v2 (policy.default)\nin use: v1 (3 live notices), v2 (1 live notice)\n"
    passed = _cli(*args)
    assert passed.exit_code == 0, passed.output
    assert passed.stdout.startswith(summary)

    _retire_v1(rollout.root, how)
    text = _cli(*args)
    shown = _cli(*args, "--json")

    assert text.exit_code == 2
    assert text.stdout.startswith(summary)
    assert "\nv1: FAIL\n" in text.stdout
    assert "\nv2: ok\n" in text.stdout
    assert text.stderr == f"error: {_refusal(rollout.root, how, 3)}\n"
    assert shown.exit_code == 2
    entries = {
        (e["version"], e["locale"]): (e["ok"], e["policies"], e["live_notices"])
        for e in json.loads(shown.stdout)
    }
    assert entries[("v1", None)] == (False, [], 3)
    assert entries[("v2", None)] == (True, ["default"], 1)
    assert entries[("v2", "es")] == (True, ["default"], 1)


def test_templates_check_without_a_database_checks_the_configured_versions(
    tmp_path: Path, rollout: Rollout
) -> None:
    """With no database there is no notice in flight: the configured versions are
    checked as before, and no database file is created."""
    _retire_v1(rollout.root, "missing")
    missing = tmp_path / "none.db"

    result = _cli("templates", "check", "--db", str(missing), "--config", str(rollout.after_toml))

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        f"configured: v2 (policy.default)\nin use: none (no database at {missing})\nv2: ok\n"
    )
    assert not any(p.name.startswith("none.db") for p in tmp_path.iterdir())


def test_health_shows_live_notices_per_template_version(
    db: str, store: Store, rollout: Rollout, clock: FakeClock
) -> None:
    """`health` (text and --json) counts live notices per template version; finished
    notices are not counted."""
    _enqueue(store, rollout.before, 2, clock())
    assert _cli("sweep", "--db", db, "--config", str(rollout.after_toml)).exit_code == 0
    _enqueue(store, rollout.before, 3, clock())
    _enqueue(store, rollout.after, 1, clock())
    _retire_v1(rollout.root, "missing")

    shown = _cli("health", "--json", "--db", db)
    text = _cli("health", "--db", db)

    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["live_by_template_version"] == {"v1": 3, "v2": 1}
    assert text.exit_code == 0, text.output
    assert re.search(r"live by template version\s*│\s*v1 3, v2 1\s", text.stdout), text.stdout


def test_sweep_starts_once_the_v1_notices_have_finished(
    db: str, store: Store, rollout: Rollout, clock: FakeClock
) -> None:
    """Refused while v1's notices live; with v1 restored they finish; then v1 can go,
    health shows none on it, and the sweep starts and sends a v2 notice."""
    v1_notices = _enqueue(store, rollout.before, 3, clock())
    _retire_v1(rollout.root, "missing")
    sweep = ("sweep", "--json", "--db", db, "--config", str(rollout.after_toml))
    refused = _cli(*sweep)
    assert refused.exit_code == 2
    assert refused.stderr == f"error: {_refusal(rollout.root, 'missing', 3)}\n"

    shutil.copytree(templates_root() / "v1", rollout.root / "v1")
    restored = _cli(*sweep)
    assert restored.exit_code == 0, restored.output
    assert _phases(store, v1_notices) == {"accepted"}
    health = _cli("health", "--json", "--db", db)
    assert json.loads(health.stdout)["live_by_template_version"] == {}

    _retire_v1(rollout.root, "missing")
    [v2_notice] = _enqueue(store, rollout.after, 1, clock())
    started = _cli(*sweep)

    assert started.exit_code == 0, started.output
    assert json.loads(started.stdout)["claimed"] == 1
    assert [a["template_version"] for a in store.attempt_rows(v2_notice)] == ["v2"]


def test_a_retired_version_is_checked_with_the_limits_its_notices_were_enqueued_under(
    rollout: Rollout,
) -> None:
    """v1's notices were enqueued allowing 2 SMS segments: the new policy's 1 does not
    fail v1, their own limit does."""
    sms = rollout.root / "v1" / "sms.mustache"
    sms.write_text(sms.read_text() + "Questions? Reply HELP, or write to our support team.\n" * 2)
    after = _settings(rollout.root, 2, "v2", sms={"max_segments": 1})
    roomy = _settings(rollout.root, 1, "v1", sms={"max_segments": 2}).default_policy
    tight = _settings(rollout.root, 1, "v1", sms={"max_segments": 1}).default_policy

    require_templates(after, [(roomy, 3)])
    with pytest.raises(ConfigError) as refused:
        require_templates(after, [(tight, 3)])

    assert str(refused.value).startswith(
        "templates: version v1 fails its check (v1/sms.mustache: needs 2 segments (gsm7)"
    )
    assert str(refused.value).endswith(
        f"and 3 live notices use it; restore it (see resetctl templates check --version v1; {KEEP})"
    )


def test_a_broken_configured_version_says_how_many_live_notices_use_it(rollout: Rollout) -> None:
    """A policy's own version failing its check names the policy first, then the count."""
    (rollout.root / "v2" / "sms.mustache").unlink()

    with pytest.raises(ConfigError) as refused:
        require_templates(rollout.after, [(rollout.after.default_policy, 1)])

    assert str(refused.value) == (
        "policy.default.template_version: 'v2' fails its check: v2/sms.mustache: missing,"
        " and 1 live notice uses it; see resetctl templates check --version v2"
    )
