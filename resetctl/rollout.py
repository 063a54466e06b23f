"""Rolling resetctl out beside the application's own sender: shadow mode, then a slice of
the traffic, then all of it (README, "Roll out: shadow, a slice, then all").

- ``[rollout] mode = "shadow"``: a notice enqueued then is marked in the database and
  runs everything but the provider call: claims, the machine's decisions, region policy
  (consent, destinations and per-recipient limits at enqueue, the SMS country cap just
  before a first SMS), rendering and its checks. At its would-send it ends ``cancelled``
  with reason ``shadow``; no transport is called for it, the outbox included, and no
  attempt is recorded, so nothing pretends it was accepted. Health counts the would-sends
  by policy and channel. The mark is the notice's, as its policy is: a sweep in either
  mode ends a shadow notice in shadow, and sends a live one. Switching shadow to live
  therefore fires nothing that was enqueued in shadow (the application sent those), and
  switching back stops new notices only (live ones finish: they are the only path their
  resets have; ``resetctl cancel`` stops one).
- ``[rollout] percent = N``: a new idempotency key is in the slice when its slice point, a
  plain SHA-256 of the key, falls in the first N % of the range. The hash takes no secret
  on purpose: the slice must be the same on every host and process, and across a
  ``db copy``, a new database or a new hash key, or a retry on another host could answer
  differently; and a secret would protect nothing, since being in or out of the slice
  grants nothing (either path sends one reset under its own limits) and keys come from the
  application, not from the person asking. A key out of the slice is answered
  ``"in_slice": false``, stored as no notice and counted by no limit: the application keeps
  its old path for it. Its answer is recorded (key, request digest, policy), so a retry
  answers the same whatever the percent has become, and a key reused with other fields is
  refused as for a notice; a key that names a notice is answered by it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resetctl import calls, machine
from resetctl.config import Settings
from resetctl.folds import skipped_of
from resetctl.limits import over_country_cap
from resetctl.machine import Cancelled, Reason
from resetctl.store import Contact, StepKind, Store
from resetctl.work import Held, Job, Pending

#: Prefixed to a key before it is hashed, so the slice point is resetctl's own use of
#: SHA-256 (changing it reshuffles every slice: never, within a major version).
SLICE_DOMAIN = b"resetctl slice v1\x00"
#: Slice points fall in [0, SLICE_RANGE).
SLICE_RANGE = 2**64
#: An answer out of the slice is kept at least this long (health counts over its window;
#: a retry after the link died gets the slice's answer again, or its recorded one).
SLICE_MEMORY = 2 * 86400.0
#: Expired answers an enqueue prunes per answer it records (and a few more): the table
#: shrinks whenever it grows.
PRUNE_PER_ANSWER = 2
PRUNE_EXTRA = 16


def slice_point(idempotency_key: str) -> int:
    """Where a key falls in the slice: the first 8 bytes of SHA-256 over SLICE_DOMAIN and
    the key's UTF-8, as an unsigned big-endian number. The same on every host and Python
    (never ``hash()``, which each process salts)."""
    digest = hashlib.sha256(SLICE_DOMAIN + idempotency_key.encode()).digest()
    return int.from_bytes(digest[:8], "big")


def slice_bound(percent: float) -> int:
    """The slice points below which a key is in a ``percent`` slice (0 to 100)."""
    return math.floor(percent / 100 * SLICE_RANGE)


def in_slice(idempotency_key: str, percent: float) -> bool:
    """True when a new key falls in a ``percent`` slice. Raising the percent only adds
    keys; lowering it only removes them."""
    return slice_point(idempotency_key) < slice_bound(percent)


@dataclass(frozen=True, slots=True)
class SliceRequest:
    """A valid request, as the slice sees it (no contact data, no link)."""

    idempotency_key: str
    request_digest: str
    policy: str
    #: when the link it carries dies: its answer is kept until then (SLICE_MEMORY at least)
    expires_at: float


def outside_slice(
    store: Store, percent: float, requests: Sequence[SliceRequest], now: float
) -> dict[str, str]:
    """The keys among ``requests`` that are out of the slice, each with the request
    digest its answer is recorded under (compare it: another is a key reused with other
    fields). Call inside the enqueue's transaction.

    A key answered out before stays out; a key that names a stored notice is in (the
    notice answers); any other key is out when its slice point is past ``percent``, and
    that answer is recorded (the first of a key's lines, or of racing enqueues, wins)."""
    keys = list(dict.fromkeys(r.idempotency_key for r in requests))
    recorded = store.slice_answers(keys)
    fresh: dict[str, SliceRequest] = {}
    for request in requests:
        key = request.idempotency_key
        if key not in recorded and key not in fresh and not in_slice(key, percent):
            fresh[key] = request
    if not recorded and not fresh:
        return {}
    stored = store.stored_notices([*recorded, *fresh])
    new = [r for key, r in fresh.items() if key not in stored]
    if new:
        store.prune_slice_answers(now, PRUNE_PER_ANSWER * len(new) + PRUNE_EXTRA)
        store.record_slice_answers(
            [
                (
                    r.idempotency_key,
                    r.request_digest,
                    r.policy,
                    now,
                    max(r.expires_at, now + SLICE_MEMORY),
                )
                for r in new
            ]
        )
        recorded.update(store.slice_answers([r.idempotency_key for r in new]))
    return {key: digest for key, digest in recorded.items() if key not in stored}


def shadow_end(held: Held, channel: str, now: float) -> Pending:
    """A shadow notice's would-send on ``channel``, decided by the machine as a cancel
    (``shadow``): terminal, with no attempt; a notice already terminal stays as it is."""
    state, decision = machine.transition(held.state, held.policy, Cancelled(Reason.SHADOW), now)
    return Pending(held, state, decision, None, StepKind.SHADOW, channel, now)


def diverted_submissions(
    store: Store,
    settings: Settings,
    submits: Sequence[Job],
    contacts: Mapping[str, Contact | None],
    now: float,
    not_worth_calling: Callable[[Job], str | None],
) -> dict[str, Pending]:
    """The submissions about to start that will not be made after all, by notice, with
    the step each writes instead:

    - a first SMS its destination country's hourly cap refuses: skipped
      (``country_cap``), the notice goes on by its other channel (the cap counts every
      first SMS it lets through, a shadow notice's too);
    - a shadow notice's submission: rendered and checked as any, then ended (see
      :func:`shadow_end`). One the sweep would decline (too little time, the lease) or
      that cannot be rendered is left to the sweep: it is declined, or fails with its
      render error, without a call, as a live one would.
    """
    wanted = [(job.held.policy, job.held.state, job.channel) for job in submits]
    capped = over_country_cap(store, wanted, contacts, now)
    diverted: dict[str, Pending] = {}
    rest: list[Job] = []
    for job in submits:
        notice_id = job.held.state.notice_id
        if notice_id in capped:
            diverted[notice_id] = skipped_of(job.held, job.channel, Reason.COUNTRY_CAP, now)
        else:
            rest.append(job)
    shadow = store.shadow_among([job.held.state.notice_id for job in rest])
    for job in rest:
        held = job.held
        notice_id = held.state.notice_id
        if notice_id not in shadow or not_worth_calling(job) is not None:
            continue
        job.contact = contacts.get(notice_id)
        job.rendered = calls.render(
            settings, held.policy, held.state, held.loaded.locale, job.contact, job.channel, now
        )
        if job.rendered.message is not None:
            diverted[notice_id] = shadow_end(held, job.channel, now)
    return diverted


def rollout_figures(store: Store, since: float) -> dict[str, Any]:
    """What health shows of a rollout since ``since``: shadow notices' would-sends by
    policy and channel, and requests answered out of the slice by policy."""
    would_send: dict[str, dict[str, int]] = {}
    for policy, channel, count in store.would_send_counts(since):
        would_send.setdefault(policy, {})[channel] = count
    return {"would_send": would_send, "out_of_slice": dict(store.out_of_slice_counts(since))}
