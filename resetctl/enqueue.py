"""Enqueue reset notices: validate every request, then write all of them or none.

The library entry point is :func:`enqueue`; ``resetctl enqueue`` feeds it JSON lines.
Error messages name the line and the field, never the value (it may be a secret).
"""

from __future__ import annotations

import enum
import hmac
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from resetctl import privacy, tracing
from resetctl import request_fields as checks
from resetctl.config import RolloutMode, Settings
from resetctl.controls import supersede
from resetctl.errors import ConfigError, InputError, StoreError, label
from resetctl.files import bounded_lines
from resetctl.frozen import fast_init
from resetctl.limits import recipient_hash, take_recipient_limits
from resetctl.machine import OutcomeKind, Phase, Reason
from resetctl.machine.admission import Admission, admit
from resetctl.policy import Channel, Policy
from resetctl.request_fields import FIELDS as FIELDS
from resetctl.rollout import SliceRequest, outside_slice
from resetctl.store import Contact, NewNotice, Store, database_errors, new_notice_id
from resetctl.transports.base import Transport

if TYPE_CHECKING:
    from resetctl.providers import Providers

if TYPE_CHECKING:
    from resetctl.sweep import Sweeper
    from resetctl.work import SendReport, SweepOptions


class SendReason(enum.StrEnum):
    """Why ``enqueue --send`` did not make a notice's first submission (``reason``).

    The notice is committed whatever the reason; ``phase`` says where it stands.
    """

    #: the call failed and provably created nothing; cron's sweep retries it, same key
    TRANSIENT = "transient"
    #: the provider may have created it (a 5xx, a time-out); cron's sweep looks it up or
    #: resubmits under the same key, never blindly
    AMBIGUOUS = "ambiguous"
    #: the provider refused it for good, or it could not be rendered: that channel has
    #: failed (the phase says whether a fallback follows)
    PERMANENT = "permanent"
    #: the call was not made (the lease could not cover its time-out); cron's sweep makes it
    DECLINED = "declined"
    #: too little of the link's lifetime was left for a useful message; nothing was sent
    #: and the notice is expired
    EXPIRED = "expired"
    #: the idempotency key names a notice that was already terminal; nothing was sent
    ALREADY_TERMINAL = "already_terminal"
    #: the key names a live notice already past its first submission, or another worker
    #: holds it; this call sent nothing
    IN_PROGRESS = "in_progress"
    #: the call was made but its outcome could not be recorded (the database failed): the
    #: message may have gone out; cron's sweep recovers it by key or lookup once the lease
    #: lapses, never by a blind resend
    IN_DOUBT = "in_doubt"
    #: the database failed before this notice's call: nothing was sent; cron's sweep sends
    #: it (once the lease lapses, if it was claimed)
    STORE_ERROR = "store_error"
    #: the provider asked us to slow down (HTTP 429): nothing was created and it spent no
    #: retry; cron's sweep sends it once the provider's pause is over
    THROTTLED = "throttled"
    #: enqueued under ``[rollout] mode = "shadow"``: everything ran but the provider call,
    #: nothing was sent and the notice is cancelled (``shadow``); the application sends it
    SHADOW = "shadow"


#: How a call that went out but was not taken ended, as a reason.
_CALL_REASONS = {
    OutcomeKind.TRANSIENT: SendReason.TRANSIENT,
    OutcomeKind.AMBIGUOUS: SendReason.AMBIGUOUS,
    OutcomeKind.PERMANENT: SendReason.PERMANENT,
}


