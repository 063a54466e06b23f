"""OpenTelemetry spans for each step of a notice: enqueue, claim, submit, poll, lookup,
callback (and the decisions, lost races and skipped channels a sweep records).

Only when OpenTelemetry is configured: the application set a tracer provider, or the
``resetctl`` command built one from ``OTEL_TRACES_EXPORTER`` (:func:`configure_from_environment`).
Otherwise nothing of OpenTelemetry is imported, and every hook here returns at once.

**One trace per notice, with nothing stored.** A notice's steps happen in several
processes on several hosts (the application's enqueue, sweeps every minute, the callback
endpoint), and no trace context is kept in the database to join them. Instead the trace
id is derived from the notice id (:func:`notice_trace_id`, the first 128 bits of
SHA-256 of ``resetctl.notice:<id>``), so every process puts its spans of one notice into
the same trace, each a child of one notice span that no process exports (the trace's
root). A span made inside the caller's own span (an application's request) links to it.
Span times are read on the decision clock, the one every host agrees on.

Spans are built from what the sweep already tells its listeners (:class:`Spans` is a
:data:`resetctl.telemetry.Listener`), plus a claim, a provider call coming back, an
enqueue and a callback. Their attributes are the event's own vocabulary (ids, phases,
channels, normalized statuses, reasons, the worker, counts, the provider call's
duration): never an address, a phone number, a display name or the link, nor the keyed
recipient hash. Like all telemetry, nothing here raises into its caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from resetctl.machine import attempt_key
from resetctl.telemetry import LOGGER, Listener, TransitionEvent

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Tracer
    from opentelemetry.util.types import AttributeValue

    from resetctl.calls import CallResult
    from resetctl.store import Claim, LoadedNotice
    from resetctl.work import Job

#: What a notice id is prefixed with before it is hashed into its trace id.
TRACE_ID_PREFIX = "resetctl.notice:"

NOTICE_ID = "resetctl.notice_id"
KIND = "resetctl.kind"
CHANNEL = "resetctl.channel"
PHASE_BEFORE = "resetctl.phase.before"
PHASE_AFTER = "resetctl.phase.after"
REASON = "resetctl.reason"
STATUS = "resetctl.status"
ATTEMPT_KEY = "resetctl.attempt_key"
WORKER = "resetctl.worker"
#: seconds the provider call took (submit, poll, lookup), on the sweep's clock
CALL_SECONDS = "resetctl.call.seconds"
#: statuses read in the one call (a batch read), when more than one
CALL_BATCH = "resetctl.call.batch"
#: the kind of error the call ended in (transient, ambiguous, permanent, or a class name)
ERROR_TYPE = "error.type"
RECOVERED = "resetctl.claim.recovered"
CREATED = "resetctl.enqueue.created"
SKIPPED = "resetctl.enqueue.skipped"
SUPERSEDED = "resetctl.enqueue.superseded"
DUPLICATE = "resetctl.callback.duplicate"

#: Each event kind's span; a kind not named here is its own step.
_STEPS = {"outcome": "submit", "declined": "submit"}
#: Event kinds that end a submission begun by its intent.
_ENDS = frozenset({"outcome", "declined", "lost_race"})
#: Steps whose span is a provider call.
_CALLS = frozenset({"submit", "poll", "lookup"})


def notice_trace_id(notice_id: str) -> str:
    """The trace id (32 hex digits) every process gives the spans of ``notice_id``:
    ``printf 'resetctl.notice:%s' ID | sha256sum | cut -c1-32``."""
    return hashlib.sha256(f"{TRACE_ID_PREFIX}{notice_id}".encode()).hexdigest()[:32]


def tracer() -> Tracer | None:
    """resetctl's tracer when OpenTelemetry is configured (a tracer provider other than
    the API's default proxy or no-op one is set), else None. Imports nothing when the
    process has not imported OpenTelemetry itself: nobody can have configured it."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("resetctl")


def listeners() -> list[Listener]:
    """The listeners a sweep adds for tracing: one :class:`Spans`, or none."""
    try:
        found = tracer()
    except Exception as exc:
        _failed(exc)
        return []
    return [] if found is None else [Spans(found)]


@dataclass(frozen=True, slots=True)
class _Call:
    """A provider call that came back, until its step is recorded."""

    started_at: float
    ended_at: float
    batch: int
    error: str | None


