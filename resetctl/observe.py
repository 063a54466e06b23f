"""Callback ingestion: a provider's status report goes through the same machine as a poll.

The observation is stored whatever happens (evidence). The decision is written in the
same transaction, on the row as it is now: if a sweep changed the notice first, the
callback decides on the fresh facts; if the callback commits first, the sweep's pending
write loses its compare-and-set and that sweep decides again. A notice another worker
holds keeps its lease unless the callback ends it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from resetctl import machine, tracing
from resetctl.errors import NoticeNotFound
from resetctl.machine import Observed, Status
from resetctl.store import ObservationFacts, Step, Store
from resetctl.transports.base import CallbackReader, CallbackRequest


@dataclass(frozen=True, slots=True)
class CallbackResult:
    """What a recorded callback did."""

    #: the notice the message belongs to
    notice_id: str
    #: the channel of the message
    channel: str
    #: phase before and after
    old_phase: str
    new_phase: str
    #: the normalized status recorded
    status: str
    #: True when this callback was seen before (a provider's retry): stored once, no-op
    duplicate: bool = False
    #: the provider's status word as recorded: verbatim when documented, else
    #: ``unknown:<length>`` (normalized in ``status``)
    raw_status: str = ""


def record_callback(
    store: Store,
    transport: str,
    message_id: str | None,
    raw_status: str,
    status: Status,
    now: float,
    worker: str = "callback",
    *,
    attempt_key: str | None = None,
    dedupe: str | None = None,
) -> CallbackResult:
    """Record a provider's status report for ``message_id`` and act on it.

    The report is matched by the provider's message id or, when the callback URL carried
    it, by ``attempt_key``: an attempt whose submission reply was lost has no message id
    yet, and the callback proves the message exists (the id is recorded on the attempt).
    ``raw_status`` is stored and shown as given: pass the transport's evidence of it
    (:meth:`StatusVocabulary.reading`), never an undocumented word verbatim. ``dedupe``
    identifies the callback (default: transport, message id and raw status; Twilio's are
    a digest of what was signed): a provider's retry of the same report is stored once
    and changes nothing.
    """
    identity = dedupe or f"{transport}:{message_id}:{raw_status}"
    started = time.monotonic()  # the callback's span: from `now`, for as long as it took

    def write() -> CallbackResult:
        found = None if message_id is None else store.attempt_for_message(transport, message_id)
        if found is None and attempt_key is not None:
            found = store.attempt_by_key(transport, attempt_key)
        if found is None:
            named = "" if message_id is None else f" {message_id!r}"
            raise NoticeNotFound(f"no {transport} message{named} is known here")
        notice_id, channel, key = found
        loaded = store.load_notice(notice_id)
        assert loaded is not None  # attempts reference notices
        if store.observation_seen(identity):
            phase = loaded.state.phase.value
            return CallbackResult(notice_id, channel, phase, phase, status.value, True, raw_status)
        policy = store.load_policy(loaded.policy_name, loaded.policy_version)
        event = Observed(channel, status, is_poll=False, message_id=message_id)
        state, decision = machine.transition(loaded.state, policy, event, now)
        leased = loaded.lease_expires_at is not None and loaded.lease_expires_at > now
        store.write_step(
            Step(
                notice_id=notice_id,
                version=loaded.version,
                lease_token=None,
                old_phase=loaded.state.phase,
                decision=decision,
                release=not leased,
                facts=ObservationFacts(
                    key, "callback", raw_status, status, message_id=message_id, dedupe=identity
                ),
                kind="callback",
                worker=worker,
                now=now,
                channel=channel,
            )
        )
        return CallbackResult(
            notice_id,
            channel,
            loaded.state.phase.value,
            state.phase.value,
            status.value,
            raw_status=raw_status,
        )

    # A lock cycle with a sweep writing the same notice rolls it all back: run it again.
    result = store.retried_transaction(write)
    tracing.callback_recorded(result, worker, now, time.monotonic() - started)
    return result


def record_request(
    store: Store, instance: str, reader: CallbackReader, request: CallbackRequest, now: float
) -> CallbackResult | None:
    """Verify ``request`` with ``instance``'s reader and record each report it carries;
    the first report's result (None when a verified request reports nothing)."""
    results = [
        record_callback(
            store,
            instance,
            report.message_id,
            report.raw_status,
            report.status,
            now,
            attempt_key=report.attempt_key,
            dedupe=report.dedupe,
        )
        for report in reader.read(request, now)
    ]
    return results[0] if results else None
