"""A doubt is settled by proof, never by a second message: a crash after the call, a
deploy between the call and its lookups, a clock step, and a provider whose list lags
its creates (as Twilio's and Postmark's do) or keeps failing. Real providers on
loopback, real sweep processes where a crash is the point, both backends."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from providers_postmark import TOKEN as POSTMARK_TOKEN
from providers_postmark import FakePostmark
from providers_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER, FakeTwilio

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import attempt_key
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.transports import build_transports, close_transports
from resetctl.transports.base import AmbiguousError, Message, ProviderStatus, body_digest
from resetctl.work import SweepOptions

#: Seconds Twilio's list (or Postmark's search) trails a create in these tests: longer
#: than the settle time, as in the run that sent two texts.
LAG = 35.0
ENVIRON = {
    "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
    "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
    "POSTMARK_SERVER_TOKEN": POSTMARK_TOKEN,
}
SMS_FIRST = {"default": {"channels": ["sms", "email"], "lease": "30s"}}
EMAIL_FIRST = {"default": {"channels": ["email", "sms"], "lease": "30s"}}
QUICK = {"connect_timeout": 2.0, "read_timeout": 2.0}


class ProviderClock:
    """The provider's clock: real time moved on by hand, as the sweeps' clocks are."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class Provider:
    """One fake provider on loopback and the settings that point a channel at it."""

    name: str
    server: FakeTwilio | FakePostmark
    tables: dict[str, Any]

    def messages(self) -> int:
        """Messages the provider holds: what the person received."""
        server = self.server
        return len(server.messages) if isinstance(server, FakeTwilio) else len(server.sent)

    def script(self, *outcomes: str) -> None:
        if isinstance(self.server, FakeTwilio):
            self.server.outcomes.extend(outcomes)
        else:
            self.server.script(*outcomes)

    def deliver_all(self) -> None:
        if isinstance(self.server, FakeTwilio):
            for sid in self.server.messages:
                self.server.set_status(sid, "delivered")


@pytest.fixture(params=["twilio", "postmark"])
def provider(request: pytest.FixtureRequest) -> Iterator[Provider]:
    clock = ProviderClock()
    if request.param == "twilio":
        twilio = FakeTwilio(clock)
        twilio.list_lag = LAG
        tables = {
            "transport": {"sms": "twilio"},
            "twilio": {"base_url": twilio.base_url, "from": SENDER, **QUICK},
            "policy": SMS_FIRST,
        }
        yield Provider("twilio", twilio, tables)
        twilio.close()
        assert twilio.violations == []
    else:
        postmark = FakePostmark(clock)
        postmark.search_lag = LAG
        tables = {
            "transport": {"email": "postmark"},
            "postmark": {"base_url": postmark.base_url, "from": "Acme <no-reply@acme.example>"},
            "policy": EMAIL_FIRST,
        }
        yield Provider("postmark", postmark, tables)
        postmark.close()
        assert postmark.problems == []


def _toml(tables: Mapping[str, Any]) -> str:
    """A config file for the sweep processes (JSON scalars and lists are valid TOML)."""
    lines: list[str] = []

    def table(name: str, body: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in scalars.items())
        for key, value in body.items():
            if isinstance(value, dict):
                table(f"{name}.{key}", value)

    for name, body in tables.items():
        table(name, body)
    return "\n".join(lines) + "\n"


@dataclass
class Timeline:
    """Moves every clock a decision may read: the sweep processes' (their skew), the
    database's on PostgreSQL (each new session's offset) and the provider's."""

    db: str
    config: Path
    provider_clock: ProviderClock
    admin: Callable[[str], None] | None = None
    offset: float = 0.0

    def at(self, seconds: float) -> None:
        self.offset = seconds
        self.provider_clock.offset = seconds
        if self.admin is not None:
            self.admin(
                f"ALTER DATABASE {_database_name(self.db)} SET resetctl.clock_offset = '{seconds}'"
            )

    def sweep(self, *env: tuple[str, str]) -> int:
        done = resetctl(
            "sweep",
            "--config",
            str(self.config),
            db=self.db,
            env={**ENVIRON, "RESETCTL_CLOCK_SKEW": repr(self.offset), **dict(env)},
        )
        return done.returncode


def _database_name(uri: str) -> str:
    return '"' + uri.split("///", 1)[1].split("?", 1)[0] + '"'  # pgcluster's URI form


@pytest.fixture
def timeline(
    db: str, backend: str, tmp_path: Path, provider: Provider, request: pytest.FixtureRequest
) -> Timeline:
    config = tmp_path / "resetctl.toml"
    config.write_text(_toml(provider.tables), encoding="utf-8")
    admin = None
    if backend == "postgresql":
        import psycopg

        admin_uri: str = request.getfixturevalue("pg_admin")

        def admin(sql: str) -> None:
            with psycopg.connect(admin_uri, autocommit=True) as conn:
                conn.execute(sql)  # type: ignore[call-overload]

    clock = provider.server.clock
    assert isinstance(clock, ProviderClock)
    return Timeline(db, config, clock, admin)