class Spans:
    """A sweep's listener that turns its steps into spans (one sweep's thread calls it)."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        #: submissions whose intent is written: (phase before, when), by attempt key
        self._intents: dict[str, tuple[str, float]] = {}
        #: calls that came back, by attempt key, until their step's event
        self._calls: dict[str, _Call] = {}

    def __call__(self, event: TransitionEvent) -> None:
        kind = event.kind
        key = attempt_key(event.notice_id, event.channel) if event.channel else None
        if kind == "intent" and key is not None:
            self._intents[key] = (event.old_phase, event.at)
            return
        # A call's step ends here, whatever it turned out to be (a lost race included).
        call = self._calls.pop(key, None) if key is not None else None
        intent = self._intents.pop(key, None) if key is not None and kind in _ENDS else None
        if kind == "lease_recovered":
            return  # the claim's span says so
        if kind == "tick" and event.old_phase == event.new_phase:
            return  # a lease handed back with nothing decided: not a step
        step = _STEPS.get(kind, kind)
        before, start = intent if intent is not None else (event.old_phase, event.at)
        if intent is None and call is not None:
            start = call.started_at
        attributes: dict[str, AttributeValue | None] = {
            KIND: str(kind),
            CHANNEL: event.channel,
            PHASE_BEFORE: before,
            PHASE_AFTER: event.new_phase,
            REASON: event.reason,
            STATUS: event.status,
            ATTEMPT_KEY: key,
            WORKER: event.worker,
        }
        error = None
        if call is not None:
            attributes[CALL_SECONDS] = round(max(0.0, call.ended_at - call.started_at), 6)
            if call.batch > 1:
                attributes[CALL_BATCH] = call.batch
            error = attributes[ERROR_TYPE] = call.error
        client = step in _CALLS
        _span(self.tracer, step, event.notice_id, start, event.at, attributes, client, error)

    def claimed(self, claim: Claim, loaded: LoadedNotice, worker: str, now: float) -> None:
        phase = loaded.state.phase.value
        attributes: dict[str, AttributeValue | None] = {
            KIND: "claim",
            PHASE_BEFORE: phase,
            PHASE_AFTER: phase,
            WORKER: worker,
            RECOVERED: claim.recovered,
        }
        _span(self.tracer, "claim", claim.notice_id, now, now, attributes)

    def called(self, jobs: Sequence[Job], result: CallResult) -> None:
        if result.started_at is None:
            return  # nothing was called (nothing rendered, or not worth calling)
        error = None if result.error is None else _error_type(result.error)
        call = _Call(result.started_at, result.ended_at, len(jobs), error)
        for job in jobs:
            self._calls[job.key] = call


def claimed(
    listening: Iterable[Listener],
    claim: Claim,
    loaded: LoadedNotice,
    worker: str,
    clock: Callable[[], float],
) -> None:
    """A sweep claimed ``claim``'s notice: its span, when a listener traces."""
    for listener in listening:
        if isinstance(listener, Spans):
            try:
                listener.claimed(claim, loaded, worker, clock())
            except Exception as exc:
                _failed(exc)


def called(listening: Iterable[Listener], jobs: Sequence[Job], result: CallResult) -> None:
    """A provider call for ``jobs`` came back: its duration, for the step it ends."""
    for listener in listening:
        if isinstance(listener, Spans):
            try:
                listener.called(jobs, result)
            except Exception as exc:
                _failed(exc)


