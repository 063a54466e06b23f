"""Every message is transactional: no built-in email transport sends (or stores) a
List-Unsubscribe, List-Unsubscribe-Post, List-Id or Precedence header, Postmark's stream
is the transactional one, and no template can add a header (issue 25, item 6).

Each transport is driven as a sweep drives it: enqueue, sweep, and the message read
where it lands (a real SMTP server on loopback, the loopback Postmark, the outbox).
"""

from __future__ import annotations

import email
import json
import re
import shutil
from collections.abc import Iterator
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, FakeClock, make_settings, reset_request
from providers_postmark import TOKEN, FakePostmark
from smtp_relay import Relay, running_relay

from resetctl import api
from resetctl.errors import ConfigError
from resetctl.render import templates_root
from resetctl.store import Store
from resetctl.transports import build_transports

SENDER = "no-reply@shop.example"
#: A header that marks mail as bulk or as a list's: a reset notice carries none of them.
BULK_HEADER = re.compile(r"^(list-[a-z-]+|precedence)$", re.IGNORECASE)
#: The same names at the start of a line of a header block, as a receiver would read them.
BULK_LINE = re.compile(rb"^(list-[a-z-]+|precedence)\s*:", re.IGNORECASE | re.MULTILINE)
#: The headers the SMTP transport builds, in order: nothing more may arrive.
SMTP_HEADERS = [
    "Subject",
    "From",
    "To",
    "Date",
    "Message-ID",
    "Auto-Submitted",
    "X-Auto-Response-Suppress",
    "MIME-Version",
    "Content-Type",
]
#: Every field of Postmark's send that resetctl fills: no ``Headers``.
POSTMARK_FIELDS = {
    "From",
    "To",
    "Subject",
    "TextBody",
    "HtmlBody",
    "MessageStream",
    "Metadata",
    "TrackOpens",
    "TrackLinks",
}
#: What the outbox stores of an email: the rendered parts, no header of any kind.
OUTBOX_FIELDS = {"to", "subject", "text", "html"}
#: Lines an operator's template might try to turn into headers.
SMUGGLED = (
    "List-Unsubscribe: <mailto:unsubscribe@shop.example>\n"
    "List-Unsubscribe-Post: List-Unsubscribe=One-Click\n"
    "List-Id: <resets.shop.example>\n"
    "Precedence: bulk\n"
)


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    """A real SMTP server on a loopback port for the whole module."""
    with running_relay() as handler:
        yield handler


@pytest.fixture
def postmark() -> Iterator[FakePostmark]:
    fake = FakePostmark(lambda: T0)
    yield fake
    fake.close()
    assert fake.problems == []


@pytest.fixture
def smuggling_templates(tmp_path: Path) -> Path:
    """An operator's templates (the built-in v1 as v2) whose subject, text and HTML each
    try to add list headers and a bulk Precedence."""
    root = tmp_path / "templates"
    shutil.copytree(templates_root() / "v1", root / "v2")
    version = root / "v2"
    subject = (version / "email_subject.mustache").read_text(encoding="utf-8")
    smuggled = subject.rstrip("\n") + "\n" + SMUGGLED
    (version / "email_subject.mustache").write_text(smuggled, encoding="utf-8")
    for name in ("email_text.mustache", "email_html.mustache"):
        body = (version / name).read_text(encoding="utf-8")
        (version / name).write_text(SMUGGLED + "\n" + body, encoding="utf-8")
    return root


def _deliver(tmp_path: Path, templates: Path | None = None, **config: Any) -> tuple[str, str]:
    """One notice enqueued and swept by email alone under ``config``, on a database in
    ``tmp_path``: (its id, its phase)."""
    tmp_path.mkdir(exist_ok=True)
    extra: dict[str, Any] = {"templates": {"dir": str(templates)}} if templates else {}
    version = {"template_version": "v2"} if templates else {}
    settings = make_settings(
        db=str(tmp_path / "resetctl.db"),
        policy={"default": {"channels": ["email"], **version}},
        **extra,
        **config,
    )
    clock = FakeClock()
    environ = {"POSTMARK_SERVER_TOKEN": TOKEN}
    with api.open(config=settings, clock=clock, sleep=clock.sleep, environ=environ) as handle:
        [result] = handle.enqueue([reset_request()])
        handle.sweep()
        return result.notice_id, str(handle.inspect(result.notice_id)["phase"])


def _smtp(relay: Relay) -> dict[str, Any]:
    return {
        "transport": {"email": "smtp"},
        "smtp": {"host": "127.0.0.1", "port": relay.port, "security": "none", "from": SENDER},
    }


def _postmark(fake: FakePostmark, **table: Any) -> dict[str, Any]:
    return {
        "transport": {"email": "postmark"},
        "postmark": {"from": SENDER, "base_url": fake.base_url, **table},
    }


def _postmark_table(stream: str) -> dict[str, Any]:
    return {
        "transport": {"email": "postmark"},
        "postmark": {"from": SENDER, "message_stream": stream},
    }


def _outbox_content(tmp_path: Path, notice_id: str) -> dict[str, Any]:
    """The stored content of the notice's one outbox message."""
    with Store(tmp_path / "resetctl.db") as store:
        (listed,) = store.outbox_messages(notice_id)
        row = store.outbox_message(listed["message_id"])
    assert row is not None
    fields = {"message_id", "notice_id", "channel", "attempt_key", "status", "submitted_at"}
    return {k: v for k, v in row.items() if k not in fields}