@fast_init
@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """One line of ``resetctl enqueue`` output."""

    #: None only for a request its policy refused (``refused``)
    notice_id: str | None
    idempotency_key: str
    created: bool
    #: with ``send``: whether this call made the first submission and recorded it (the
    #: notice is committed either way)
    submitted: bool | None = None
    #: with ``send``, when not submitted: why (see :class:`SendReason`)
    reason: SendReason | None = None
    #: with ``send``: the notice's phase once this call was done with it (None only when
    #: an existing notice could not be read back)
    phase: Phase | None = None
    #: the account's older live notices in the region that this one cancelled
    #: (``superseded``) before its own first submission
    superseded: tuple[str, ...] = ()
    #: the policy refused the request (nothing stored for it): rate_limited, no_consent,
    #: destination_country, destination_type or no_channel
    refused: Reason | None = None
    #: with ``refused``: the field it is about, and the problem (naming its line)
    field: str | None = None
    problem: str | None = None
    #: channels the policy ruled out of this notice, with why (a new notice only)
    skipped: tuple[tuple[str, Reason], ...] = ()
    #: False for a request ``[rollout] percent`` left out of the slice: nothing is stored
    #: for it and resetctl sends nothing; the application sends it by its own path
    in_slice: bool = True
    #: the notice was enqueued in shadow (``[rollout] mode = "shadow"``): resetctl runs it
    #: but sends nothing; the application sends it by its own path
    shadow: bool = False

    def to_json(self) -> dict[str, Any]:
        """The public JSON shape."""
        shape: dict[str, Any] = {
            "notice_id": self.notice_id,
            "idempotency_key": self.idempotency_key,
            "created": self.created,
        }
        if not self.in_slice:
            shape["in_slice"] = False
        if self.shadow:
            shape["shadow"] = True
        if self.submitted is not None:
            shape["submitted"] = self.submitted
            shape["reason"] = None if self.reason is None else self.reason.value
            shape["phase"] = None if self.phase is None else self.phase.value
        if self.superseded:
            shape["superseded"] = list(self.superseded)
        if self.refused is not None:
            shape["refused"] = self.refused.value
            shape["field"] = self.field
        if self.skipped:
            shape["skipped"] = {channel: why.value for channel, why in self.skipped}
        return shape


#: The request digest's canonical JSON (json.dumps with these arguments would build a
#: new encoder per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _digest(salt: bytes, request: Mapping[str, Any]) -> str:
    # The fields as given: a ttl compares as written, not as the expiry it computes.
    canonical = _CANONICAL.encode(request)
    return hmac.digest(salt, canonical.encode(), "sha256").hex()


def _unknown_region(settings: Settings) -> str:
    """Why a region without its own policy is refused, and the two ways out (the region
    itself is the application's text: not repeated)."""
    configured = ", ".join(label(name) for name in sorted(settings.policies))
    return (
        f"no [policy.<region>] table for this region (configured: {configured}); add one,"
        ' or set unknown_region = "default" to send it under [policy.default]'
    )


@fast_init
@dataclass(frozen=True, slots=True)
class Refusal:
    """A valid request its policy will not send (consent, destination): that line is
    refused, and nothing is stored for it; the rest of its batch goes on."""

    idempotency_key: str
    request_digest: str
    policy: str
    reason: Reason
    field: str
    problem: str

    def result(self, shadow: bool = False) -> EnqueueResult:
        """Its line of output; ``shadow`` under ``[rollout] mode = "shadow"`` (what resetctl
        would refuse, the application's own path decides)."""
        return EnqueueResult(
            None,
            self.idempotency_key,
            False,
            refused=self.reason,
            field=self.field,
            problem=self.problem,
            shadow=shadow,
        )


