"""The one transition function and the phase vocabulary.

``transition(state, policy, event, now)`` folds one new input (a tick, a submission
outcome, a poll result or a callback) into a notice's facts and decides the next phase,
the side effect to perform and when. It reads no clock, database, network, environment
or log: ``sweep``, callback ingestion and ``replay`` all call it, and none of them holds a
copy of these rules.
"""

from __future__ import annotations

from resetctl.machine.budget import (
    Budget,
    action_deadline,
    budget,
    fallback_of,
    reserve_for,
)
from resetctl.machine.decisions import (
    decide,
    transition,
)
from resetctl.machine.facts import (
    apply,
    elapsed,
    monotonic_reading,
)
from resetctl.machine.vocabulary import (
    ATTEMPT_STATES,
    CANCEL_REASONS,
    LIVE_PHASES,
    OUT_OF_TIME,
    PHASES,
    REFUSAL_REASONS,
    SKIP_REASONS,
    STATUSES,
    TERMINAL_PHASES,
    ActionKind,
    Attempt,
    AttemptState,
    Cancelled,
    ChannelSkipped,
    Decision,
    Event,
    LookedUp,
    NoticeState,
    Observed,
    OutcomeKind,
    Phase,
    Reason,
    Status,
    SubmissionOutcome,
    SubmissionStarted,
    Tick,
    attempt_key,
    fold_status,
)

__all__ = [
    "ATTEMPT_STATES",
    "CANCEL_REASONS",
    "LIVE_PHASES",
    "OUT_OF_TIME",
    "PHASES",
    "REFUSAL_REASONS",
    "SKIP_REASONS",
    "STATUSES",
    "TERMINAL_PHASES",
    "ActionKind",
    "Attempt",
    "AttemptState",
    "Budget",
    "Cancelled",
    "ChannelSkipped",
    "Decision",
    "Event",
    "LookedUp",
    "NoticeState",
    "Observed",
    "OutcomeKind",
    "Phase",
    "Reason",
    "Status",
    "SubmissionOutcome",
    "SubmissionStarted",
    "Tick",
    "action_deadline",
    "apply",
    "attempt_key",
    "budget",
    "decide",
    "elapsed",
    "fallback_of",
    "fold_status",
    "monotonic_reading",
    "reserve_for",
    "transition",
]
