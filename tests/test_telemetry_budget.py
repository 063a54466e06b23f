"""`health --telemetry`: bytes per day measured from the encoded rows and log lines, and
the size each region's retention keeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, resetctl, run_sweep

from resetctl import ops
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.telemetry import LOGGER, configure_logging

DAY = 86400.0
SETTINGS = make_settings(
    outbox={"email_status": "failed", "sms_status": "pending"},
    policy={"default": {}, "eu": {"retention": "7d"}},
)


@pytest.fixture
def log_bytes(capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """The bytes of the JSON transition lines written since the last call."""
    handlers, level, propagate = LOGGER.handlers[:], LOGGER.level, LOGGER.propagate
    configure_logging("json", "info")

    def read() -> int:
        lines = capsys.readouterr().err.splitlines(keepends=True)
        return sum(len(line.encode("utf-8")) for line in lines if '"transition"' in line)

    yield read
    LOGGER.handlers[:], LOGGER.propagate = handlers, propagate
    LOGGER.setLevel(level)


def _traffic(store: Store) -> None:
    enqueue(store, SETTINGS, [reset_request() for _ in range(6)], T0)
    enqueue(store, SETTINGS, [reset_request(region="eu") for _ in range(3)], T0)
    run_sweep(store, SETTINGS, FakeClock(T0), max_runtime=900)


def test_log_bytes_are_the_lines_the_sweep_wrote(store: Store, log_bytes: Any) -> None:
    """Logs per day add up to the bytes of the JSON lines the sweep wrote (one day)."""
    _traffic(store)
    written = log_bytes()
    budget = ops.telemetry(store, SETTINGS.policies, 30 * DAY, 1.0)
    assert written > 0
    assert budget["bytes_per_day"]["logs"] == written
    assert budget["bytes_per_day"]["logs_kept"] == written


def test_sampling_shrinks_only_the_kept_log_bytes(store: Store) -> None:
    """At sample_success = 0 the kept lines are the rare ones: fewer bytes, not none."""
    _traffic(store)
    full = ops.telemetry(store, SETTINGS.policies, 30 * DAY, 1.0)["bytes_per_day"]
    sampled = ops.telemetry(store, SETTINGS.policies, 30 * DAY, 0.0)["bytes_per_day"]
    assert 0 < sampled["logs_kept"] < full["logs_kept"] == sampled["logs"]
    assert sampled["events"] == full["events"] > 0  # events are never sampled


def test_stored_bytes_are_measured_from_the_rows(store: Store) -> None:
    """Events and observations count the bytes the database holds for their rows."""
    _traffic(store)
    budget = ops.telemetry(store, SETTINGS.policies, 30 * DAY, 1.0)
    for table in ("events", "observations"):
        measured = budget["bytes_per_day"][table]
        if store.backend == "sqlite":
            # The table's own b-tree (its indexes apart): SQLite's count of record bytes,
            # which the store's encoding of each row must match exactly.
            sql = "SELECT SUM(payload) FROM dbstat WHERE name = ?"
            (held,) = store.conn.execute(sql, (table,)).fetchone()
            assert measured == held > 0, table
        else:
            # A row read through a join is sized as the composite it becomes (a varlena
            # header may widen by a few bytes), within a percent of the table's own rows.
            sql = f"SELECT SUM(pg_column_size(t.*)) FROM {table} t"
            (held,) = store.conn.execute(sql).fetchone()
            assert held > 0
            assert measured == pytest.approx(held, rel=0.01), table


def test_projection_follows_each_region_s_retention(store: Store) -> None:
    """eu keeps 7 days (its policy), default 30 (purge's --older-than)."""
    _traffic(store)
    budget = ops.telemetry(store, SETTINGS.policies, 30 * DAY, 1.0)
    eu, default = budget["by_region"]["eu"], budget["by_region"]["default"]
    assert (eu["retention_days"], eu["retention_from"]) == (7, "config")
    assert (default["retention_days"], default["retention_from"]) == (30, "older_than")
    for region, days in ((eu, 7), (default, 30)):
        stored = region["bytes_per_day"]["events"] + region["bytes_per_day"]["observations"]
        assert region["projected_bytes"] == pytest.approx(stored * days, abs=1)
        assert region["days_measured"] == 1  # a younger database counts as one day
    assert budget["projected_bytes"] == eu["projected_bytes"] + default["projected_bytes"]


def test_health_telemetry_on_the_command_line(store: Store, db: str) -> None:
    """`health --telemetry` prints the budget by region; `--json` holds the same figures."""
    _traffic(store)
    shown = resetctl("health", "--telemetry", db=db, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "telemetry budget" in shown.stdout
    assert "default" in shown.stdout
    as_json = resetctl("health", "--telemetry", "--json", db=db)
    budget = json.loads(as_json.stdout)["telemetry"]
    assert budget["by_region"]["default"]["rows"]["events"] > 0
    assert budget["sample_success"] == 1.0
    assert budget["by_region"]["eu"]["retention_from"] == "stored"  # not in this config