def validate_request(
    request: object,
    line: int,
    settings: Settings,
    salt: bytes,
    now: float,
    hash_key: bytes,
) -> tuple[NewNotice | Refusal | None, list[str]]:
    """Check one request; returns the notice to insert, the policy's refusal of it, or
    the problems found.

    ``salt`` (the database's) keys the request digest, over fields that include the
    secret reset URL; ``hash_key`` (kept outside the database) keys the recipient hash
    that logs use for correlation, so the database alone cannot test an address.
    """
    problems = checks.LineProblems(line)
    if not isinstance(request, Mapping):
        problems.add("(line)", "expected a JSON object")
        return None, problems.problems
    for field in sorted(request.keys() - FIELDS):
        shown = label(field)
        if shown == field:
            problems.add(field, "unknown field")
        else:  # a name that cannot stand in the field slot is quoted in the problem
            problems.add("(field)", f"unknown field {shown}")
    before = len(problems.problems)
    key = checks.text(request, "idempotency_key", problems)
    if key is None and len(problems.problems) == before:  # absent or null
        problems.add("idempotency_key", "required")
    region = checks.text(request, "region", problems) or "default"
    policy = settings.policy_for(region)
    if policy is None:
        problems.add("region", _unknown_region(settings))
        policy = settings.default_policy  # the other fields are still checked
    before_contacts = len(problems.problems)
    email = checks.email(checks.text(request, "email", problems), problems)
    phone, destination = checks.phone(checks.text(request, "phone", problems), problems)
    contact_problems = len(problems.problems) > before_contacts
    url = checks.reset_url(
        checks.text(request, "reset_url", problems), problems, settings.reset_url_hosts
    )
    display_name = checks.text(request, "display_name", problems)
    account_ref = checks.text(request, "account_ref", problems)
    locale = checks.locale(checks.text(request, "locale", problems), problems)
    consent = checks.consent(request, problems)
    expires = checks.expiry(request, policy, now, problems)
    contacts = {Channel.EMAIL: email, Channel.SMS: phone}
    reachable = tuple(str(c) for c in policy.channels if contacts[c] is not None)
    if not reachable and not contact_problems:
        wanted = " or ".join("email" if c is Channel.EMAIL else "phone" for c in policy.channels)
        problems.add(
            "email/phone",
            f"policy.{policy.name} sends by {', '.join(policy.channels)}; give {wanted}",
        )
    if problems.problems or key is None or url is None or expires is None or not reachable:
        return None, problems.problems
    admission = admit(
        policy, reachable, None if consent is None else frozenset(consent), destination
    )
    if admission.refused is not None:
        return _refusal(line, key, _digest(salt, request), policy, admission), []
    first = contacts[Channel((admission.channels or reachable)[0])]
    notice = NewNotice(
        notice_id=new_notice_id(),
        idempotency_key=key,
        request_digest=_digest(salt, request),
        account_ref=account_ref,
        region=region,
        policy=policy,
        channels=admission.channels,
        recipient_hash=None if first is None else recipient_hash(hash_key, first),
        created_at=now,
        expires_at=expires,
        contact=Contact(email=email, phone=phone, reset_url=url, display_name=display_name),
        locale=locale,
        consent=consent,
        skipped=admission.skipped,
    )
    return notice, []


_RULES = {
    Reason.NO_CONSENT: "requires_consent",
    Reason.DESTINATION_COUNTRY: "sms.allowed_countries",
    Reason.DESTINATION_TYPE: "sms.number_types",
}


def _refusal(line: int, key: str, digest: str, policy: Policy, admission: Admission) -> Refusal:
    """The policy's refusal of a request, as its line's problem (naming the rule, never
    a contact)."""
    why = admission.refused
    assert why is not None
    assert admission.field is not None
    if why is Reason.NO_CHANNEL:
        ruled_out = ", ".join(f"{channel} ({reason})" for channel, reason in admission.skipped)
        detail = f"every channel was ruled out: {ruled_out}"
    elif why is Reason.NO_CONSENT:
        needed = ", ".join(sorted(str(c) for c in policy.requires_consent))
        detail = f"policy.{policy.name} sends {needed} only with consent, which this request lacks"
    else:
        detail = f"the number is not one policy.{policy.name}.{_RULES[why]} allows"
    problem = f"line {line}: {admission.field}: refused ({why}): {detail}"
    return Refusal(key, digest, policy.name, why, admission.field, problem)


