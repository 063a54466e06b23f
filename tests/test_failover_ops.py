"""What on-call sees of provider instances: each one's state, failures and calls in
`health` and the metrics, and an alert once a channel has no instance left in use."""

from __future__ import annotations

from pathlib import Path

from conftest import T0, database_clock_at, make_settings
from prometheus_client.parser import text_string_to_metric_families

from resetctl import api
from resetctl.config import Settings
from resetctl.instances import Failover
from resetctl.ops import AlertLevel
from resetctl.store import Store

FAILOVER = Failover(after=2, window=60, cooldown=30)


def _settings() -> Settings:
    return make_settings(
        transport={"sms": ["sms_main", "sms_backup"]},
        providers={
            "sms_main": {"kind": "outbox"},
            "sms_backup": {"kind": "outbox"},
        },
        failover={"after": 2, "cooldown": "30s"},
    )


def _fail(store: Store, instance: str, at: float, times: int = 2) -> None:
    store.record_instance_calls([(instance, True)] * times, at, FAILOVER)


def test_health_shows_each_instance_state_failures_and_what_is_in_use(
    store: Store, db: str
) -> None:
    """An instance opened by its failures reads open, with its counts, until its
    cooldown ends; the channel's instances in use leave it out meanwhile."""
    _fail(store, "sms_main", T0)
    database_clock_at(db, T0 + 5)  # health reads the database's clock on PostgreSQL
    handle = api.open(db, _settings(), clock=lambda: T0 + 5)
    report = handle.health()["providers"]
    assert report["instances"]["sms_main"] == {
        "state": "open",
        "failures_in_a_row": 2,
        "failures": 2,
        "opened": 1,
        "open_until": "2026-01-01T00:00:30Z",
        "calls": 0,
    }
    assert report["instances"]["sms_backup"]["state"] == "closed"
    assert report["in_use"]["sms"] == ["sms_backup"]
    database_clock_at(db, T0 + 31)
    later = api.open(db, _settings(), clock=lambda: T0 + 31)
    assert later.health()["providers"]["instances"]["sms_main"]["state"] == "half_open"


def test_an_alert_fires_when_a_channel_has_no_instance_left(store: Store, db: str) -> None:
    """One instance down is failover doing its job; both down pages, naming the channel
    and when the first may be probed."""
    _fail(store, "sms_main", T0)
    handle = api.open(db, _settings(), clock=lambda: T0 + 5)
    assert handle.alerts(peek=True).providers_down == []

    _fail(store, "sms_backup", T0 + 2)
    report = handle.alerts(peek=True)
    assert report.level is AlertLevel.CRITICAL
    (down,) = report.providers_down
    assert down.to_json() == {
        "alert": "resetctl_no_healthy_provider",
        "level": "critical",
        "channel": "sms",
        "instances": ["sms_main", "sms_backup"],
        "probe_from": "2026-01-01T00:00:30Z",
    }
    after_cooldown = api.open(db, _settings(), clock=lambda: T0 + 31)
    assert after_cooldown.alerts(peek=True).providers_down == []


def test_metrics_carry_each_instance_state_and_the_channel_gauge(
    store: Store, db: str, tmp_path: Path
) -> None:
    """The scrape has one state sample per instance and state, the failure and opening
    counters, and how many instances each channel has in use (what the rule pages on)."""
    _fail(store, "sms_main", T0)
    textfile = tmp_path / "resetctl.prom"
    api.open(db, _settings(), clock=lambda: T0 + 5).write_metrics(textfile)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(textfile.read_text())
        for s in family.samples
    }
    assert samples[("resetctl_provider_state", (("provider", "sms_main"), ("state", "open")))] == 1
    assert (
        samples[("resetctl_provider_state", (("provider", "sms_main"), ("state", "closed")))] == 0
    )
    assert samples[("resetctl_provider_failures_total", (("provider", "sms_main"),))] == 2
    assert samples[("resetctl_provider_opened_total", (("provider", "sms_main"),))] == 1
    assert samples[("resetctl_channel_providers_in_use", (("channel", "sms"),))] == 1
    assert samples[("resetctl_channel_providers_in_use", (("channel", "email"),))] == 1
