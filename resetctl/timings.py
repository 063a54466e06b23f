"""``resetctl export-timings``: de-identified traces from the database, for ``replay``.

A trace holds a reset's region, arrival (seconds from the first exported notice), link
lifetime and, per channel, the raw statuses observed at offsets from that channel's
submission. Trace ids are sequence numbers: nothing maps them back to notices. Offsets
are whole seconds, rounded down: an observation records when a status was *seen* (a poll
or a callback), which is what a replay under the same policy sees again.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from resetctl.store import Store


def export_timings(store: Store, since: float, until: float) -> Iterator[dict[str, Any]]:
    """Trace records for the finished notices created in [since, until)."""
    first: float | None = None
    for number, row in enumerate(store.terminal_timings(since, until), start=1):
        if first is None:
            first = row["created_at"]
        trace: dict[str, Any] = {
            "trace_id": f"t{number:07d}",
            "region": row["region"],
            "arrived_at": round(row["created_at"] - first, 3),
            "ttl": round(row["expires_at"] - row["created_at"], 3),
        }
        transports: dict[str, str] = {}
        for channel, attempt in sorted(row["channels"].items()):
            submitted = attempt["submitted_at"]
            transports[channel] = attempt["transport"]
            if submitted is None:
                trace[channel] = []  # never accepted by the transport: never answers
                continue
            trace[channel] = [
                [max(0, math.floor(seen - submitted)), raw] for seen, raw in attempt["seen"]
            ]
        if any(name != "outbox" for name in transports.values()):
            trace["transport"] = transports
        yield trace
