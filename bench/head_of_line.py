"""Head-of-line blocking: does a slow provider delay another provider's resets?

Issue 22's case: 10 SMS-first notices on an SMS provider whose create takes 5 s (a
degraded provider, well inside its time-out) and 50 email-first notices on an instant
email transport, one sweep. Before the concurrent engine the 50 emails were all submitted
only 36 s after the sweep started, behind the texts.

Both providers are outbox instances (``[providers.slow_sms] kind = "outbox"`` with
``latency = "5s"``; email on the embedded outbox), so the figure is resetctl's own: the
seconds from the sweep's start until the last of the 50 emails was submitted, beside when
the first and the last text were (each 5 s call in its own slot of the SMS lane).

    python bench/head_of_line.py
    python bench/head_of_line.py --texts 40 --emails 500 --sms-latency 5s
"""

from __future__ import annotations

import argparse
import secrets
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import resetctl
from resetctl.config import settings_from_mapping
from resetctl.durations import parse_duration


def requests(n: int, region: str) -> list[dict[str, Any]]:
    """Notices of ``region`` with the built-in policy's 10-minute links."""
    return [
        {
            "idempotency_key": f"{region}-{i}",
            "region": region,
            "email": f"user{i}@example.com",
            "phone": "+14155550123",
            "reset_url": f"https://shop.example/reset/{secrets.token_hex(8)}",
        }
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=10)
    parser.add_argument("--emails", type=int, default=50)
    parser.add_argument("--sms-latency", default="5s")
    args = parser.parse_args()
    latency = parse_duration(args.sms_latency, "--sms-latency")
    settings = settings_from_mapping(
        {
            "providers": {"slow_sms": {"kind": "outbox", "latency": args.sms_latency}},
            "transport": {"sms": "slow_sms", "email": "outbox"},
            "policy": {
                "default": {"batch_size": 100},
                "smsfirst": {"channels": ["sms", "email"]},
            },
        },
        "bench",
    )
    print(f"resetctl {resetctl.__file__}")
    with tempfile.TemporaryDirectory() as where:
        db = Path(where) / "resetctl.db"
        with resetctl.open(db, settings) as handle:
            handle.enqueue(requests(args.texts, "smsfirst"))
            handle.enqueue(requests(args.emails, "default"))
            started = time.time()
            summary = handle.sweep(0.0)
            ended = time.time()
        conn = sqlite3.connect(db)
        try:
            rows = conn.execute("SELECT channel, submitted_at FROM outbox").fetchall()
        finally:
            conn.close()
    emails = sorted(at - started for channel, at in rows if channel == "email")
    texts = sorted(at - started for channel, at in rows if channel == "sms")
    assert len(emails) == args.emails, len(emails)
    assert len(texts) == args.texts, len(texts)
    print(
        f"{args.texts} texts at {latency:g} s a call, {args.emails} emails, one sweep"
        f" (submitted {summary.submitted}, {ended - started:.2f} s)"
    )
    print(f"  last email submitted after {emails[-1]:.3f} s (first after {emails[0]:.3f} s)")
    print(f"  texts submitted after {texts[0]:.2f} s to {texts[-1]:.2f} s")


if __name__ == "__main__":
    main()
