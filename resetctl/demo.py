"""``resetctl demo``: sample notices swept through a simulated clock on the outbox.

The demo uses the real store, machine, sweep and outbox; only the clock is simulated and
the outbox statuses are scripted, the way a provider's receipts would arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from resetctl.config import Settings, settings_from_mapping
from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.telemetry import Listener
from resetctl.transports import build_transports
from resetctl.work import SweepOptions

DEMO_CONFIG = {
    "support_label": "Acme Market support",
    # keep_content: the demo is development, and `outbox show` should still show mail.
    "outbox": {"email_status": "pending", "sms_status": "pending", "keep_content": True},
    "policy": {
        "default": {"version": 1},
        "apac": {"version": 1, "channels": ["sms", "email"]},
    },
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One demo notice and the provider receipts scripted for it."""

    #: what the sample shows
    label: str
    #: enqueue fields (example.com/example.net addresses, test numbers)
    request: dict[str, object]
    #: (seconds after start, channel, outbox status)
    receipts: tuple[tuple[float, str, str], ...]


SAMPLES = (
    Sample(
        "email accepted",
        {
            "idempotency_key": "demo-1",
            "account_ref": "acct-1",
            "email": "ada@example.com",
            "phone": "+14155550101",
        },
        ((5, "email", "delivered"),),
    ),
    Sample(
        "email bounces, SMS fallback",
        {
            "idempotency_key": "demo-2",
            "account_ref": "acct-2",
            "email": "bo@example.com",
            "phone": "+14155550102",
        },
        ((30, "email", "failed"), (60, "sms", "delivered")),
    ),
    Sample(
        "email never answers, budget spent, escalate",
        {
            "idempotency_key": "demo-3",
            "account_ref": "acct-3",
            "email": "cy@example.com",
            "phone": "+14155550103",
        },
        ((150, "sms", "delivered"),),
    ),
    Sample(
        "SMS first (region apac), text delivered",
        {
            "idempotency_key": "demo-4",
            "account_ref": "acct-4",
            "region": "apac",
            "email": "di@example.com",
            "phone": "+61491570156",
        },
        ((10, "sms", "delivered"),),
    ),
    Sample(
        "3-minute link: too short for a fallback, expires",
        {
            "idempotency_key": "demo-5",
            "account_ref": "acct-5",
            "email": "ed@example.com",
            "phone": "+14155550105",
            "ttl": "3m",
        },
        (),
    ),
)


def demo_settings() -> Settings:
    """The demo's configuration: outbox statuses start pending, two regions."""
    return settings_from_mapping(DEMO_CONFIG, "demo")


def run_demo(
    store: Store, start: float, listener: Listener, labels: Callable[[str, str], None]
) -> list[str]:
    """Enqueue the samples at ``start`` and sweep until every notice is terminal.

    Returns the notice ids in sample order.
    """
    settings = demo_settings()
    requests = [
        {**s.request, "reset_url": f"https://shop.example/reset/demo-token-{i}"}
        for i, s in enumerate(SAMPLES, start=1)
    ]
    results = enqueue(store, settings, requests, now=start)
    ids = [r.notice_id for r in results if r.notice_id is not None]
    for sample, notice_id in zip(SAMPLES, ids, strict=True):
        labels(notice_id, sample.label)
    clock = _SimulatedClock(start)
    sweeper = Sweeper(
        store, settings, build_transports(settings, store, clock), clock=clock, listeners=[listener]
    )
    options = SweepOptions("demo", batch_size=10, lease=60.0)
    receipts = sorted(
        (start + at, notice_id, channel, status)
        for sample, notice_id in zip(SAMPLES, ids, strict=True)
        for at, channel, status in sample.receipts
    )
    while True:
        for at, notice_id, channel, status in receipts:
            if at <= clock.now:
                for message in store.outbox_messages(notice_id):
                    if message["channel"] == channel and message["status"] != status:
                        store.outbox_set_status(message["message_id"], status, clock.now)
        sweeper.run(options)
        next_due = store.next_due_at()
        if next_due is None:
            return ids
        pending = [at for at, *_ in receipts if at > clock.now]
        clock.now = min([next_due, *pending])


class _SimulatedClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
