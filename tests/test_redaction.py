"""A plugin's errors keep their kind, not their text (issue 24, item 3).

A third-party transport whose every exception quotes the notice's reset link, address,
phone number and display name in encoded forms (percent-encoded in upper- and lower-case
hex, plus-encoded, upper-cased, the number re-punctuated) is driven through every path
its errors take: the first submission made by ``enqueue(send=True)``, sweeps that meet a
transient, an ambiguous (then a failing lookup), a permanent, a throttled, an unexpected
and an oddly-kinded error, failing status reads, and a failing ``close()``. None of the
forms may reach ``inspect`` (the API, and the command line's text and JSON), the stored
events and attempts, the logs (as JSON lines and as text), or what the API returns.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

import pytest
from conftest import FakeClock, make_settings, resetctl

from resetctl import api
from resetctl.calls import WITHHELD, redact
from resetctl.store import Contact
from resetctl.telemetry import LOGGER, JsonLines, TextLines

PLUGIN_MODULE = """
import re

from resetctl.machine import Status
from resetctl.transports.base import (
    AmbiguousError,
    PermanentError,
    ProviderStatus,
    StatusVocabulary,
    ThrottledError,
    TransientError,
    TransportError,
    TransportPlugin,
)

#: recipient -> (the leak every error of its notice carries, submission outcomes in order)
SCRIPT = {}
#: what was raised, by path: the test checks each path was taken
RAISED = []


class CatastrophicError(TransportError):
    kind = "catastrophic"


ERRORS = {
    "transient": TransientError,
    "ambiguous": AmbiguousError,
    "permanent": PermanentError,
    "odd": CatastrophicError,
    "unexpected": RuntimeError,
}


class Leaky:
    name = "leaky"
    recovers_by_key = False
    lookup_settle = 30.0
    call_timeout = 5.0

    def __init__(self, context):
        self.last_leak = "nothing yet"

    def _leak(self, recipient):
        return SCRIPT[recipient][0]

    def submit(self, message, attempt_key):
        leak = self.last_leak = self._leak(message.recipient)
        outcomes = SCRIPT[message.recipient][1]
        outcome = outcomes.pop(0) if outcomes else "ok"
        if outcome == "ok":
            return ProviderStatus("lk-" + attempt_key, "queued", Status.PENDING)
        RAISED.append("submit " + outcome)
        if outcome == "throttled":
            raise ThrottledError(leak, retry_after=leak)
        raise ERRORS[outcome](leak)

    def status(self, message_id):
        RAISED.append("status")
        raise TransientError(self.last_leak)

    def fingerprint(self, message):
        return {"digest": "d"}

    def lookup(self, recipient, attempt_key, since, sent):
        RAISED.append("lookup")
        raise TransientError(self._leak(recipient))

    def close(self):
        RAISED.append("close")
        raise RuntimeError(self.last_leak)


PLUGIN = TransportPlugin(
    name="leaky",
    channels=frozenset({"email", "sms"}),
    create=Leaky,
    vocabulary=StatusVocabulary("leaky", frozenset({"queued"}), lambda raw: Status.PENDING),
)
"""


@dataclass(frozen=True)
class Person:
    """One notice's contact data, and how its errors go."""

    label: str
    email: str
    phone: str
    name: str
    #: the email submissions' outcomes, then the SMS's
    email_outcomes: tuple[str, ...]
    sms_outcomes: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"https://shop.example/reset/Leak-Token-{self.label}?src=Mail&id=7"

    def secrets(self) -> list[str]:
        return [self.url, self.email, self.phone, self.name]

    def encoded(self) -> list[str]:
        """The forms a plugin's message quotes them in."""
        national = self.phone[2:]
        area, exchange, line = national[:3], national[3:6], national[6:]
        return [
            quote(self.url, safe=""),
            quote(self.url, safe="").lower(),
            quote_plus(self.url),
            self.url.upper(),
            quote(self.email),
            quote(self.email, safe="").lower(),
            self.email.upper(),
            quote_plus(f"mailto:{self.email}"),
            quote_plus(self.name),
            quote(self.name),
            self.name.upper(),
            f"+1 ({area}) {exchange}-{line}",
            f"{area}.{exchange}.{line}",
            f"1-{area}-{exchange}-{line}",
            quote_plus(f"+1 {area} {exchange} {line}"),
            quote(self.phone, safe=""),
        ]

    def leak(self) -> str:
        return "provider said: " + " | ".join(self.encoded())

    def request(self) -> dict[str, Any]:
        return {
            "idempotency_key": f"leak-{self.label}",
            "email": self.email,
            "phone": self.phone,
            "reset_url": self.url,
            "display_name": self.name,
        }


