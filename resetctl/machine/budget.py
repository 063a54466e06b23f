"""The deadline budget: how a live notice's remaining lifetime compares with what its
next action needs, and so whether it is at risk."""

from __future__ import annotations

import math
from dataclasses import dataclass

from resetctl.machine.decisions import decide
from resetctl.machine.vocabulary import (
    ActionKind,
    Decision,
    NoticeState,
    Phase,
)
from resetctl.policy import Policy


@dataclass(frozen=True, slots=True)
class Budget:
    """How a live notice's remaining lifetime compares with what its next action needs:
    the one answer to "what next, by when, is it still possible, is it at risk" that
    ``inspect``, ``alerts``, ``health`` and the metrics read."""

    #: the decision the machine would take now
    decision: Decision
    #: seconds of link lifetime left
    remaining: float
    #: seconds of lifetime the next action needs from now: the wait until it is due, plus
    #: the reserve it must still find (the send or fallback reserve, or none for a read
    #: that can no longer lead to a fallback); infinite when the next sweep ends the
    #: notice without success
    needed: float
    #: the next action can still change the outcome: a submission, or a read that can
    #: still lead to a fallback
    helps: bool = True
    #: the policy's warning margin (``alert_warning``)
    warning: float = 0.0
    #: the channel a fallback would use, if the notice has one
    fallback: str | None = None
    #: the last moment a fallback still finds its reserve (None without a fallback)
    fallback_deadline: float | None = None
    #: a fallback can still be started (claimed) before its deadline
    fallback_possible: bool = False
    #: when the budget was worked out (the ``now`` it was asked at)
    at: float = 0.0

    @property
    def margin(self) -> float:
        """Seconds to spare: remaining less needed."""
        return self.remaining - self.needed

    @property
    def at_risk(self) -> bool:
        """True when the margin is within the policy's warning (or gone): the notice
        may not be delivered before its link dies. ``alerts`` lists exactly these."""
        return self.decision.phase is not Phase.ACCEPTED and self.margin <= self.warning

    @property
    def actionable(self) -> bool:
        """True when someone acting now (restarting a sweeper) can still save it."""
        return self.helps and self.margin > 0

    @property
    def level(self) -> str:
        """``critical`` while a useful action is overdue (the sweeper is not taking it)
        and can still land; ``warning`` when at risk otherwise; ``ok``."""
        if not self.at_risk:
            return "ok"
        overdue = self.decision.due_at is not None and self.decision.due_at <= self.at
        return "critical" if self.actionable and overdue else "warning"


def fallback_of(state: NoticeState, policy: Policy) -> tuple[str | None, float | None]:
    """The channel a fallback would use and the last moment it still finds its reserve
    (both None for a notice with one channel)."""
    if len(state.channels) < 2:
        return None, None
    return state.channels[1], state.expires_at - policy.fallback_reserve


def reserve_for(state: NoticeState, policy: Policy, decision: Decision) -> tuple[float, bool]:
    """The lifetime a decided action must still find when it lands, and whether it can
    still change the outcome: a submission needs its send or fallback reserve; a read
    that may still lead to a fallback needs the fallback reserve; any other read can only
    tell what already happened."""
    on_fallback = decision.phase is Phase.FALLBACK_PENDING
    if decision.action is ActionKind.SUBMIT:
        return (policy.fallback_reserve if on_fallback else policy.send_reserve), True
    if not on_fallback and len(state.channels) > 1:
        return policy.fallback_reserve, True
    return 0.0, False


def action_deadline(state: NoticeState, policy: Policy, decision: Decision) -> float:
    """When the decided action stops being useful (what a sweep's lanes order by)."""
    reserve, _ = reserve_for(state, policy, decision)
    return state.expires_at - reserve


def budget(state: NoticeState, policy: Policy, now: float) -> Budget | None:
    """The deadline budget of a live notice (None once it is terminal)."""
    if state.phase.terminal:
        return None
    decision = decide(state, policy, now)
    remaining = state.expires_at - now
    fallback, deadline = fallback_of(state, policy)
    possible = bool(
        fallback is not None
        and deadline is not None
        and state.phase is not Phase.FALLBACK_PENDING
        and state.attempt(fallback) is None
        and now < deadline
    )

    def answer(needed: float, helps: bool) -> Budget:
        return Budget(
            decision, remaining, needed, helps, policy.alert_warning, fallback, deadline,
            possible, now,
        )  # fmt: skip

    if decision.phase.terminal:
        # The next sweep will end it: nothing it still needs can happen in time.
        needed = math.inf if decision.phase is not Phase.ACCEPTED else 0.0
        return answer(needed, helps=False)
    assert decision.due_at is not None
    wait = max(0.0, decision.due_at - now)
    reserve, helps = reserve_for(state, policy, decision)
    return answer(wait + reserve, helps)
