"""JSON log lines: the attempt key and poll count, and success sampling that keeps every
rare line, per notice, while the database keeps every event."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.telemetry import LOGGER, always_logged, configure_logging


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """Transition lines as the CLI's ``--log-format json`` writes them, parsed."""
    handlers, level, propagate = LOGGER.handlers[:], LOGGER.level, LOGGER.propagate
    configure_logging("json", "info")

    def read() -> list[dict[str, Any]]:
        lines = capsys.readouterr().err.splitlines()
        parsed = [json.loads(line) for line in lines if line.startswith("{")]
        return [line for line in parsed if line["message"] == "transition"]

    yield read
    LOGGER.handlers[:], LOGGER.propagate = handlers, propagate
    LOGGER.setLevel(level)


def _sampled(rate: float, **outbox: str) -> Settings:
    return make_settings(outbox=outbox, telemetry={"sample_success": rate})


def test_a_json_line_carries_the_attempt_key_and_poll_count(store: Store, json_logs: Any) -> None:
    """Each poll line names its attempt and the reads it had made, as the event does."""
    settings = make_settings(outbox={"email_status": "pending"})
    (notice,) = enqueue(store, settings, [reset_request()], T0)
    run_sweep(store, settings, FakeClock(T0), max_runtime=60)
    polls = [line for line in json_logs() if line["kind"] == "poll"]
    assert polls, "a pending email is polled"
    stored = [e for e in store.event_rows(notice.notice_id) if e["kind"] == "poll"]
    assert [(p["attempt_key"], p["polls"]) for p in polls] == [
        (e["attempt_key"], e["polls"]) for e in stored
    ]
    assert polls[0]["attempt_key"] == f"{notice.notice_id}:email:1"
    assert [p["polls"] for p in polls] == list(range(1, len(polls) + 1))


def test_sampling_keeps_every_failure_expiry_and_escalation(store: Store, json_logs: Any) -> None:
    """At sample_success = 0 only routine lines go: every rare event is still logged,
    and the database keeps every event."""
    settings = _sampled(0.0, email_status="failed", sms_status="pending")
    enqueue(store, settings, [reset_request() for _ in range(20)], T0)
    run_sweep(store, settings, FakeClock(T0), max_runtime=900)
    logged = json_logs()
    events = store.all_events()
    rare = [e for e in events if always_logged(e)]
    assert {e["new_phase"] for e in rare} >= {"fallback_pending", "expired"}
    assert any(e["status"] == "failed" for e in rare)
    key = ("notice_id", "kind", "old_phase", "new_phase", "status", "reason")
    assert sorted(tuple(str(line[k]) for k in key) for line in logged) == sorted(
        tuple(str(e[k]) for k in key) for e in rare if e["worker"] == "test-worker"
    )
    assert len(events) > len(logged)  # events are never sampled


def test_a_notice_s_routine_lines_are_kept_or_dropped_together(
    store: Store, json_logs: Any
) -> None:
    """At 0.5 about half the notices keep every line and the rest keep none."""
    settings = _sampled(0.5, email_status="pending")
    enqueue(store, settings, [reset_request() for _ in range(200)], T0)
    run_sweep(store, settings, FakeClock(T0), max_runtime=60)
    logged: dict[str, int] = defaultdict(int)
    for line in json_logs():
        logged[line["notice_id"]] += 1
    stored: dict[str, int] = defaultdict(int)
    for event in store.all_events():
        stored[event["notice_id"]] += 1
    assert all(logged[n] in (0, stored[n]) for n in stored)
    assert 60 <= sum(1 for n in stored if logged[n]) <= 140


@pytest.mark.parametrize("value", [1.5, -0.1, "0.1", True, float("nan")])
def test_sample_success_out_of_range_is_refused(value: object) -> None:
    """sample_success is a share from 0 to 1; anything else is a ConfigError."""
    with pytest.raises(ConfigError, match=r"telemetry\.sample_success"):
        make_settings(telemetry={"sample_success": value})


def test_sample_success_defaults_to_keeping_every_line() -> None:
    """Without [telemetry], every line is kept; an unknown key is refused."""
    assert make_settings().sample_success == 1.0
    assert make_settings(telemetry={"sample_success": 0.1}).sample_success == 0.1
    with pytest.raises(ConfigError, match=r"telemetry\.sample_rate: unknown key"):
        make_settings(telemetry={"sample_rate": 0.1})
