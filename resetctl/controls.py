"""What an application and on-call do to notices beside enqueueing them: cancel one that
no longer helps (the reset was used, a newer one replaced it, it was withdrawn), and find
notices by the names they know (the idempotency key, the account, the phase and age).

A cancel is a step like any other: the machine decides it (:class:`machine.Cancelled`)
and the store writes it by compare-and-set on the row version, so it never overlaps a
sweep's claim of a channel. A sweep's intent committed first keeps its call (the attempt
is recorded, its outcome kept as evidence); a cancel committed first makes the sweep's
intent lose, so nothing is submitted after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resetctl import machine, report
from resetctl.errors import InputError, NoticeNotFound
from resetctl.machine import Phase, Reason
from resetctl.policy import Policy
from resetctl.store import LoadedNotice, Store
from resetctl.store.records import Step, StepKind

#: A compare-and-set lost to a sweep's write is decided again on the fresh row; a row
#: that changes under every one of these tries is reported as not cancelled.
CANCEL_TRIES = 20
#: The longest text an ``account_ref`` or idempotency key search may carry.
MAX_NAME = 200


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did to one notice."""

    notice_id: str
    #: the phase before the cancel
    was: Phase
    #: the phase after it: ``cancelled``, or the terminal phase it already had
    phase: Phase
    #: True when this call cancelled it (False: it was already terminal)
    cancelled: bool
    #: the notice's reason after it (the cancel's, or the one it ended with)
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        """The public JSON shape (``resetctl cancel --json``)."""
        return {
            "notice_id": self.notice_id,
            "was": self.was.value,
            "phase": self.phase.value,
            "cancelled": self.cancelled,
            "reason": self.reason,
        }


def cancel_reason(value: str) -> Reason:
    """The cancel reason named ``value``; InputError naming the choices otherwise."""
    for reason in machine.CANCEL_REASONS:
        if value == reason.value:
            return reason
    choices = ", ".join(r.value for r in machine.CANCEL_REASONS)
    raise InputError([f"reason: {value!r} is not one of {choices}"])


def cancel(
    store: Store, notice_ids: Sequence[str], why: Reason, now: float, worker: str = "cancel"
) -> list[CancelResult]:
    """Cancel each notice in its own compare-and-set, in one transaction (run again if
    the database breaks a lock cycle). NoticeNotFound names the first unknown id, and
    nothing is cancelled."""

    def write() -> list[CancelResult]:
        return cancel_in_transaction(store, notice_ids, why, now, worker)

    return store.retried_transaction(write)


def cancel_in_transaction(
    store: Store, notice_ids: Sequence[str], why: Reason, now: float, worker: str
) -> list[CancelResult]:
    """:func:`cancel` inside the caller's write transaction (enqueue's supersede)."""
    if why not in machine.CANCEL_REASONS:
        raise ValueError(f"{why} is not a cancel reason")
    results: dict[str, CancelResult] = {}
    policies: dict[tuple[str, int], Policy] = {}
    pending = list(dict.fromkeys(notice_ids))
    for _ in range(CANCEL_TRIES):
        if not pending:
            break
        loaded = store.load_notices(pending)
        unknown = [n for n in pending if n not in loaded]
        if unknown:
            raise NoticeNotFound(f"no notice {unknown[0]!r}")
        steps: list[Step] = []
        for notice_id in pending:
            found = loaded[notice_id]
            key = (found.policy_name, found.policy_version)
            if key not in policies:
                policies[key] = store.load_policy(*key)
            _, decision = machine.transition(
                found.state, policies[key], machine.Cancelled(why), now
            )
            if found.state.phase.terminal:  # it ended already: left as it is
                results[notice_id] = CancelResult(
                    notice_id, found.state.phase, found.state.phase, False, found.reason
                )
                continue
            steps.append(
                Step(
                    notice_id=notice_id,
                    version=found.version,
                    lease_token=None,
                    old_phase=found.state.phase,
                    decision=decision,
                    release=True,
                    facts=None,
                    kind=StepKind.CANCEL,
                    worker=worker,
                    now=now,
                )
            )
        written = store.write_steps(steps)
        pending = []
        for step, result in zip(steps, written, strict=True):
            if result.won:
                results[step.notice_id] = CancelResult(
                    step.notice_id, step.old_phase, Phase.CANCELLED, True, why.value
                )
            else:  # a sweep wrote first: decide again on what it wrote
                pending.append(step.notice_id)
    if pending:  # pragma: no cover - a row rewritten CANCEL_TRIES times over
        raise NoticeNotFound(f"notice {pending[0]!r} kept changing; cancel it again")
    return [results[n] for n in dict.fromkeys(notice_ids)]


