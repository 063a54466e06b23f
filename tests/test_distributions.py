"""Distributions by region and the policy-aware counters, after scripted lifecycles,
before and after a purge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import T0, FakeClock, make_settings, reset_request, run_sweep
from fakes import ScriptedTransport
from prometheus_client.parser import text_string_to_metric_families

from resetctl import ops
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.observe import record_callback
from resetctl.store import Store
from resetctl.transports import Message, build_transports

DAY = 86400.0
#: A late answer, after every notice's 10-minute link died.
LATE = T0 + 700
SETTINGS = make_settings(
    outbox={"email_status": "pending", "sms_status": "pending"},
    policy={"default": {}, "smsfirst": {"channels": ["sms", "email"]}},
)


def _message(store: Store, notice_id: str, channel: str) -> str:
    return next(
        m["message_id"] for m in store.outbox_messages(notice_id) if m["channel"] == channel
    )


def _lifecycles(store: Store) -> dict[str, str]:
    """A delivered at 12 s; B failed at 40 s, then its fallback; C, D and E escalate
    and expire; then C's email is delivered, D's SMS only sent, E's SMS delivered."""
    a, b, c = (r.notice_id for r in enqueue(store, SETTINGS, [reset_request() for _ in "abc"], T0))
    d, e = (
        r.notice_id
        for r in enqueue(store, SETTINGS, [reset_request(region="smsfirst") for _ in "de"], T0)
    )
    clock = FakeClock(T0)
    run_sweep(store, SETTINGS, clock)
    record_callback(
        store, "outbox", _message(store, a, "email"), "delivered", Status.DELIVERED, T0 + 12
    )
    record_callback(store, "outbox", _message(store, b, "email"), "bounced", Status.FAILED, T0 + 40)
    clock.now = T0 + 41
    run_sweep(store, SETTINGS, clock, max_runtime=900)
    record_callback(
        store, "outbox", _message(store, c, "email"), "delivered", Status.DELIVERED, LATE
    )
    record_callback(store, "outbox", _message(store, d, "sms"), "sent", Status.ACCEPTED, LATE)
    record_callback(store, "outbox", _message(store, e, "sms"), "delivered", Status.DELIVERED, LATE)
    return {"a": a, "b": b, "c": c, "d": d, "e": e}


def _claimed_at(store: Store, notice_id: str) -> float:
    (at,) = [
        e["at"]
        for e in store.event_rows(notice_id)
        if e["new_phase"] == "fallback_pending" and e["old_phase"] != "fallback_pending"
    ]
    return float(at)


def _samples(store: Store, tmp_path: Path, now: float) -> dict[tuple[str, tuple[Any, ...]], float]:
    path = tmp_path / "metrics.prom"
    ops.write_metrics(store, path, now)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
        if s.name.startswith(
            (
                "resetctl_primary_to_terminal",
                "resetctl_lifetime_left",
                "resetctl_late_primary",
                "resetctl_expired_without",
                "resetctl_suppressed",
            )
        )
    }


def _bucket(name: str, le: str, **labels: str) -> tuple[str, tuple[Any, ...]]:
    return (f"{name}_bucket", tuple(sorted({**labels, "le": le}.items())))


def test_histograms_count_each_lifecycle_in_its_bucket(store: Store, tmp_path: Path) -> None:
    """Primary-to-terminal and lifetime-left buckets hold each scripted notice once."""
    ids = _lifecycles(store)
    samples = _samples(store, tmp_path, LATE + 1)
    primary = "resetctl_primary_to_terminal_seconds"
    email = {"region": "default", "channel": "email"}
    # A at 12 s (le 15), B at 40 s (le 45), C at 700 s (+Inf only).
    assert samples[_bucket(primary, "10", **email)] == 0
    assert samples[_bucket(primary, "15", **email)] == 1
    assert samples[_bucket(primary, "30", **email)] == 1
    assert samples[_bucket(primary, "45", **email)] == 2
    assert samples[_bucket(primary, "600", **email)] == 2
    assert samples[_bucket(primary, "+Inf", **email)] == 3
    assert samples[(f"{primary}_sum", tuple(sorted(email.items())))] == 12 + 40 + 700
    # D's SMS was only sent: not terminal under the SMS policy; E's delivered at 700 s.
    sms = {"region": "smsfirst", "channel": "sms"}
    assert samples[_bucket(primary, "600", **sms)] == 0
    assert samples[_bucket(primary, "+Inf", **sms)] == 1
    left = "resetctl_lifetime_left_at_fallback_seconds"
    expected = {
        region: sorted(T0 + 600 - _claimed_at(store, ids[n]) for n in names)
        for region, names in (("default", "bc"), ("smsfirst", "de"))
    }
    assert expected["default"][1] == 600 - 40  # B: claimed as its bounce came in, at 40 s
    for region, values in expected.items():
        for le in ("60", "180", "300", "420", "540", "600"):
            below = sum(v <= float(le) for v in values)
            assert samples[_bucket(left, le, region=region)] == below
        assert samples[(f"{left}_count", (("region", region),))] == 2
        assert samples[(f"{left}_sum", (("region", region),))] == sum(values)