PEOPLE = [
    Person("transient", "Ada.Trans@example.org", "+14155550101", "Ada Lovelace", ("transient",)),
    Person("ambiguous", "Grace.Ambig@example.org", "+14155550102", "Grace Hopper", ("ambiguous",)),
    Person(
        "permanent",
        "Emmy.Permanent@example.org",
        "+14155550103",
        "Emmy Noether",
        ("permanent",),
        ("unexpected",),
    ),
    Person("throttled", "Mary.T@example.org", "+14155550104", "Mary Somerville", ("throttled",)),
    Person("odd", "Sofia.Odd@example.org", "+14155550105", "Sofia Kovalevskaya", ("odd",)),
]


def _digit_runs(text: str) -> set[str]:
    return {re.sub(r"\D", "", run) for run in re.findall(r"\d[\d\s().\-/+]*\d", text)}


def leaks(text: str, person: Person) -> list[str]:
    """Which of ``person``'s secrets ``text`` shows, in any case or encoding looked for."""
    views = [text, unquote_plus(text), unquote_plus(unquote_plus(text))]
    found = [
        secret
        for secret in (*person.secrets(), person.email.split("@")[0], person.url.split("://")[1])
        if any(secret.casefold() in view.casefold() for view in views)
    ]
    national = person.phone[2:]
    if any(national in run for view in views for run in _digit_runs(view)):
        found.append(f"the digits of {person.phone}")
    return found


@dataclass
class Run:
    """What the run left behind, by surface."""

    surfaces: dict[str, str] = field(default_factory=dict)
    last_errors: list[str] = field(default_factory=list)
    raised: list[str] = field(default_factory=list)
    log: str = ""