def enqueue(
    store: Store,
    settings: Settings,
    requests: Iterable[object],
    now: float,
    hash_key: bytes | None = None,
    *,
    send: bool = False,
    transports: Mapping[str, Transport] | None = None,
    clock: Callable[[], float] = time.time,
) -> list[EnqueueResult]:
    """Validate and record reset notices, all or none; with ``send``, make their first
    submission before returning.

    Each request is a mapping with the fields of ``resetctl enqueue``. The same
    idempotency key with the same fields returns the existing notice (``created`` is
    False); with different fields it is an error. Any problem raises InputError listing
    every problem by line (1-based position), and nothing is written. ``hash_key`` keys
    the recipient hashes; by default it is RESETCTL_HASH_KEY or the key file (see
    :func:`resetctl.privacy.hash_key`).

    ``send`` builds and checks what the submission needs first (:func:`prepare_send`;
    ``transports`` default to the configured ones), then commits the notices, then claims
    exactly those and submits them as a sweep would. Once committed, every notice gets
    its result, whatever its submission did: see :meth:`FirstSender.send`.
    """
    numbered = list(enumerate(requests, start=1))
    if not send:
        return _enqueue_numbered(store, settings, numbered, now, hash_key=hash_key)
    sender = prepare_send(store, settings, transports, clock)
    try:
        results = _enqueue_numbered(store, settings, numbered, now, hash_key=hash_key)
        return sender.send(results)
    finally:
        sender.close()


def prepare_send(
    store: Store,
    settings: Settings,
    transports: Mapping[str, Transport] | None = None,
    clock: Callable[[], float] = time.time,
    environ: Mapping[str, str] | None = None,
) -> FirstSender:
    """What the first submission needs, built and checked before anything is committed:
    the templates, the transports (with their credentials) and the lease, as a sweep
    checks them before it claims. ConfigError when one is unusable; nothing is written
    then. ``transports`` given are the caller's to close; built ones close with the
    sender."""
    from resetctl.clocks import default_worker_id
    from resetctl.sweep import Sweeper
    from resetctl.templates import require_templates
    from resetctl.transports import build_transports, close_transports
    from resetctl.work import SweepOptions

    policy = settings.default_policy
    options = SweepOptions(
        worker_id=f"enqueue:{default_worker_id()}",
        batch_size=policy.batch_size,
        lease=policy.lease,
        concurrency=settings.concurrency,
    )
    built: Providers | None = None
    try:
        require_templates(settings)
        if transports is None:
            built = build_transports(settings, store, clock, environ)
        sweeper = Sweeper(store, settings, built or transports or {}, clock=clock)
        sweeper.check_lease(options.lease)
    except ConfigError as exc:
        if built is not None:
            close_transports(built)
        raise ConfigError(f"{exc}; nothing was written") from None
    return FirstSender(store, sweeper, options, built)


@dataclass(slots=True)
class FirstSender:
    """The first submission of notices about to be enqueued (see :func:`prepare_send`)."""

    store: Store
    sweeper: Sweeper
    options: SweepOptions
    #: transports built for this sender, closed with it
    owned: Providers | None

    def send(self, results: list[EnqueueResult]) -> list[EnqueueResult]:
        """Submit just-committed notices now rather than by cron; one result each.

        Never raises for what the submission did, the database included: the notices
        are committed, so each result says ``submitted``, else the ``reason`` (a
        :class:`SendReason`), and the notice's ``phase``.
        """
        stored = [r.notice_id for r in results if r.notice_id is not None]
        report = self.sweeper.send_now(stored, self.options)
        unknown = [notice_id for notice_id in stored if notice_id not in report.phases]
        found = self._phases(unknown) if unknown else {}
        sent = []
        for result in results:
            if result.notice_id is None:  # refused: nothing to send
                sent.append(result)
                continue
            phase = report.phases.get(result.notice_id) or found.get(result.notice_id)
            if phase is None and result.created:
                phase = Phase.QUEUED  # unread: as this call committed it
            reason = _reason(result.notice_id, phase, report)
            sent.append(replace(result, submitted=reason is None, reason=reason, phase=phase))
        return sent

    def _phases(self, notice_ids: list[str]) -> dict[str, Phase]:
        """The phases of notices this run did not work (best effort: the database may
        be what stopped it)."""
        failures: tuple[type[Exception], ...] = (StoreError, *database_errors())
        try:
            loaded = self.store.load_notices(notice_ids)
        except failures:
            return {}
        return {notice_id: notice.state.phase for notice_id, notice in loaded.items()}

    def close(self) -> None:
        """Close the transports built for this sender."""
        if self.owned is not None:
            from resetctl.transports import close_transports

            close_transports(self.owned)
            self.owned = None


