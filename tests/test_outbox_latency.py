"""`[outbox] latency`: a simulated provider's time per call, for benchmarks and demos."""

from __future__ import annotations

import time

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep

from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.transports import build_transports
from resetctl.transports.outbox import OutboxTransport


def test_each_call_takes_the_configured_latency(store: Store) -> None:
    """A sweep over the outbox with latency 30ms spends at least that per call (one at a
    time at concurrency 1), and its lease must cover it like any provider's time-out."""
    settings = make_settings(outbox={"latency": "30ms"})
    transports = build_transports(settings, store, FakeClock())
    email = transports["email"]
    assert isinstance(email, OutboxTransport)
    assert email.call_timeout == pytest.approx(0.03)
    enqueue(store, settings, [reset_request() for _ in range(3)], T0)
    started = time.monotonic()
    summary = run_sweep(store, settings, FakeClock(T0), concurrency=1)
    assert summary.accepted == 3
    assert time.monotonic() - started >= 3 * 0.03


@pytest.mark.parametrize("latency", ["soon", "-5ms", True])
def test_a_bad_latency_is_refused_by_name(latency: object) -> None:
    """outbox.latency must be a duration."""
    with pytest.raises(ConfigError, match=r"outbox\.latency"):
        make_settings(outbox={"latency": latency})
