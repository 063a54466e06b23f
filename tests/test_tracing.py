"""Traces with OpenTelemetry: a span per step of a notice, in one trace per notice derived
from its id, carrying the provider call's duration and nothing of the contact or link;
nothing at all (not even an import) unless OpenTelemetry is configured."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.util._once import Once

from resetctl import tracing
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Status
from resetctl.observe import record_callback
from resetctl.store import Store
from resetctl.telemetry import LOGGER
from resetctl.transports import Transport, build_transports
from resetctl.transports.base import AmbiguousError, Message, ProviderStatus

SMS_FIRST = {"default": {"channels": ["sms", "email"]}}
#: Contact data no span may hold, in any part.
CANARY = {
    "email": "canary.ada@example.com",
    "phone": "+14155550199",
    "reset_url": "https://shop.example/reset/CANARY-TOKEN-42",
    "display_name": "Canary Lovelace",
}
CANARY_PIECES = [
    *CANARY.values(),
    "canary.ada",
    "CANARY-TOKEN-42",
    "4155550199",
    "Lovelace",
]


def _reset_global_provider() -> None:
    # As opentelemetry-test-utils does: the API sets its global provider once a process.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    """The application's tracer provider, set globally for one test (then unset)."""
    made = TracerProvider()
    _reset_global_provider()
    trace.set_tracer_provider(made)
    yield made
    made.shutdown()
    _reset_global_provider()


