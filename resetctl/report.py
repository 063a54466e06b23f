"""What ``inspect`` shows an on-call engineer: timing and state, never a secret.

Contact data and the reset URL live in a table this module never reads.
"""

from __future__ import annotations

import json
import math
from typing import Any

from resetctl import machine
from resetctl.errors import NoticeNotFound
from resetctl.policy import Channel, Policy
from resetctl.store import LoadedNotice, Store
from resetctl.summary import iso
from resetctl.transports.base import SENDER_KEYS


def notice_header(loaded: LoadedNotice, now: float) -> dict[str, Any]:
    """A notice's identity and timing: the head of ``inspect`` and each row of ``list``."""
    state = loaded.state
    return {
        "notice_id": state.notice_id,
        "phase": state.phase.value,
        "reason": loaded.reason,
        "region": loaded.region,
        "policy": loaded.policy_name,
        "policy_version": loaded.policy_version,
        "account_ref": loaded.account_ref,
        "channels": list(state.channels),
        "created_at": iso(loaded.created_at),
        "expires_at": iso(state.expires_at),
        "remaining_seconds": round(max(0.0, state.expires_at - now), 3),
        "phase_since": iso(loaded.phase_since),
    }


def _action_budget(state: machine.NoticeState, policy: Policy, now: float) -> dict[str, Any]:
    """What on-call can still do, as the machine's budget says: the fallback deadline (the
    last moment a fallback still has its reserve), whether a fallback is still possible,
    whether the notice is at risk and how badly, and what counts as success."""
    budget = machine.budget(state, policy, now)
    fallback, deadline = machine.fallback_of(state, policy)
    return {
        "fallback_channel": fallback,
        "fallback_deadline": iso(deadline),
        "seconds_to_fallback_deadline": None if deadline is None else round(deadline - now, 3),
        "fallback_possible": bool(budget and budget.fallback_possible),
        "at_risk": bool(budget and budget.at_risk),
        "level": "ok" if budget is None else budget.level,
        "actionable": bool(budget and budget.actionable),
        "needed_seconds": None
        if budget is None or math.isinf(budget.needed)
        else round(budget.needed, 3),
        "success_statuses": {c: sorted(policy.success[Channel(c)]) for c in state.channels},
    }


def _consent(stored: str | None) -> list[str] | None:
    """The consent an enqueue gave (``[]``: it named no channel), or None: not given."""
    if stored is None:
        return None
    return stored.split(",") if stored else []


def attempt_sender(sent: str | None, channel: str, policy: Policy) -> dict[str, str]:
    """Who an attempt's message came from, and how that is known (``source``):
    ``recorded`` with its intent (a transport that looks messages up records the sender
    it named, until the notice ends), else its ``policy``'s sender (resolved at enqueue,
    so what was sent), else ``transport``: the transport's own setting of the time.

    A sender is not a secret; of the recorded fingerprint only its sender keys are
    shown, never the digest of the body beside them.
    """
    try:
        recorded = json.loads(sent) if sent else None
    except ValueError:
        recorded = None
    if isinstance(recorded, dict):
        named = {k: str(recorded[k]) for k in SENDER_KEYS if recorded.get(k)}
        if named:
            return {"source": "recorded", **named}
    configured = policy.sender.for_channel(channel)
    if configured:
        return {"source": "policy", **configured}
    return {"source": "transport"}


def notice_report(store: Store, notice_id: str, now: float) -> dict[str, Any]:
    """Everything needed to act on one notice, as JSON-able data."""
    loaded = store.load_notice(notice_id)
    if loaded is None:
        raise NoticeNotFound(f"no notice {notice_id!r}")
    policy = store.load_policy(loaded.policy_name, loaded.policy_version)
    state = loaded.state
    decision = machine.decide(state, policy, now)
    leased = loaded.lease_expires_at is not None and loaded.lease_expires_at > now
    attempts = []
    for row in store.attempt_rows(notice_id):
        observation = None
        if row["observed_at"] is not None:
            observation = {
                "at": iso(row["observed_at"]),
                "source": row["source"],
                "raw_status": row["raw_status"],
                "status": row["status"],
            }
        folded = state.attempt(row["channel"])
        attempts.append(
            {
                "channel": row["channel"],
                "attempt_key": row["attempt_key"],
                "transport": row["transport"],
                "state": row["state"],
                "status": None if folded is None else folded.status.value,
                "in_doubt": bool(folded and folded.in_doubt),
                "sender": attempt_sender(row["sent"], row["channel"], policy),
                "template_version": row["template_version"],
                "locale": row["locale"],
                "segments": row["segments"],
                "started_at": iso(row["started_at"]),
                "submitted_at": iso(row["submitted_at"]),
                "message_id": row["message_id"],
                "calls": row["calls"],
                "polls": row["polls"],
                "lookups": row["lookups"],
                "counts_as_success": bool(
                    folded and policy.succeeds(row["channel"], folded.status)
                ),
                "last_error": row["last_error"],
                "last_observation": observation,
            }
        )
    next_action = None
    if decision.action is not machine.ActionKind.NONE and decision.due_at is not None:
        next_action = {
            "action": decision.action.value,
            "channel": decision.channel,
            "due_at": iso(decision.due_at),
            "due_in_seconds": round(decision.due_at - now, 3),
            "reason": decision.reason.value,
        }
    elif not state.phase.terminal:
        next_action = {
            "action": "settle",
            "channel": None,
            "due_at": iso(now),
            "due_in_seconds": 0.0,
            "reason": decision.reason.value,
            "phase": decision.phase.value,
        }
    history = [
        {
            "at": iso(row["at"]),
            "kind": row["kind"],
            "old_phase": row["old_phase"],
            "new_phase": row["new_phase"],
            "attempt_key": row["attempt_key"],
            "channel": row["channel"],
            "status": row["status"],
            "polls": row["polls"],
            "reason": row["reason"],
            "worker": row["worker"],
            # How long the step's call waited for its transport's lane (a slot, a rate
            # token, a provider's Retry-After): a slow provider's queue, not ours.
            "lane_wait_seconds": row["lane_wait"],
        }
        for row in store.event_rows(notice_id)
    ]
    return {
        **notice_header(loaded, now),
        "locale": loaded.locale,
        # The consent the enqueue gave, and the channels the policy ruled out (consent,
        # destination, a country's SMS cap) with why: why a channel was never tried.
        "consent": _consent(loaded.consent),
        "skipped": {e["channel"]: e["reason"] for e in history if e["kind"] == "skipped"},
        # Per channel, who the notice's policy sends from (empty: the transport's own).
        "senders": {c: policy.sender.for_channel(c) for c in state.channels},
        "state_age_seconds": round(now - loaded.phase_since, 3),
        "next_action": next_action,
        "action_budget": _action_budget(state, policy, now),
        "lease": {
            "owner": loaded.lease_owner,
            "expires_at": iso(loaded.lease_expires_at),
            "active": leased,
        }
        if loaded.lease_owner
        else None,
        "attempts": attempts,
        "history": history,
    }