def _header_names(mail: EmailMessage) -> list[str]:
    """Every header name of the mail and of each of its MIME parts."""
    return [name for part in mail.walk() for name in part]


def _header_blocks(raw: bytes) -> list[bytes]:
    """The header block of the mail and of each MIME part, as bytes on the wire."""
    mail = email.message_from_bytes(raw, policy=default_policy)
    blocks = [raw.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0]]
    for part in mail.walk():
        if part is not mail:
            blocks.append(part.as_bytes().replace(b"\r\n", b"\n").split(b"\n\n", 1)[0])
    return blocks


def test_smtp_mail_carries_no_list_or_bulk_header(tmp_path: Path, relay: Relay) -> None:
    """Through a real SMTP server: the headers built are the transactional set
    (Auto-Submitted, auto-replies suppressed), and no List-* or Precedence line is
    anywhere in the message."""
    before = len(relay.raw)
    _, phase = _deliver(tmp_path, **_smtp(relay))
    assert phase == "accepted"
    assert len(relay.raw) == before + 1
    raw = relay.raw[-1]
    mail = email.message_from_bytes(raw, policy=default_policy)
    assert isinstance(mail, EmailMessage)
    assert list(mail.keys()) == SMTP_HEADERS
    assert mail["Auto-Submitted"] == "auto-generated"
    assert mail["X-Auto-Response-Suppress"] == "All"
    assert [n for n in _header_names(mail) if BULK_HEADER.match(n)] == []
    assert BULK_LINE.search(raw) is None


def test_postmark_sends_on_the_transactional_stream_with_no_headers(
    tmp_path: Path, postmark: FakePostmark
) -> None:
    """Through the loopback Postmark: MessageStream is "outbound", every server's
    transactional stream, and the send sets no Headers (so none is a list's)."""
    _deliver(tmp_path, **_postmark(postmark))
    (payload,) = postmark.sent.values()
    assert payload["MessageStream"] == "outbound"
    assert set(payload) == POSTMARK_FIELDS
    assert "Headers" not in payload
    assert not re.search(r"list-unsubscribe|list-id|precedence", json.dumps(payload), re.I)


@pytest.mark.parametrize("stream", ["broadcast", "Broadcast", " broadcast "])
def test_postmark_refuses_the_broadcast_stream(store: Store, stream: str) -> None:
    """message_stream = "broadcast" (Postmark's bulk stream, which adds unsubscribe
    headers) is a config error naming the key, before anything is sent."""
    settings = make_settings(**_postmark_table(stream))
    with pytest.raises(ConfigError, match=r"^postmark\.message_stream: .*transactional"):
        build_transports(settings, store, lambda: T0, {"POSTMARK_SERVER_TOKEN": TOKEN})


def test_the_outbox_stores_no_header(tmp_path: Path) -> None:
    """The outbox keeps the rendered parts only: no header, a list's least of all."""
    notice_id, _ = _deliver(tmp_path, outbox={"email_status": "pending"})
    content = _outbox_content(tmp_path, notice_id)
    assert set(content) == OUTBOX_FIELDS
    assert not re.search(r"list-unsubscribe|list-id|precedence", json.dumps(content), re.I)


def test_a_template_cannot_add_a_header_over_smtp(
    tmp_path: Path, relay: Relay, smuggling_templates: Path
) -> None:
    """Templates render a subject, a text and an HTML body, nothing else: list header
    lines written into each reach the relay as text (the subject on its one line),
    never as a header of the mail or of a part."""
    _, phase = _deliver(tmp_path, smuggling_templates, **_smtp(relay))
    assert phase == "accepted"
    raw = relay.raw[-1]
    mail = email.message_from_bytes(raw, policy=default_policy)
    assert isinstance(mail, EmailMessage)
    assert list(mail.keys()) == SMTP_HEADERS
    assert [n for n in _header_names(mail) if BULK_HEADER.match(n)] == []
    assert all(BULK_LINE.search(block) is None for block in _header_blocks(raw))
    assert "List-Unsubscribe:" in mail["Subject"]  # kept as words of the one subject line
    text = mail.get_body(("plain",))
    assert text is not None
    assert "Precedence: bulk" in text.get_content()


def test_a_template_cannot_add_a_header_through_postmark_or_the_outbox(
    tmp_path: Path, postmark: FakePostmark, smuggling_templates: Path
) -> None:
    """The same templates through Postmark: the send's fields are the known ones (no
    Headers), the subject one line; in the outbox, only the rendered parts are stored."""
    _deliver(tmp_path / "pm", smuggling_templates, **_postmark(postmark))
    (payload,) = postmark.sent.values()
    assert set(payload) == POSTMARK_FIELDS
    assert payload["MessageStream"] == "outbound"
    assert "\n" not in payload["Subject"]
    notice_id, _ = _deliver(
        tmp_path / "box", smuggling_templates, outbox={"email_status": "pending"}
    )
    content = _outbox_content(tmp_path / "box", notice_id)
    assert set(content) == OUTBOX_FIELDS
    assert "\n" not in content["subject"]
