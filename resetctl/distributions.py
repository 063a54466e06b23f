"""The bounded shapes the distributions and counters are kept in: histogram buckets
chosen for 10-minute reset links, the SMS segment buckets, and percentiles read back from
bucket counts. A leaf (standard library only): the store folds into these buckets before
purge deletes the rows, and the metrics and ``health`` read them, so each exists once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: Upper bounds (seconds) of ``resetctl_primary_to_terminal_seconds``: fine where a
#: provider answers (a few seconds to a minute), coarser up to a 10-minute link's end.
PRIMARY_TO_TERMINAL_BUCKETS: tuple[float, ...] = (
    1,
    2,
    5,
    10,
    15,
    30,
    45,
    60,
    90,
    120,
    180,
    240,
    300,
    450,
    600,
)
#: Upper bounds (seconds) of ``resetctl_lifetime_left_at_fallback_seconds``: every 30 s
#: to two minutes (where a fallback reserve sits), then every minute to ten.
LIFETIME_LEFT_BUCKETS: tuple[float, ...] = (
    30,
    60,
    90,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
)
#: The bucket above every bound.
INFINITE = "+Inf"
#: SMS segment-count buckets (billing grows by segment; four and more is one bucket).
SEGMENT_BUCKETS = ("1", "2", "3", "4+")
#: The percentiles ``health`` reports of each distribution.
PERCENTILES = (0.5, 0.9, 0.99)


def bound_label(bound: float) -> str:
    """A bucket's upper bound as its label (``le``) reads: ``15``, ``0.5``, ``+Inf``."""
    return INFINITE if math.isinf(bound) else f"{bound:g}"


def bucket_of(value: float, bounds: Sequence[float]) -> str:
    """The label of the smallest bucket whose upper bound holds ``value``."""
    for bound in bounds:
        if value <= bound:
            return bound_label(bound)
    return INFINITE


def segment_bucket(segments: int) -> str:
    """An SMS's segment count as its bucket: ``1``, ``2``, ``3`` or ``4+``."""
    return SEGMENT_BUCKETS[min(max(segments, 1), 4) - 1]


def cumulative(counts: Mapping[str, int], bounds: Sequence[float]) -> list[tuple[str, int]]:
    """(``le`` label, observations at or below it) for every bound and ``+Inf``: the
    shape of a Prometheus histogram's buckets."""
    running, shaped = 0, []
    for bound in (*bounds, math.inf):
        running += counts.get(bound_label(bound), 0)
        shaped.append((bound_label(bound), running))
    return shaped


def quantile(q: float, counts: Mapping[str, int], bounds: Sequence[float]) -> float | None:
    """The ``q`` quantile estimated from bucket counts as Prometheus's
    ``histogram_quantile`` does: linear inside the bucket that holds it, the highest
    finite bound when it falls in ``+Inf``; None without observations. Purged days keep
    only their buckets, so live rows are read the same way and a purge moves nothing."""
    total = sum(counts.values())
    if total == 0:
        return None
    rank, below, lower = q * total, 0, 0.0
    for bound in bounds:
        inside = counts.get(bound_label(bound), 0)
        if inside and below + inside >= rank:
            return round(lower + (bound - lower) * (rank - below) / inside, 3)
        below, lower = below + inside, bound
    return float(bounds[-1])