class Enqueued(Protocol):
    """What an enqueue span reads of a result (resetctl.enqueue.EnqueueResult)."""

    @property
    def notice_id(self) -> str | None: ...
    @property
    def created(self) -> bool: ...
    @property
    def skipped(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def superseded(self) -> tuple[str, ...]: ...


def enqueued(results: Iterable[Enqueued], now: float, seconds: float) -> None:
    """Committed enqueue ``results``: a span per notice (a refused request has none),
    from ``now`` for the ``seconds`` the enqueue took."""
    try:
        found = tracer()
        if found is None:
            return
        for result in results:
            if result.notice_id is None:
                continue
            attributes: dict[str, AttributeValue | None] = {
                KIND: "enqueue",
                CREATED: result.created,
            }
            if result.created:
                attributes[PHASE_AFTER] = "queued"
            if result.skipped:
                attributes[SKIPPED] = [f"{channel}:{why}" for channel, why in result.skipped]
            if result.superseded:
                attributes[SUPERSEDED] = len(result.superseded)
            _span(found, "enqueue", result.notice_id, now, now + seconds, attributes)
    except Exception as exc:
        _failed(exc)


class Called(Protocol):
    """What a callback span reads of a result (resetctl.observe.CallbackResult)."""

    @property
    def notice_id(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def old_phase(self) -> str: ...
    @property
    def new_phase(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def duplicate(self) -> bool: ...


def callback_recorded(result: Called, worker: str, now: float, seconds: float) -> None:
    """A provider's callback recorded (or found a duplicate): its notice's span."""
    try:
        found = tracer()
        if found is None:
            return
        attributes: dict[str, AttributeValue | None] = {
            KIND: "callback",
            CHANNEL: result.channel,
            PHASE_BEFORE: result.old_phase,
            PHASE_AFTER: result.new_phase,
            STATUS: result.status,
            ATTEMPT_KEY: attempt_key(result.notice_id, result.channel),
            WORKER: worker,
            DUPLICATE: result.duplicate,
        }
        _span(found, "callback", result.notice_id, now, now + seconds, attributes)
    except Exception as exc:
        _failed(exc)


def _span(
    tracer: Tracer,
    step: str,
    notice_id: str,
    start: float,
    end: float,
    attributes: Mapping[str, AttributeValue | None],
    client: bool = False,
    error: str | None = None,
) -> None:
    """One finished span of ``notice_id``'s trace, from ``start`` to ``end`` (seconds)."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    values: dict[str, AttributeValue] = {NOTICE_ID: notice_id}
    values.update((name, value) for name, value in attributes.items() if value is not None)
    span = tracer.start_span(
        f"resetctl.{step}",
        context=_notice_context(notice_id),
        kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
        attributes=values,
        links=_caller(),
        start_time=_nanoseconds(start),
    )
    if error is not None:
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=_nanoseconds(max(start, end)))


def _notice_context(notice_id: str) -> Context:
    """A context whose (remote, sampled) span is the notice itself, never exported."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    digest = hashlib.sha256(f"{TRACE_ID_PREFIX}{notice_id}".encode()).digest()
    notice = SpanContext(
        trace_id=int.from_bytes(digest[:16]) or 1,
        span_id=int.from_bytes(digest[16:24]) or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(notice))


def _caller() -> list[Link]:
    """A link to the caller's span, when there is one (an application's request)."""
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    return [trace.Link(current)] if current.is_valid else []


def _nanoseconds(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _error_type(exc: Exception) -> str:
    """The error's kind (transient, ambiguous, permanent), else its class: never its
    message, which may quote what the call was given."""
    kind = getattr(exc, "kind", None)
    return kind if isinstance(kind, str) and kind.isidentifier() else type(exc).__name__[:60]


def _failed(exc: Exception) -> None:
    """Tracing broke: say so by the error's class (never its message), and go on."""
    with contextlib.suppress(Exception):
        LOGGER.warning("tracing failed: %s", type(exc).__name__)


#: The exporter names ``otlp`` stands for, by OTLP protocol.
_OTLP = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def configure_from_environment(environ: Mapping[str, str]) -> None:
    """For the ``resetctl`` command, which has no application to set a tracer provider:
    when ``OTEL_TRACES_EXPORTER`` names exporters (not ``none``), set one up with them,
    its resource and sampler from the usual OTEL_* variables. A provider already set
    (``opentelemetry-instrument``) is left alone. A problem is a warning, never an error:
    the command runs untraced."""
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if not names or names == ["none"] or disabled:
        return
    try:
        _configure(names, environ)
    except ImportError:
        LOGGER.warning(
            "OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed"
            " (pip install 'resetctl[otel]'): no traces"
        )
    except Exception as exc:
        _failed(exc)


def _configure(names: list[str], environ: Mapping[str, str]) -> None:
    from importlib.metadata import entry_points

    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if tracer() is not None:
        return
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    exporters = []
    for name in names:
        wanted = _OTLP.get(protocol.strip(), "otlp_proto_http") if name == "otlp" else name
        found = entry_points(group="opentelemetry_traces_exporter", name=wanted)
        if not found:
            LOGGER.warning("OTEL_TRACES_EXPORTER: no trace exporter %r is installed", wanted[:40])
            continue
        exporters.append(next(iter(found)).load()())
    if not exporters:
        return
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "resetctl"}))
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER; shut down at exit
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