class _Collect(logging.Handler):
    """Every resetctl record, as the JSON and text log formats write it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += [JsonLines().format(record), TextLines().format(record)]


@pytest.fixture(scope="module")
def leaky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The plugin, installed the usual way: a module and a dist-info with entry points."""
    site = tmp_path_factory.mktemp("site")
    (site / "resetctl_leaky.py").write_text(PLUGIN_MODULE, encoding="utf-8")
    dist = site / "resetctl_leaky-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: resetctl-leaky\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """
            [resetctl.transports]
            leaky = resetctl_leaky:PLUGIN
            """
        ),
        encoding="utf-8",
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        import resetctl_leaky  # type: ignore[import-not-found]

        yield resetctl_leaky
    sys.modules.pop("resetctl_leaky", None)


@pytest.fixture(scope="module")
def run(leaky: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every person's notice through enqueue(send=True) and sweeps until all have ended."""
    root = tmp_path_factory.mktemp("redaction")
    db = root / "resetctl.db"
    for person in PEOPLE:
        leaky.SCRIPT[person.email] = (person.leak(), list(person.email_outcomes))
        leaky.SCRIPT[person.phone] = (person.leak(), list(person.sms_outcomes))
    settings = make_settings(transport={"email": "leaky", "sms": "leaky"})
    collect = _Collect()
    LOGGER.addHandler(collect)
    level, LOGGER.level = LOGGER.level, logging.DEBUG
    found = Run()
    clock = FakeClock()
    try:
        with api.open(db, settings, clock=clock, sleep=clock.sleep, environ={}) as handle:
            sent = handle.enqueue([p.request() for p in PEOPLE], send=True)
            results = [repr(r) + json.dumps(r.to_json()) for r in sent]
            for _ in range(40):
                clock.advance(30)
                results.append(repr(handle.sweep()))
            ids = {p.label: r.notice_id for p, r in zip(PEOPLE, sent, strict=True)}
            reports = {label: handle.inspect(notice_id) for label, notice_id in ids.items()}
    finally:
        LOGGER.removeHandler(collect)
        LOGGER.setLevel(level)
    found.surfaces["what the API returned"] = "\n".join(results)
    found.surfaces["inspect (API)"] = json.dumps(reports)
    found.surfaces["logs"] = found.log = "\n".join(collect.lines)
    for notice_id in ids.values():
        as_json = resetctl("inspect", notice_id, "--json", db=db)
        as_text = resetctl("inspect", notice_id, db=db, env={"COLUMNS": "200"})
        assert (as_json.returncode, as_text.returncode) == (0, 0), as_json.stderr + as_text.stderr
        found.surfaces["inspect --json"] = found.surfaces.get("inspect --json", "") + as_json.stdout
        found.surfaces["inspect text"] = found.surfaces.get("inspect text", "") + as_text.stdout
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            if table not in ("notice_secrets", "outbox"):
                rows = conn.execute(f"SELECT * FROM {table}")
                found.surfaces[f"table {table}"] = "\n".join(repr(row) for row in rows)
    found.last_errors = [
        attempt["last_error"]
        for report in reports.values()
        for attempt in report["attempts"]
        if attempt["last_error"]
    ]
    found.raised = list(leaky.RAISED)
    return found


def test_every_path_was_taken(run: Run) -> None:
    """The plugin raised on each path, and each error was recorded by its kind and class."""
    assert {
        "submit transient",
        "submit ambiguous",
        "submit permanent",
        "submit throttled",
        "submit odd",
        "submit unexpected",
        "lookup",
        "status",
        "close",
    } <= set(run.raised)
    kept = " ".join(run.last_errors)
    assert (
        "permanent: Leaky raised PermanentError (a plugin transport's message is not kept)" in kept
    )
    assert "ambiguous: Leaky raised CatastrophicError" in kept  # a kind outside the three
    assert "ambiguous: unexpected RuntimeError" in kept
    assert "lookup failed (Leaky raised TransientError" in run.log
    assert "did not close cleanly (RuntimeError)" in run.log
    assert "throttled a call" in run.log


@pytest.mark.parametrize("person", PEOPLE, ids=[p.label for p in PEOPLE])
def test_no_encoded_form_reaches_any_surface(run: Run, person: Person) -> None:
    """Not the link, the address, the number or the name, in any form the plugin used."""
    shown = {where: leaks(text, person) for where, text in run.surfaces.items()}
    assert {where: found for where, found in shown.items() if found} == {}
    for form in person.encoded():
        assert all(form not in text for text in run.surfaces.values()), form


@pytest.mark.parametrize("person", PEOPLE, ids=[p.label for p in PEOPLE])
def test_a_built_in_message_quoting_contact_data_is_withheld(person: Person) -> None:
    """The second line, for built-in transports' own messages: one that quotes the
    notice's contact data in any of those forms is withheld whole; one that does not is
    kept as it is."""
    contact = Contact(person.email, person.phone, person.url, person.name)
    for form in person.encoded():
        assert redact(f"smtp: RCPT refused (550) {form}", contact) == WITHHELD, form
    assert redact("smtp: RCPT refused (550)", contact) == "smtp: RCPT refused (550)"
    assert redact("twilio: 21610 at 2026-01-01 00:00:30", contact) == (
        "twilio: 21610 at 2026-01-01 00:00:30"
    )