def test_counters_use_each_policy_s_success(store: Store, tmp_path: Path) -> None:
    """Late primary and expired-without-outcome read success as each policy defines it."""
    _lifecycles(store)
    samples = _samples(store, tmp_path, LATE + 1)
    late = "resetctl_late_primary_after_fallback_total"
    assert samples[(late, (("channel", "email"), ("region", "default")))] == 1  # C
    # D's late "sent" is no success for SMS; E's delivery is.
    assert samples[(late, (("channel", "sms"), ("region", "smsfirst")))] == 1
    expired = "resetctl_expired_without_outcome_total"
    assert samples[(expired, (("region", "default"),))] == 0  # B failed, C delivered
    assert samples[(expired, (("region", "smsfirst"),))] == 1  # D: only sent
    assert samples[("resetctl_suppressed_duplicate_claims_total", (("region", "default"),))] == 0
    health = ops.health(store, LATE + 1, 3600)
    assert health["late_primary_after_fallback"] == 2
    assert health["late_primary_after_fallback_by_region"] == {
        "default": {"email": 1},
        "smsfirst": {"sms": 1},
    }
    assert health["expired_without_outcome"] == 1


def test_health_shows_percentiles_by_region(store: Store) -> None:
    """health reports p50/p90/p99 of both distributions, estimated in their buckets."""
    _lifecycles(store)
    figures = ops.health(store, LATE + 1, 3600)
    email = figures["primary_to_terminal_seconds"]["default"]["email"]
    assert email["count"] == 3
    # The middle one (B, 40 s) lies in (30, 45]; the top in +Inf reads the last bound.
    assert 30 < email["p50"] <= 45
    assert email["p90"] == email["p99"] == 600
    fallback = figures["lifetime_left_at_fallback_seconds"]
    assert set(fallback) == {"default", "smsfirst"}
    assert fallback["default"]["count"] == 2
    assert 540 < fallback["default"]["p99"] <= 600  # B's 559 s
    narrow = ops.health(store, LATE + 10, 5)  # nothing observed in the last 5 seconds
    assert narrow["primary_to_terminal_seconds"] == {}


def test_distributions_and_counters_survive_purge(store: Store, tmp_path: Path) -> None:
    """After purge deletes every notice, buckets, sums, counters and percentiles stay."""
    _lifecycles(store)
    now = T0 + 40 * DAY
    before = _samples(store, tmp_path, now)
    health_before = ops.health(store, now, 60 * DAY)
    assert ops.purge(store, 30 * DAY, now).deleted == 5
    assert store.phase_counts() == {}
    assert _samples(store, tmp_path, now) == before
    after = ops.health(store, now, 60 * DAY)
    for key in (
        "primary_to_terminal_seconds",
        "lifetime_left_at_fallback_seconds",
        "late_primary_after_fallback_by_region",
        "expired_without_outcome_by_region",
        "late_primary_after_fallback",
        "expired_without_outcome",
    ):
        assert after[key] == health_before[key], key


def test_a_lost_compare_and_set_counts_as_a_suppressed_duplicate_claim(
    store: Store, db: str, tmp_path: Path
) -> None:
    """A step whose row another writer changed mid-call is counted once, by region."""
    settings = make_settings(outbox={"email_status": "failed"})
    (notice,) = enqueue(store, settings, [reset_request()], T0)
    clock = FakeClock(T0)
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    transports["email"] = ScriptedTransport(transports["email"])

    def concurrent_writer(message: Message, key: str) -> None:
        with Store(db) as other, other.transaction() as conn:
            conn.execute(
                "UPDATE notices SET version = version + 1 WHERE id = ?", (notice.notice_id,)
            )

    transports["email"].on_submit = concurrent_writer
    assert run_sweep(store, settings, clock, transports).lost_races == 1
    samples = _samples(store, tmp_path, T0 + 1)
    assert samples[("resetctl_suppressed_duplicate_claims_total", (("region", "default"),))] == 1