def _reason(notice_id: str, phase: Phase | None, report: SendReport) -> SendReason | None:
    """Why a notice's first submission was not made here (None: it was, and recorded)."""
    if notice_id in report.in_doubt:
        return SendReason.IN_DOUBT
    if notice_id in report.shadowed:
        return SendReason.SHADOW
    if notice_id in report.submitted:
        return None
    if notice_id in report.throttled:
        return SendReason.THROTTLED
    call = report.calls.get(notice_id)
    if call in _CALL_REASONS:
        return _CALL_REASONS[call]
    if notice_id in report.asked and notice_id not in report.claimed:
        if phase is not None and phase.terminal:
            return SendReason.ALREADY_TERMINAL
        return SendReason.IN_PROGRESS
    if phase is Phase.EXPIRED:
        return SendReason.EXPIRED
    if report.failure is not None:
        return SendReason.STORE_ERROR
    if call is not None or phase is Phase.QUEUED:
        return SendReason.DECLINED
    return SendReason.IN_PROGRESS


#: The longest input line ``enqueue`` reads: a request's fields fit in a few KiB.
MAX_LINE_BYTES = 64 * 1024
#: The most lines one ``enqueue`` reads (a breach's 50,000 resets fit; more take more
#: calls): the input is checked whole before anything is written, so it is held whole.
MAX_LINES = 200_000


def read_json_lines(stream: BinaryIO) -> list[str]:
    """The lines of a JSON Lines byte stream, split at ``\n`` only (a U+2028 or U+0085
    inside a JSON string is text, not a line end), each at most MAX_LINE_BYTES of UTF-8,
    at most MAX_LINES of them. InputError naming the line otherwise: it reads no more
    than one line past a limit (``/dev/zero`` or a 1 GB line is refused, not loaded)."""
    lines: list[str] = []
    for number, line in enumerate(bounded_lines(stream, MAX_LINE_BYTES), start=1):
        if number > MAX_LINES:
            raise InputError([f"line {number}: more than {MAX_LINES} lines; split the input"])
        lines.append(line.removesuffix("\n").removesuffix("\r"))
    return lines


def enqueue_lines(
    store: Store,
    settings: Settings,
    lines: Iterable[str],
    now: float,
    hash_key: bytes | None = None,
) -> list[EnqueueResult]:
    """``resetctl enqueue``: JSON Lines in, one result per non-blank line out."""
    numbered, problems = _read_lines(lines)
    return _enqueue_numbered(store, settings, numbered, now, problems, hash_key)


def _read_lines(lines: Iterable[str]) -> tuple[list[tuple[int, object]], list[str]]:
    """The non-blank lines' JSON by line number, and the lines that are not JSON."""
    numbered: list[tuple[int, object]] = []
    problems: list[str] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            numbered.append((number, json.loads(text)))
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: (line): not valid JSON ({exc.msg})")
        except (ValueError, RecursionError):
            problems.append(f"line {number}: (line): a number or nesting too large to read")
    return numbered, problems


#: What :func:`check_requests` keys digests and hashes with: it compares them only with
#: each other, and the database's salt and the hash key may not exist yet.
_CHECK_KEY = b"resetctl check, never stored"


def check_requests(settings: Settings, requests: Iterable[object], now: float) -> None:
    """InputError for requests :func:`enqueue` would refuse into an empty database; reads
    and writes nothing. For a database still to be created: refused input creates none."""
    _check_numbered(settings, list(enumerate(requests, start=1)), now, [])


def check_lines(settings: Settings, lines: Iterable[str], now: float) -> None:
    """:func:`check_requests` for JSON Lines, as :func:`enqueue_lines` reads them."""
    numbered, problems = _read_lines(lines)
    _check_numbered(settings, numbered, now, problems)