def _settings(provider: Provider) -> Settings:
    return make_settings(**provider.tables)


def test_a_crash_after_the_call_is_not_resent_on_one_empty_lookup(
    timeline: Timeline, provider: Provider
) -> None:
    """A sweep killed right after the provider call leaves the attempt in doubt; the
    first recovery lookup misses the message (the list lags), and no sweep sends again
    until a later lookup finds it: one message, whichever provider."""
    settings = _settings(provider)
    with Store(timeline.db) as store:
        (result,) = enqueue(store, settings, [reset_request()], time.time())
    notice_id = result.notice_id

    # SIGKILL between the provider's answer and its record (a crash, an OOM kill).
    assert timeline.sweep(("RESETCTL_FAILPOINTS", "after_submit")) == -9
    assert provider.messages() == 1
    for second in (31, 32, 40, 50, 59):  # the lease (30 s) is gone: anyone may recover
        timeline.at(second)
        assert timeline.sweep() == 0
        assert provider.messages() == 1, f"a second message at {second} s"
    timeline.at(61)  # the lag has passed: the second lookup finds it
    assert timeline.sweep() == 0
    provider.deliver_all()
    timeline.at(106)  # the next poll slot after the lookup's read
    assert timeline.sweep() == 0

    assert provider.messages() == 1
    with Store(timeline.db) as store:
        (attempt,) = store.attempt_rows(notice_id)
        assert attempt["state"] == "submitted"
        assert attempt["calls"] == 1
        lookups = [e for e in store.event_rows(notice_id) if e["kind"] == "lookup"]
        assert len(lookups) >= 2
        loaded = store.load_notice(notice_id)
        assert loaded is not None
        assert loaded.state.phase == "accepted"


def test_a_deploy_between_the_call_and_its_lookups_still_finds_what_was_sent(
    store: Store, clock: FakeClock, provider: Provider
) -> None:
    """The 504 came under one sender and copy; lookups run after a deploy changed both
    (Twilio's from number, Postmark's stream, the support label in the body), and
    still recognise the message that was sent: no second one."""
    provider.server.clock = clock
    before = make_settings(**provider.tables, support_label="Acme support")
    (result,) = enqueue(store, before, [reset_request()], clock())
    provider.script("created-504")
    _sweep(store, before, clock)
    assert provider.messages() == 1

    tables = {name: dict(body) for name, body in provider.tables.items()}
    if provider.name == "twilio":
        tables["twilio"]["from"] = "+15005550009"
    else:
        tables["postmark"]["message_stream"] = "resets-v2"
    after = make_settings(**tables, support_label="Acme Help Centre (new copy)")
    for step in (31, 30, 30):
        clock.advance(step)
        _sweep(store, after, clock)
    assert provider.messages() == 1
    (attempt,) = store.attempt_rows(result.notice_id)
    assert attempt["state"] == "submitted"


def _sweep(
    store: Store,
    settings: Settings,
    clock: FakeClock,
    monotonic: Callable[[], str | None] | None = None,
) -> None:
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        sweeper = Sweeper(
            store, settings, transports, clock=clock, sleep=clock.sleep, monotonic=monotonic
        )
        sweeper.run(SweepOptions("test-worker", 50, 30.0))
    finally:
        close_transports(transports)


@dataclass
class SteadyClock:
    """A host's monotonic clock, moved only by real time passing (never by a step)."""

    seconds: float = 1000.0

    def __call__(self) -> str:
        return f"boot-1@{self.seconds:.3f}"


def test_a_wall_clock_step_does_not_shorten_the_settle_time(
    store: Store, clock: FakeClock, provider: Provider
) -> None:
    """The wall clock steps 31 s forward between two lookups a second apart: the
    monotonic clock says a second, so the second not-found proves nothing yet."""
    provider_time = FakeClock(clock())
    provider.server.clock = provider_time
    settings = _settings(provider)
    steady = SteadyClock()
    (result,) = enqueue(store, settings, [reset_request()], clock())
    provider.script("created-504")
    _sweep(store, settings, clock, steady)  # the call, and a lookup too soon to count

    def elapse(seconds: float, step: float = 0.0) -> None:
        clock.advance(seconds + step)
        provider_time.advance(seconds)
        steady.seconds += seconds

    elapse(31)
    _sweep(store, settings, clock, steady)  # the first not-found that counts
    elapse(1, step=31)  # one real second; the host's wall clock jumps 31 s
    _sweep(store, settings, clock, steady)
    assert provider.messages() == 1
    elapse(29)
    _sweep(store, settings, clock, steady)
    elapse(10)
    _sweep(store, settings, clock, steady)  # the lag has passed: found

    assert provider.messages() == 1
    (attempt,) = store.attempt_rows(result.notice_id)
    assert (attempt["state"], attempt["calls"]) == ("submitted", 1)


