"""Which provider instance a call goes to: the failover rules, pure.

A channel names its instances in order. An attempt is bound to the instance that
carried it: its status reads and lookups go there, and so does a resubmission under a
key that instance dedupes by. A new attempt, or a retry of one that provably created
nothing, goes to the first healthy instance (not the one that just failed it, while
another is healthy). An attempt in doubt is never sent on another instance until its
doubt is resolved, unless the policy trades that for reach (``failover_on_doubt``): then
a doubt whose instance is out of use is sent on the next healthy one, and the person may
get two messages.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import NamedTuple

from resetctl.machine.vocabulary import ActionKind, Attempt, Decision


class Route(NamedTuple):
    """Where one decided call goes."""

    #: the instance that makes the call; None when no configured instance may
    instance: str | None
    #: the call to make there (a lookup becomes a submission when a doubt fails over)
    action: ActionKind
    #: True when the attempt moves to another instance than the one it is bound to
    moved: bool = False


def route(
    decision: Decision,
    attempt: Attempt | None,
    bound: str | None,
    chain: Sequence[str],
    healthy: Set[str],
    *,
    failover_on_doubt: bool = False,
) -> Route:
    """The instance for ``decision``'s call.

    ``bound`` is the instance ``attempt`` was last sent on (None before the first call),
    ``chain`` the channel's configured instances in order, ``healthy`` those in use now.
    With no healthy instance a new submission still goes to the first one: it waits
    there for that instance's cooldown and probe rather than being given up.
    """
    action = decision.action
    configured = list(chain)
    if attempt is None or bound is None:
        return Route(_first(configured, healthy), action)
    if action in (ActionKind.POLL, ActionKind.NONE):
        return Route(bound, action)
    doubt = action is ActionKind.LOOKUP or attempt.doubtful
    if doubt:
        elsewhere = [name for name in configured if name != bound and name in healthy]
        if failover_on_doubt and bound not in healthy and elsewhere:
            return Route(elsewhere[0], ActionKind.SUBMIT, True)
        if bound not in configured and action is ActionKind.SUBMIT:
            return Route(None, action)  # a key only that instance dedupes by
        return Route(bound, action)
    # Nothing was created: any instance may take it, the one that just failed it last.
    target = next((n for n in configured if n != bound and n in healthy), None)
    if target is None:
        target = bound if bound in healthy and bound in configured else _first(configured, healthy)
    return Route(target, action, target is not None and target != bound)


def _first(chain: Sequence[str], healthy: Set[str]) -> str | None:
    """The first healthy instance, else the first of all (None for an empty chain)."""
    for name in chain:
        if name in healthy:
            return name
    return chain[0] if chain else None
