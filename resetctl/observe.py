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
from typing import NamedTuple

from resetctl import machine, tracing
from resetctl.errors import MalformedCallback, NoticeNotFound, SignatureMismatch
from resetctl.machine import Observed, Status
from resetctl.store import ObservationFacts, Step, Store


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
    message_id: str,
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
        found = store.attempt_for_message(transport, message_id)
        if found is None and attempt_key is not None:
            found = store.attempt_by_key(transport, attempt_key)
        if found is None:
            raise NoticeNotFound(f"no {transport} message {message_id!r} is known here")
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


class VerifiedCallback(NamedTuple):
    """A provider's status report whose signature matched: what record_callback takes."""

    message_id: str
    #: the raw status as evidence (an undocumented one as ``unknown:<length>``)
    raw_status: str
    status: Status
    attempt_key: str | None
    dedupe: str


def verified_twilio_callback(
    body: str | bytes, url: str, signature: str, token: str
) -> VerifiedCallback:
    """A Twilio status callback, verified. SignatureMismatch for a forged one,
    MalformedCallback for a body that is not a status report."""
    from urllib.parse import parse_qsl

    from resetctl.transports import twilio

    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCallback(["body: not UTF-8 form data; nothing recorded"]) from None
    params = dict(parse_qsl(body.strip(), keep_blank_values=True))
    if not twilio.verify_signature(url, params, signature, token):
        raise SignatureMismatch(["signature: does not match the body and URL; nothing recorded"])
    try:
        message_id, raw = twilio.callback_status(params)
    except ValueError as exc:
        raise MalformedCallback([f"body: {exc}"]) from None
    evidence, status = twilio.VOCABULARY.reading(raw)
    attempt = twilio.attempt_from_callback_url(url)
    return VerifiedCallback(
        message_id, evidence, status, attempt, twilio.callback_identity(url, params, token)
    )