def supersede(
    store: Store,
    new: Sequence[tuple[str, str, str | None, Policy]],
    now: float,
) -> dict[str, list[str]]:
    """Inside enqueue's transaction: for each new notice (id, region, account_ref,
    policy) whose policy says ``supersede_older``, cancel the account's other live
    notices in that region (``superseded``). Within one batch the last notice of an
    account survives. Returns the ids each new notice superseded."""
    newest: dict[tuple[str, str], str] = {}
    for notice_id, region, account_ref, policy in new:
        if account_ref is not None and policy.supersede_older:
            newest[(region, account_ref)] = notice_id
    if not newest:
        return {}
    superseded: dict[str, list[str]] = {}
    for older, region, account_ref in store.live_for_accounts(list(newest)):
        keeper = newest[(region, account_ref)]
        if older != keeper:
            superseded.setdefault(keeper, []).append(older)
    chosen = [n for ids in superseded.values() for n in ids]
    cancel_in_transaction(store, chosen, Reason.SUPERSEDED, now, "supersede")
    return superseded


def find_notice_id(store: Store, *, key: str | None = None, account: str | None = None) -> str:
    """The notice enqueued under idempotency ``key``, or ``account``'s latest notice;
    NoticeNotFound when there is none."""
    if key is not None:
        found = store.notice_id_for_key(key)
        if found is None:
            raise NoticeNotFound(f"no notice has idempotency key {key!r}")
        return found
    if account is not None:
        latest = store.find_notices(limit=1, account_ref=account)
        if not latest:
            raise NoticeNotFound(f"no notice for account {account!r}")
        return latest[0].state.notice_id
    raise ValueError("name a key or an account")


@dataclass(frozen=True, slots=True)
class NoticeQuery:
    """What ``resetctl list`` asks for."""

    limit: int = 50
    phases: tuple[Phase, ...] = ()
    region: str | None = None
    account_ref: str | None = None
    #: the earliest creation time (epoch seconds); a search over finished notices
    #: without an account starts one day back unless given
    since: float | None = None
    at_risk: bool = False


#: How far back a search over finished notices looks unless told (``list --since``).
DEFAULT_LOOKBACK = 86400.0


def list_notices(store: Store, query: NoticeQuery, now: float) -> list[dict[str, Any]]:
    """Notices newest first: the header fields ``inspect`` shows, never a secret.

    Live-only searches (every phase asked for is live, or ``at_risk``) walk the live
    notices' index; an account's search walks its own; anything else walks creation
    time from ``since`` (by default one day back).
    """
    live_only = query.at_risk or bool(query.phases and all(not p.terminal for p in query.phases))
    since = query.since
    if since is None and query.account_ref is None and not live_only:
        since = now - DEFAULT_LOOKBACK
    found = store.find_notices(
        limit=max(query.limit, 0) if not query.at_risk else 1_000_000,
        phases=[p.value for p in query.phases],
        region=query.region,
        account_ref=query.account_ref,
        since=since,
        live_only=live_only,
    )
    policies: dict[tuple[str, int], Policy] = {}
    rows = []
    for loaded in found:
        budget = None
        if not loaded.state.phase.terminal:
            key = (loaded.policy_name, loaded.policy_version)
            if key not in policies:
                policies[key] = store.load_policy(*key)
            budget = machine.budget(loaded.state, policies[key], now)
        if query.at_risk and (budget is None or not budget.at_risk):
            continue
        rows.append(notice_header(loaded, budget, now))
        if len(rows) >= query.limit:
            break
    return rows


def notice_header(
    loaded: LoadedNotice, budget: machine.Budget | None, now: float
) -> dict[str, Any]:
    """A notice's identity and timing, as the head of ``inspect`` shows them, and what
    the machine's budget says of its risk."""
    return {
        **report.notice_header(loaded, now),
        "at_risk": budget is not None and budget.at_risk,
        "level": "ok" if budget is None else budget.level,
    }
