"""The abuse limits of a region's policy, held across processes and hosts: counted in
the database under a row lock, decided by the machine (:func:`machine.admission.counted`).

- ``limits.per_recipient`` notices per ``limits.per_recipient_window`` for one recipient,
  by its keyed hash (never the address): checked at enqueue; a request over it is
  refused (``rate_limited``) and the rest of its batch goes on.
- ``limits.sms_per_country_per_hour`` SMS per destination country: checked by the sweep
  just before an SMS's first submission; over it, the SMS is skipped (``country_cap``) and
  the notice goes on by its other channel, if it has one.

A count is taken before the work it allows is committed: a crash or a lost race in
between leaves it counted. Limits therefore err toward refusing, never toward letting
more through.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resetctl.durations import format_duration
from resetctl.machine import NoticeState, Reason
from resetctl.machine.admission import Counts, counted
from resetctl.policy import Channel, Policy
from resetctl.store import Contact, NewNotice, Store

#: The rules' names in ``limit_counts``.
RECIPIENT = "recipient"
SMS_COUNTRY = "sms_country"
#: The country cap's window, and the buckets its counts share (a busy country's row
#: holds at most 60 of them).
COUNTRY_WINDOW = 3600.0
COUNTRY_BUCKET = 60.0


@dataclass(frozen=True, slots=True)
class LimitRefusal:
    """A request a limit refused: which field's recipient, and why, for its line."""

    #: the request's position in its batch
    index: int
    #: the contact field whose recipient is over the limit ("email" or "phone")
    field: str
    #: the problem, naming the limit (never the recipient)
    problem: str


def recipient_hash(key: bytes, recipient: str) -> str:
    """HMAC-SHA256 of the recipient: a keyed, non-reversible handle for correlating logs
    and counting limits (a copy of the database without the key cannot test an address)."""
    return hmac.digest(key, recipient.lower().encode(), "sha256").hex()[:24]


def _subjects(notice: NewNotice, key: bytes) -> list[tuple[str, str]]:
    """(field, keyed hash) of each recipient the notice would reach."""
    found = []
    if "email" in notice.channels and notice.contact.email is not None:
        found.append(("email", recipient_hash(key, notice.contact.email)))
    if "sms" in notice.channels and notice.contact.phone is not None:
        found.append(("phone", recipient_hash(key, notice.contact.phone)))
    return found


def take_recipient_limits(
    store: Store, notices: Sequence[NewNotice], key: bytes, now: float
) -> list[LimitRefusal]:
    """Count each new notice against its policy's per-recipient limit, in order; the
    ones over it are returned and must not be stored. Call inside the enqueue's write
    transaction: the counts commit with the notices.

    A notice whose idempotency key is already stored (a retried request) is not a new
    notice and counts nothing; nor does a key's second line in one batch.
    """
    limited = [(i, n) for i, n in enumerate(notices) if n.policy.limits.per_recipient is not None]
    if not limited:
        return []
    known = set(store.stored_notices([n.idempotency_key for _, n in limited]))
    refused: list[LimitRefusal] = []
    by_policy: dict[str, list[tuple[int, NewNotice, list[tuple[str, str]]]]] = {}
    for i, notice in limited:
        if notice.idempotency_key in known:
            continue
        known.add(notice.idempotency_key)
        by_policy.setdefault(notice.policy.name, []).append((i, notice, _subjects(notice, key)))
    for name, entries in sorted(by_policy.items()):
        subjects = [subject for _, _, found in entries for _, subject in found]
        counts = store.locked_counts(RECIPIENT, name, subjects)
        changed: dict[str, Counts] = {}
        for i, notice, found in entries:
            limits = notice.policy.limits
            assert limits.per_recipient is not None
            after: dict[str, Counts] = {}
            for field, subject in found:
                now_counts = changed.get(subject, counts.get(subject, []))
                more = counted(now_counts, now, limits.per_recipient_window, limits.per_recipient)
                if more is None:
                    refused.append(LimitRefusal(i, field, _over(notice.policy, field)))
                    break
                after[subject] = more
            else:
                changed.update(after)
        store.write_counts(RECIPIENT, name, changed, now)
    return refused


def _over(policy: Policy, field: str) -> str:
    limits = policy.limits
    return (
        f"refused ({Reason.RATE_LIMITED}): this {field}'s recipient already had"
        f" {limits.per_recipient} notices in {format_duration(limits.per_recipient_window)}"
        f" (policy.{policy.name}.limits.per_recipient)"
    )


def take_country_caps(store: Store, wants: Sequence[tuple[Policy, str]], now: float) -> list[bool]:
    """For each (policy, destination country) about to send its first SMS, whether the
    country's hourly cap lets it through; those that pass are counted. Runs in its own
    transaction (retried if the database breaks a lock cycle)."""

    def take() -> list[bool]:
        verdicts = [True] * len(wants)
        by_policy: dict[str, list[int]] = {}
        for i, (policy, _) in enumerate(wants):
            if policy.limits.sms_per_country_per_hour is not None:
                by_policy.setdefault(policy.name, []).append(i)
        for name, indexes in sorted(by_policy.items()):
            counts = store.locked_counts(SMS_COUNTRY, name, [wants[i][1] for i in indexes])
            changed: dict[str, Counts] = {}
            for i in indexes:
                policy, country = wants[i]
                cap = policy.limits.sms_per_country_per_hour
                assert cap is not None
                current = changed.get(country, counts.get(country, []))
                more = counted(current, now, COUNTRY_WINDOW, cap, COUNTRY_BUCKET)
                if more is None:
                    verdicts[i] = False
                else:
                    changed[country] = more
            store.write_counts(SMS_COUNTRY, name, changed, now)
        return verdicts

    if not any(p.limits.sms_per_country_per_hour is not None for p, _ in wants):
        return [True] * len(wants)
    return store.retried_transaction(take)


def over_country_cap(
    store: Store,
    submissions: Sequence[tuple[Policy, NoticeState, str]],
    contacts: Mapping[str, Contact | None],
    now: float,
) -> set[str]:
    """The notices among ``submissions`` (policy, state, channel: about to be made)
    whose first SMS its destination country's hourly cap refuses; every other first SMS
    under a cap is counted. A retry of an SMS already attempted counts nothing (one
    message, one count)."""
    wants: list[tuple[Policy, str]] = []
    notice_ids: list[str] = []
    for policy, state, channel in submissions:
        contact = contacts.get(state.notice_id)
        if (
            channel != Channel.SMS
            or policy.limits.sms_per_country_per_hour is None
            or state.attempt(channel) is not None
            or contact is None
            or contact.phone is None
        ):
            continue
        wants.append((policy, country_of(contact.phone)))
        notice_ids.append(state.notice_id)
    if not wants:
        return set()
    verdicts = take_country_caps(store, wants, now)
    return {notice_id for notice_id, ok in zip(notice_ids, verdicts, strict=True) if not ok}


def country_of(phone: str) -> str:
    """The ISO 3166 code of an E.164 number's country (``ZZ`` when unknown)."""
    import phonenumbers

    try:
        return phonenumbers.region_code_for_number(phonenumbers.parse(phone, None)) or "ZZ"
    except phonenumbers.NumberParseException:
        return "ZZ"
