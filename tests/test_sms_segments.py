"""SMS are counted by segment bucket and encoding, once per attempt, in metrics and health."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import T0, FakeClock, make_settings, reset_request, run_sweep
from fakes import ScriptedTransport
from prometheus_client.parser import text_string_to_metric_families

from resetctl import ops
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.transports import TransientError, build_transports

SETTINGS = make_settings(
    outbox={"sms_status": "delivered"},
    policy={"default": {"channels": ["sms"], "sms": {"max_segments": 5}}},
)
LONG_URL = "https://shop.example/reset/" + "x" * 200


def _segment_counts(store: Store, tmp_path: Path) -> dict[tuple[str, str], float]:
    path = tmp_path / "metrics.prom"
    ops.write_metrics(store, path, T0 + 60)
    return {
        (s.labels["segments"], s.labels["encoding"]): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
        if s.name == "resetctl_sms_segments_total" and s.labels["region"] == "default"
    }


def test_gsm7_and_ucs2_copy_land_in_their_segment_buckets(store: Store, tmp_path: Path) -> None:
    """GSM-7 copy of 1 and 3 segments, UCS-2 copy of 2 and 5 (4+) segments."""
    requests = [
        reset_request(display_name="Ada"),  # GSM-7, 1 segment
        reset_request(display_name="Ada", reset_url=LONG_URL),  # GSM-7, 3 segments
        reset_request(display_name="李雷"),  # UCS-2, 2 segments
        reset_request(display_name="李雷", reset_url=LONG_URL),  # UCS-2, 5 segments
    ]
    enqueue(store, SETTINGS, requests, T0)
    run_sweep(store, SETTINGS, FakeClock(T0), max_runtime=60)
    counts = _segment_counts(store, tmp_path)
    assert {key: n for key, n in counts.items() if n} == {
        ("1", "gsm7"): 1,
        ("3", "gsm7"): 1,
        ("2", "ucs2"): 1,
        ("4+", "ucs2"): 1,
    }
    assert len(counts) == 8  # every bucket and encoding reads 0 until one happens
    assert ops.health(store, T0 + 60, 300)["sms_segments"] == {
        "default": {"gsm7": {"1": 1, "3": 1}, "ucs2": {"2": 1, "4+": 1}}
    }


def test_a_retried_sms_is_counted_once_and_survives_purge(store: Store, tmp_path: Path) -> None:
    """A resubmission under the same attempt key (after a 429) adds nothing; purge keeps
    the counts."""
    settings = make_settings(
        outbox={"sms_status": "delivered"}, policy={"default": {"channels": ["sms"]}}
    )
    enqueue(store, settings, [reset_request(display_name="Ada")], T0)
    clock = FakeClock(T0)
    transports: dict[str, Any] = dict(build_transports(settings, store, clock))
    sms = ScriptedTransport(transports["sms"], submit_errors=[TransientError("429")])
    transports["sms"] = sms
    run_sweep(store, settings, clock, transports, max_runtime=120)
    assert len(sms.submits) == 2
    assert len(set(sms.submits)) == 1
    assert _segment_counts(store, tmp_path)[("1", "gsm7")] == 1
    ops.purge(store, 30 * 86400.0, T0 + 40 * 86400.0)
    assert store.phase_counts() == {}
    assert _segment_counts(store, tmp_path)[("1", "gsm7")] == 1