@pytest.fixture
def exported(provider: TracerProvider) -> InMemorySpanExporter:
    """Every span the test's steps end, kept in memory."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@dataclass
class TimedSms:
    """An SMS provider without idempotency keys whose calls take scripted seconds on
    the test's clock: a submission's reply is lost after it created the message (and
    its error quotes the number, as a careless provider's might), a lookup finds it as
    ``sent``, a status read (in batches) says ``delivered``."""

    clock: FakeClock
    name: str = "timedsms"
    recovers_by_key: bool = False
    lookup_settle: float = 30.0
    call_timeout: float = 0.0
    reads_in_batches: bool = True
    submit_seconds: float = 1.5
    lookup_seconds: float = 0.5
    read_seconds: float = 0.25
    created: dict[str, str] = field(default_factory=dict)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        self.clock.advance(self.submit_seconds)
        self.created[attempt_key] = f"SM{len(self.created):04d}"
        raise AmbiguousError(f"reply lost after sending to {message.recipient}")

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        self.clock.advance(self.lookup_seconds)
        message_id = self.created.get(attempt_key)
        return None if message_id is None else ProviderStatus(message_id, "sent", Status.ACCEPTED)

    def fingerprint(self, message: Message) -> dict[str, str]:
        return {"from": "timedsms"}

    def status(self, message_id: str) -> ProviderStatus:
        return self.statuses([message_id])[message_id]

    def statuses(self, message_ids: Sequence[str]) -> dict[str, ProviderStatus]:
        self.clock.advance(self.read_seconds)
        return {m: ProviderStatus(m, "delivered", Status.DELIVERED) for m in message_ids}

    def close(self) -> None:
        pass


def _transports(
    settings: Settings, store: Store, clock: FakeClock, sms: Transport
) -> dict[str, Transport]:
    return {**build_transports(settings, store, clock), "sms": sms}


def _enqueue(store: Store, settings: Settings, clock: FakeClock, **fields: Any) -> str:
    (result,) = enqueue(store, settings, [reset_request(**fields)], clock())
    assert result.notice_id is not None
    return result.notice_id


def _of(exported: InMemorySpanExporter, notice_id: str) -> list[ReadableSpan]:
    return [
        s
        for s in exported.get_finished_spans()
        if (s.attributes or {}).get(tracing.NOTICE_ID) == notice_id
    ]


def _names(spans: Sequence[ReadableSpan]) -> list[str]:
    return [s.name.removeprefix("resetctl.") for s in spans]


def _attribute(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(name)


def test_each_step_of_a_notice_is_a_span_in_one_trace_derived_from_its_id(
    store: Store, clock: FakeClock, exported: InMemorySpanExporter
) -> None:
    """Enqueue, claim, submit, claim, poll and callback each end one span, all in the
    trace README's formula derives from the notice id, under one unexported root."""
    settings = make_settings(outbox={"email_status": "pending"})
    notice_id = _enqueue(store, settings, clock)
    run_sweep(store, settings, clock)
    clock.advance(15)
    run_sweep(store, settings, clock)
    (message,) = store.outbox_messages(notice_id)
    record_callback(store, "outbox", message["message_id"], "delivered", Status.DELIVERED, clock())

    spans = _of(exported, notice_id)
    assert _names(spans) == ["enqueue", "claim", "submit", "claim", "poll", "callback"]
    formula = hashlib.sha256(f"resetctl.notice:{notice_id}".encode()).hexdigest()[:32]
    assert tracing.notice_trace_id(notice_id) == formula
    assert {format(s.context.trace_id, "032x") for s in spans} == {formula}
    parents = {s.parent.span_id for s in spans if s.parent is not None}
    assert len(parents) == 1
    assert len([s for s in spans if s.parent is not None]) == len(spans)
    assert parents.isdisjoint({s.context.span_id for s in exported.get_finished_spans()})
    submit, callback = spans[2], spans[5]
    assert (_attribute(submit, tracing.PHASE_BEFORE), _attribute(submit, tracing.PHASE_AFTER)) == (
        "queued",
        "primary_pending",
    )
    assert _attribute(submit, tracing.ATTEMPT_KEY) == f"{notice_id}:email:1"
    assert _attribute(submit, tracing.WORKER) == "test-worker"
    assert (_attribute(callback, tracing.STATUS), _attribute(callback, tracing.PHASE_AFTER)) == (
        "delivered",
        "accepted",
    )


def test_submit_lookup_and_poll_spans_carry_the_provider_call_duration(
    store: Store, clock: FakeClock, exported: InMemorySpanExporter
) -> None:
    """A lost reply (1.5 s), its lookup (0.5 s) and a batch read of two (0.25 s): each
    span says how long its call took and covers it; a failed call is an error span
    naming the error's kind only."""
    settings = make_settings(policy=SMS_FIRST)
    sms = TimedSms(clock)
    transports = _transports(settings, store, clock, sms)
    first, second = (_enqueue(store, settings, clock) for _ in range(2))
    run_sweep(store, settings, clock, transports)
    clock.advance(15)
    run_sweep(store, settings, clock, transports)

    for notice_id in (first, second):
        spans = _of(exported, notice_id)
        assert _names(spans) == ["enqueue", "claim", "submit", "lookup", "claim", "poll"]
        _, _, submit, lookup, _, poll = spans
        seconds = [_attribute(s, tracing.CALL_SECONDS) for s in (submit, lookup, poll)]
        assert seconds == [1.5, 0.5, 0.25]
        assert all(s.kind is trace.SpanKind.CLIENT for s in (submit, lookup, poll))
        assert submit.end_time is not None
        assert submit.start_time is not None
        assert submit.end_time - submit.start_time >= 1_500_000_000
        assert (_attribute(submit, tracing.ERROR_TYPE), submit.status.status_code) == (
            "ambiguous",
            trace.StatusCode.ERROR,
        )
        assert submit.status.description is None
        assert (_attribute(lookup, tracing.STATUS), lookup.status.status_code) == (
            "accepted",
            trace.StatusCode.UNSET,
        )
        assert _attribute(poll, tracing.CALL_BATCH) == 2
        assert (_attribute(poll, tracing.STATUS), _attribute(poll, tracing.PHASE_AFTER)) == (
            "delivered",
            "accepted",
        )


def test_no_span_holds_contact_data_or_the_link(
    store: Store, clock: FakeClock, exported: InMemorySpanExporter
) -> None:
    """Canary: a notice with a recognisable address, number, link and name, through an
    error quoting the number, a lookup, a failure callback and the email fallback that
    renders them all: no span's name, attribute, event, link or status holds any part
    of them, nor the keyed recipient hash."""
    settings = make_settings(policy=SMS_FIRST)
    sms = TimedSms(clock)
    transports = _transports(settings, store, clock, sms)
    notice_id = _enqueue(store, settings, clock, **CANARY)
    run_sweep(store, settings, clock, transports)
    (message_id,) = sms.created.values()
    record_callback(store, "timedsms", message_id, "undelivered", Status.FAILED, clock())
    run_sweep(store, settings, clock, transports)
    loaded = store.load_notice(notice_id)
    assert loaded is not None
    assert loaded.state.phase.value == "accepted"

    spans = exported.get_finished_spans()
    kinds = {s.name for s in _of(exported, notice_id)}
    assert kinds >= {f"resetctl.{k}" for k in ("enqueue", "claim", "submit", "lookup")}
    assert {"resetctl.callback"} <= kinds
    text = "\n".join(s.to_json() for s in spans)
    assert [piece for piece in CANARY_PIECES if piece.casefold() in text.casefold()] == []
    assert loaded.recipient_hash
    assert loaded.recipient_hash not in text


def test_a_decision_that_changes_the_phase_is_a_span_a_handed_back_lease_is_not(
    store: Store, clock: FakeClock, exported: InMemorySpanExporter
) -> None:
    """A link found dead expires in a tick span with its reason; a sweep whose run ends
    during a call hands the lease back in a tick that decides nothing: no span."""
    settings = make_settings(policy=SMS_FIRST)
    dead = _enqueue(store, settings, clock, ttl="90s")
    clock.advance(90)
    run_sweep(store, settings, clock)
    spans = _of(exported, dead)
    assert _names(spans) == ["enqueue", "claim", "tick"]
    assert (_attribute(spans[2], tracing.PHASE_AFTER), _attribute(spans[2], tracing.REASON)) == (
        "expired",
        "link_expired",
    )

    cut_short = _enqueue(store, settings, clock)
    transports = _transports(settings, store, clock, TimedSms(clock))
    assert run_sweep(store, settings, clock, transports, max_runtime=1.0).released == 1
    ticks = [e for e in store.event_rows(cut_short) if e["kind"] == "tick"]
    assert [(e["old_phase"], e["new_phase"]) for e in ticks] == [
        ("primary_pending", "primary_pending")
    ]
    assert _names(_of(exported, cut_short)) == ["enqueue", "claim", "submit"]


def test_a_span_made_inside_the_application_s_span_links_to_it(
    db: str, exported: InMemorySpanExporter
) -> None:
    """An enqueue --send inside an application's request span: its enqueue, claim and
    submit spans stay in the notice's trace and each links to the request's span."""
    import resetctl

    handle = resetctl.open(db, environ={"RESETCTL_HASH_KEY": "k" * 32})
    with handle, trace.get_tracer("shop").start_as_current_span("POST /reset") as request:
        (result,) = handle.enqueue([reset_request()], send=True)
    assert result.submitted
    assert result.notice_id is not None
    spans = _of(exported, result.notice_id)
    assert _names(spans) == ["enqueue", "claim", "submit"]
    ours = {format(s.context.trace_id, "032x") for s in spans}
    assert ours == {tracing.notice_trace_id(result.notice_id)}
    linked = [[link.context.span_id for link in s.links] for s in spans]
    assert linked == [[request.get_span_context().span_id]] * 3


def test_a_sampled_notice_is_traced_whole_and_the_sampler_decides_by_notice(
    store: Store, clock: FakeClock
) -> None:
    """Under OTEL_TRACES_SAMPLER=traceidratio every step of a notice is kept or none is
    (the decision follows the derived trace id), and both happen over 40 notices."""
    provider = TracerProvider(sampler=TraceIdRatioBased(0.5))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    try:
        settings = make_settings(outbox={"email_status": "pending"})
        ids = [_enqueue(store, settings, clock) for _ in range(40)]
        run_sweep(store, settings, clock)
        clock.advance(15)
        run_sweep(store, settings, clock)
    finally:
        provider.shutdown()
        _reset_global_provider()
    counts = {len(_of(exporter, notice_id)) for notice_id in ids}
    assert counts == {0, 5}


def test_without_a_configured_provider_there_are_no_spans(store: Store, clock: FakeClock) -> None:
    """No tracer provider set, or the API's no-op one: no tracer, no listener, no span;
    the steps run as before."""
    _reset_global_provider()
    assert tracing.tracer() is None
    assert tracing.listeners() == []
    trace.set_tracer_provider(trace.NoOpTracerProvider())
    try:
        assert tracing.tracer() is None
        notice_id = _enqueue(store, make_settings(), clock)
        assert run_sweep(store, make_settings(), clock).accepted == 1
        assert store.load_notice(notice_id) is not None
    finally:
        _reset_global_provider()


class _Broken(trace.Tracer):
    """A tracer that fails every span (a misbehaving SDK or exporter)."""

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        raise RuntimeError("exporter down: canary.ada@example.com")

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter down")


class _BrokenProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _Broken()


def test_a_failing_tracer_never_breaks_a_step(store: Store, clock: FakeClock) -> None:
    """Every span failing: enqueue, sweep and callback still do their work, and the
    failure is a warning naming only the error's class."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    level = LOGGER.level
    LOGGER.setLevel(logging.INFO)
    LOGGER.addHandler(handler)
    _reset_global_provider()
    trace.set_tracer_provider(_BrokenProvider())
    try:
        settings = make_settings(outbox={"email_status": "pending"})
        notice_id = _enqueue(store, settings, clock)
        assert run_sweep(store, settings, clock).submitted == 1
        (message,) = store.outbox_messages(notice_id)
        result = record_callback(
            store, "outbox", message["message_id"], "delivered", Status.DELIVERED, clock()
        )
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
        _reset_global_provider()
    assert result.new_phase == "accepted"
    failures = [line for line in lines if line.startswith("tracing failed")]
    assert failures
    assert set(failures) == {"tracing failed: RuntimeError"}
    assert not any("canary" in line for line in lines)


# -- the resetctl command ----------------------------------------------------------------


class _Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on loopback: keeps each request it is sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.received: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"


class _Receive(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        collector: _Collector = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        collector.received.append(request)
        collector.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: what it received is asserted on."""


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.slow
def test_the_resetctl_command_exports_from_the_otel_environment(
    db: str, collector: _Collector
) -> None:
    """`resetctl enqueue` with OTEL_TRACES_EXPORTER=otlp sends its span to the collector
    named by OTEL_EXPORTER_OTLP_TRACES_ENDPOINT before it exits, as service `resetctl`,
    in the notice's derived trace; the `resetctl sweep` after it, another process, puts
    its claim and submission in the same trace. No part of the contact goes out."""
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
        "RESETCTL_HASH_KEY": "k" * 32,
    }
    line = json.dumps(reset_request(**CANARY))
    done = resetctl("enqueue", db=db, input=line, env=env)
    assert done.returncode == 0, done.stderr
    notice_id = json.loads(done.stdout.splitlines()[0])["notice_id"]
    sweep = resetctl("sweep", db=db, env=env)
    assert sweep.returncode == 0, sweep.stderr

    spans = [
        (resource.resource, span)
        for request in collector.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert collector.paths
    assert set(collector.paths) == {"/v1/traces"}
    assert [span.name for _, span in spans] == [
        "resetctl.enqueue",
        "resetctl.claim",
        "resetctl.submit",
    ]
    assert {span.trace_id.hex() for _, span in spans} == {tracing.notice_trace_id(notice_id)}
    services = {
        a.value.string_value for r, _ in spans for a in r.attributes if a.key == "service.name"
    }
    assert services == {"resetctl"}
    wire = b"".join(request.SerializeToString() for request in collector.received)
    assert [p for p in CANARY_PIECES if p.encode() in wire] == []


def test_without_the_extra_resetctl_works_and_says_why_there_are_no_traces(
    tmp_path: Path,
) -> None:
    """OpenTelemetry not importable and OTEL_TRACES_EXPORTER set: the command works and
    warns once; with OpenTelemetry importable but not configured, a whole enqueue and
    sweep through the API import none of it."""
    blocked = (
        "import sys; sys.modules['opentelemetry'] = None; sys.argv[0] = 'resetctl';"
        " from resetctl.__main__ import main; main()"
    )
    env_line = json.dumps(reset_request())
    done = subprocess.run(
        [sys.executable, "-c", blocked, "enqueue", "--send", "--db", str(tmp_path / "a.db")],
        input=env_line,
        capture_output=True,
        text=True,
        env={"OTEL_TRACES_EXPORTER": "otlp", "RESETCTL_HASH_KEY": "k" * 32, "PATH": "/usr/bin"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "OpenTelemetry is not installed" in done.stderr
    unconfigured = (
        "import sys, resetctl\n"
        f"h = resetctl.open({str(tmp_path / 'b.db')!r}, environ={{'RESETCTL_HASH_KEY': 'k' * 32}})"
        "\n"
        f"h.enqueue([{reset_request()!r}], send=True)\n"
        "h.sweep()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", unconfigured],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin"},
        timeout=120,
        check=True,
    )
    assert quiet.stdout.strip() == "[]"