def _check_numbered(
    settings: Settings, numbered: list[tuple[int, object]], now: float, problems: list[str]
) -> None:
    valid = _validated(settings, numbered, now, problems, _CHECK_KEY, _CHECK_KEY)
    # The one refusal an empty database adds: a key given twice with different fields.
    first: dict[str, str] = {}
    for number, notice in valid:
        if isinstance(notice, Refusal):
            continue  # refused on its own line when written, not an input error
        digest = first.setdefault(notice.idempotency_key, notice.request_digest)
        if digest != notice.request_digest:
            problems.append(f"line {number}: idempotency_key: already used with different fields")
    if problems:
        raise InputError(problems)


def _refused_or_stored(
    store: Store,
    valid: list[tuple[int, NewNotice | Refusal]],
    lines: dict[int, EnqueueResult],
    found: list[str],
) -> dict[int, Refusal]:
    """The refusals whose keys name no stored notice; a refused request whose key is
    already stored (a retry of a request accepted under an earlier config) is answered
    with that notice, as any retry is."""
    refusals = {number: r for number, r in valid if isinstance(r, Refusal)}
    stored = store.stored_notices([r.idempotency_key for r in refusals.values()])
    for number, refusal in list(refusals.items()):
        if refusal.idempotency_key not in stored:
            continue
        del refusals[number]
        notice_id, digest = stored[refusal.idempotency_key]
        if digest != refusal.request_digest:
            found.append(f"line {number}: idempotency_key: already used with different fields")
        else:
            lines[number] = EnqueueResult(notice_id, refusal.idempotency_key, False)
    return refusals


def _take_slice(
    store: Store,
    settings: Settings,
    valid: list[tuple[int, NewNotice | Refusal]],
    lines: dict[int, EnqueueResult],
    found: list[str],
    now: float,
) -> list[tuple[int, NewNotice | Refusal]]:
    """The requests in ``[rollout] percent``'s slice (see :mod:`resetctl.rollout`); each
    one out of it gets its line, ``"in_slice": false``, and nothing else is done for it."""
    requests = [
        SliceRequest(
            entry.idempotency_key,
            entry.request_digest,
            entry.policy.name if isinstance(entry, NewNotice) else entry.policy,
            entry.expires_at
            if isinstance(entry, NewNotice)
            else now + settings.policies[entry.policy].max_ttl,
        )
        for _, entry in valid
    ]
    outside = outside_slice(store, settings.rollout.percent, requests, now)
    if not outside:
        return valid
    kept: list[tuple[int, NewNotice | Refusal]] = []
    for number, entry in valid:
        digest = outside.get(entry.idempotency_key)
        if digest is None:
            kept.append((number, entry))
        elif digest != entry.request_digest:
            found.append(f"line {number}: idempotency_key: already used with different fields")
        else:
            lines[number] = EnqueueResult(None, entry.idempotency_key, False, in_slice=False)
    return kept


def _shadow_lines(store: Store, settings: Settings, lines: dict[int, EnqueueResult]) -> None:
    """Under ``[rollout] mode = "shadow"``, mark the notices this call created; every line
    whose notice was enqueued in shadow says so, a retry's too, whatever the mode now."""
    shadow: set[str] = set()
    created = [r.notice_id for r in lines.values() if r.created and r.notice_id is not None]
    if settings.rollout.mode is RolloutMode.SHADOW and created:
        store.mark_shadow(created)
        shadow.update(created)
    retried = [r.notice_id for r in lines.values() if not r.created and r.notice_id is not None]
    shadow |= store.shadow_among(retried)
    for number, result in list(lines.items()):
        if result.notice_id in shadow:
            lines[number] = replace(result, shadow=True)


def _line_number(problem: str) -> int:
    """The line a problem names; 0 for one about no line (a policy record)."""
    head = problem.split(":", 1)[0]
    return int(head.removeprefix("line ")) if head.startswith("line ") else 0