def test_lookups_that_keep_failing_do_not_hold_the_fallback_to_its_deadline(
    store: Store, clock: FakeClock
) -> None:
    """After a 504, Twilio's list keeps failing: the email goes out once lookups have
    failed for two settle times (about a minute), not at the fallback deadline."""
    twilio = FakeTwilio(clock)
    try:
        settings = make_settings(
            transport={"sms": "twilio"},
            twilio={"base_url": twilio.base_url, "from": SENDER, **QUICK},
            policy=SMS_FIRST,
        )
        (result,) = enqueue(store, settings, [reset_request()], clock())
        twilio.outcomes = ["created-504"]
        twilio.list_outcomes = ["error"] * 50
        called_at = clock()
        for _ in range(40):
            _sweep(store, settings, clock)
            clock.advance(10)
        assert len(twilio.messages) == 1
        assert twilio.violations == []
    finally:
        twilio.close()
    (email,) = store.outbox_messages(result.notice_id)
    assert email["channel"] == "email"
    assert email["submitted_at"] - called_at <= 70  # was 394 s: the fallback deadline
    sms = next(a for a in store.attempt_rows(result.notice_id) if a["channel"] == "sms")
    assert sms["state"] == "ambiguous"  # the doubt stays on record


# -- a property: crash points x list lag, through the store ---------------------------


class _Died(BaseException):
    """The sweep process died at this point (nothing after it ran)."""


@dataclass
class LaggingProvider:
    """A provider without idempotency keys whose list trails its creates by ``lag``.

    Each submit ends as scripted: "ok", "lost" (created, reply lost), "nothing"
    (ambiguous, nothing created), "die-before" (the process dies before the request is
    written) or "die-after" (created, then the process dies before recording it).
    """

    clock: FakeClock
    lag: float
    script: list[str]
    name: str = "lagging"
    recovers_by_key: bool = False
    lookup_settle: float = 30.0
    call_timeout: float = 0.0
    created: dict[str, float] = field(default_factory=dict)
    per_key: Counter[str] = field(default_factory=Counter)

    def submit(self, message: Message, attempt_key: str) -> ProviderStatus:
        how = self.script.pop(0) if self.script else "ok"
        if how == "die-before":
            raise _Died
        if how == "nothing":
            raise AmbiguousError("HTTP 502")
        message_id = f"{attempt_key}#{self.per_key[attempt_key]}"
        self.per_key[attempt_key] += 1
        self.created[message_id] = self.clock()
        if how == "die-after":
            raise _Died
        if how == "lost":
            raise AmbiguousError("reply lost")
        return ProviderStatus(message_id, "queued", self.status(message_id).status)

    def status(self, message_id: str) -> ProviderStatus:
        from resetctl.machine import Status

        return ProviderStatus(message_id, "queued", Status.PENDING)

    def fingerprint(self, message: Message) -> dict[str, str]:
        return {"body_sha256": body_digest(message.recipient)}

    def lookup(
        self, recipient: str, attempt_key: str, since: float, sent: Mapping[str, str]
    ) -> ProviderStatus | None:
        assert sent == {"body_sha256": body_digest(recipient)}
        now = self.clock()
        for message_id, at in self.created.items():
            if message_id.startswith(f"{attempt_key}#") and at + self.lag <= now:
                return self.status(message_id)
        return None

    def close(self) -> None:
        pass


OUTCOMES = st.sampled_from(["ok", "lost", "nothing", "die-before", "die-after"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    # Any lag the settings cover: README says to set lookup_settle (30 s) above the
    # provider's list lag; two lookups a settle apart still cover up to twice that.
    lag=st.floats(0, 55),
    script=st.lists(OUTCOMES, min_size=1, max_size=4),
    gaps=st.lists(st.floats(0.5, 45), min_size=4, max_size=14),
)
def test_at_most_one_message_per_attempt_key_whatever_crashes_and_lags(
    tmp_path_factory: pytest.TempPathFactory, lag: float, script: list[str], gaps: list[float]
) -> None:
    """Over any crash points and any list lag within the settle times, sweeps on one
    store never make a provider create two messages under one attempt key."""
    db = tmp_path_factory.mktemp("doubt") / "resetctl.db"
    clock = FakeClock()
    settings = make_settings(policy={"default": {"channels": ["sms", "email"]}})
    with Store(db) as store:
        (result,) = enqueue(store, settings, [reset_request()], clock())
        sms = LaggingProvider(clock, lag, list(script))
        transports: dict[str, Any] = dict(build_transports(settings, store, clock))
        transports["sms"] = sms
        for n, gap in enumerate(gaps):
            with contextlib.suppress(_Died):
                run_sweep(store, settings, clock, transports, worker=f"w{n}", lease=30.0)
            clock.advance(gap)
        assert max(sms.per_key.values(), default=0) <= 1
        assert set(sms.per_key) <= {attempt_key(result.notice_id, "sms")}
