"""What a region's policy lets a notice use, decided at enqueue: the channels left once
consent and destination rules have ruled some out, and whether an abuse limit refuses it.

Pure, like the rest of the machine: enqueue gives it the facts (which contacts the
request has, the consent it gave, where the number is and what kind it is, the counts a
limit has seen), and it reads no clock, database or network. The sweep asks the same
module whether an SMS fits its country's hourly cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from resetctl.machine.vocabulary import Reason
from resetctl.policy import Channel, OnNoChannel, OnRefusal, Policy


@dataclass(frozen=True, slots=True)
class Destination:
    """Where an SMS would go, as libphonenumber reads the number (not a secret: a
    country and a kind of number, never the number)."""

    #: ISO 3166 alpha-2 code of the number's country (``ZZ`` when unknown)
    country: str
    #: libphonenumber's type, lower case (``mobile``, ``premium_rate`` …)
    number_type: str


@dataclass(frozen=True, slots=True)
class Admission:
    """The policy's answer for one request."""

    #: the channels the notice will use, in policy order
    channels: tuple[str, ...]
    #: the channels ruled out, with why, in policy order
    skipped: tuple[tuple[str, Reason], ...] = ()
    #: the request is refused for this reason (nothing is stored for it)
    refused: Reason | None = None
    #: the enqueue field the refusal is about
    field: str | None = None

    @property
    def fails(self) -> bool:
        """Stored, but as ``failed``: every channel ruled out and the policy says so."""
        return self.refused is None and not self.channels


def destination_refusal(policy: Policy, destination: Destination) -> Reason | None:
    """Why ``policy`` will not text ``destination``, or None."""
    if policy.sms_countries is not None and destination.country not in policy.sms_countries:
        return Reason.DESTINATION_COUNTRY
    if destination.number_type not in policy.sms_number_types:
        return Reason.DESTINATION_TYPE
    return None


def admit(
    policy: Policy,
    reachable: Iterable[str],
    consent: frozenset[str] | None,
    destination: Destination | None,
) -> Admission:
    """The channels a request may use under ``policy``.

    ``reachable`` are the channels the request has a contact for; ``consent`` the channels
    the person agreed to (None: the request said nothing, which satisfies no
    ``requires_consent``); ``destination`` where its number goes. A channel without the
    consent its policy requires is skipped (``no_consent``). A destination the policy
    does not text refuses the request, or with ``on_refused_destination = "skip"`` skips
    the SMS. When every reachable channel was ruled out the request is refused (with the
    one reason they share, else ``no_channel``), or with ``on_no_channel = "fail"`` stored
    as failed.
    """
    have = set(reachable)
    channels: list[str] = []
    skipped: list[tuple[str, Reason]] = []
    for channel in policy.channels:
        if channel not in have:
            continue
        if channel in policy.requires_consent and (consent is None or channel not in consent):
            skipped.append((str(channel), Reason.NO_CONSENT))
            continue
        if channel is Channel.SMS and destination is not None:
            refusal = destination_refusal(policy, destination)
            if refusal is not None:
                if policy.on_refused_destination is OnRefusal.REFUSE:
                    return Admission((), tuple(skipped), refusal, "phone")
                skipped.append((str(channel), refusal))
                continue
        channels.append(str(channel))
    if channels or not skipped:
        return Admission(tuple(channels), tuple(skipped))
    if policy.on_no_channel is OnNoChannel.FAIL:
        return Admission((), tuple(skipped))
    reasons = {reason for _, reason in skipped}
    why = reasons.pop() if len(reasons) == 1 else Reason.NO_CHANNEL
    return Admission((), tuple(skipped), why, "consent" if why is Reason.NO_CONSENT else "phone")


#: Counts of a limit inside its window: [start, count] pairs, oldest first (JSON-able).
Counts = list[list[float]]


def counted(
    counts: Sequence[Sequence[float]],
    now: float,
    window: float,
    limit: int,
    granularity: float = 0.0,
) -> Counts | None:
    """``counts`` with one more at ``now``, or None when that would make more than
    ``limit`` inside the ``window`` seconds before ``now``.

    With a ``granularity`` (seconds) counts share buckets that start on its multiples,
    so a busy subject's row stays small; a bucket counts whole while its start is inside
    the window, which can only refuse early, never let more through.
    """
    kept = [[float(start), float(n)] for start, n in counts if start > now - window]
    if sum(n for _, n in kept) + 1 > limit:
        return None
    start = now if granularity <= 0 else now - now % granularity
    if kept and kept[-1][0] == start:
        kept[-1][1] += 1
    else:
        kept.append([start, 1.0])
    return kept