def _validated(
    settings: Settings,
    numbered: list[tuple[int, object]],
    now: float,
    problems: list[str],
    salt: bytes,
    recipient_key: bytes,
) -> list[tuple[int, NewNotice | Refusal]]:
    """Every line's notice (or its policy's refusal), after adding each line's problems
    to ``problems`` (syntax problems already found may be there): InputError listing
    them all, by line."""
    valid: list[tuple[int, NewNotice | Refusal]] = []
    for number, request in numbered:
        notice, found = validate_request(request, number, settings, salt, now, recipient_key)
        problems.extend(found)
        if notice is not None:
            valid.append((number, notice))
    if problems:
        problems.sort(key=_line_number)
        raise InputError(problems)
    return valid


def _enqueue_numbered(
    store: Store,
    settings: Settings,
    numbered: list[tuple[int, object]],
    now: float,
    problems: list[str] | None = None,
    hash_key: bytes | None = None,
) -> list[EnqueueResult]:
    """Validate every line (after any syntax problems already found), then write all."""
    started = time.monotonic()  # the enqueue's span: from `now`, for as long as it took
    salt = store.salt()
    recipient_key = hash_key if hash_key is not None else privacy.hash_key(settings, store.path)
    problems = list(problems or [])
    valid = _validated(settings, numbered, now, problems, salt, recipient_key)

    def write() -> list[EnqueueResult]:
        found: list[str] = []
        lines: dict[int, EnqueueResult] = {}
        entries = _take_slice(store, settings, valid, lines, found, now)
        policies = {n.policy.name: n.policy for _, n in entries if isinstance(n, NewNotice)}
        for policy in policies.values():
            if not store.store_policy(policy, now):
                found.append(
                    f"policy.{policy.name}: version {policy.version} is already stored with"
                    " different settings; bump its version"
                )
        notices = [(number, n) for number, n in entries if isinstance(n, NewNotice)]
        refusals = _refused_or_stored(store, entries, lines, found)
        for limited in take_recipient_limits(store, [n for _, n in notices], recipient_key, now):
            number, notice = notices[limited.index]
            problem = f"line {number}: {limited.field}: {limited.problem}"
            refusals[number] = Refusal(
                notice.idempotency_key,
                notice.request_digest,
                notice.policy.name,
                Reason.RATE_LIMITED,
                limited.field,
                problem,
            )
        notices = [(number, n) for number, n in notices if number not in refusals]
        stored = store.insert_notices([notice for _, notice in notices])
        for (number, notice), (notice_id, digest) in zip(notices, stored, strict=True):
            if digest != notice.request_digest:
                found.append(f"line {number}: idempotency_key: already used with different fields")
                continue
            created = notice_id == notice.notice_id
            lines[number] = EnqueueResult(
                notice_id,
                notice.idempotency_key,
                created,
                skipped=notice.skipped if created else (),
            )
        if found:
            # Raising inside the transaction rolls back every line: all or nothing.
            raise InputError(sorted(found, key=_line_number))
        _shadow_lines(store, settings, lines)
        shadow = settings.rollout.mode is RolloutMode.SHADOW
        lines.update((number, refusal.result(shadow)) for number, refusal in refusals.items())
        store.count_refusals(Counter((r.policy, r.reason.value) for r in refusals.values()), now)
        results = [lines[number] for number in sorted(lines)]
        # A notice stored as failed supersedes too: the application issued a new token.
        fresh = [n for number, n in notices if lines[number].created]
        superseded = supersede(
            store, [(n.notice_id, n.region, n.account_ref, n.policy) for n in fresh], now
        )
        if not superseded:
            return results
        return [
            replace(r, superseded=tuple(superseded.get(r.notice_id, ())))
            if r.notice_id is not None
            else r
            for r in results
        ]

    # A supersede writes other notices by compare-and-set, which can meet a sweep's round
    # in a lock cycle: the server rolls the enqueue back whole, and it runs again.
    results = store.retried_transaction(write)
    tracing.enqueued(results, now, time.monotonic() - started)
    return results
