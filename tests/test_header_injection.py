"""No text the person chose can become a header (issue 24, item 2).

Built the way it broke: an operator subject template that shows ``{{display_name}}``, a
display name written as an RFC 2047 encoded word that decodes to a line break and a
``Reply-To:``, and a real SMTP server (aiosmtpd) on loopback, on the interpreter the suite
runs on (CPython 3.11.7 here, which carries CVE-2024-6923). The relay must receive exactly
the headers resetctl built, no Reply-To, and the body intact.
"""

from __future__ import annotations

import base64
import email
import email.errors
import shutil
import unicodedata
from collections.abc import Iterator
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl
from smtp_relay import Relay, free_port, running_relay

import resetctl.transports.smtp as smtp
from resetctl import api
from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import InputError
from resetctl.render import (
    ENCODED_WORD_BREAK,
    EmailContent,
    RenderModel,
    header_text,
    render_email,
    templates_root,
)
from resetctl.store import Store
from resetctl.templates import check_templates
from resetctl.transports import Message, PermanentError, build_transports
from resetctl.transports.smtp import SmtpTransport

SENDER = "no-reply@shop.example"
ATTACKER = "evil@attacker.example"
RESET_URL = "https://shop.example/reset/HEADER-CANARY-5e1f"
#: The headers resetctl builds for every email, in order: nothing more may arrive.
BUILT_HEADERS = [
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
#: The operator's subject in the report: it greets by name.
GREETING_SUBJECT = (
    "Hi {{display_name}}, your password reset link (expires in {{{minutes_phrase}}})\n"
)


def _b64_word(text: str) -> str:
    return f"=?utf-8?b?{base64.b64encode(text.encode()).decode()}?="


#: Display names that decode (in CPython's email package) to a line break and a header.
ENCODED_NAMES = {
    "q, CRLF, an early body": (
        f"=?utf-8?q?Ada=0D=0AReply-To:_{ATTACKER}=0D=0A=0D=0AYour_account_is_locked?="
    ),
    "q, LF": f"=?utf-8?q?Ada=0AReply-To:_{ATTACKER}?=",
    "b, CRLF": _b64_word(f"Ada\r\nReply-To: {ATTACKER}"),
    "q, U+2028": f"=?utf-8?q?Ada=E2=80=A8Reply-To:_{ATTACKER}?=",
    "q, NEL": f"=?utf-8?q?Ada=C2=85Reply-To:_{ATTACKER}?=",
    "Q upper case, mid-word": f"Ada=?UTF-8?Q?=0D=0AReply-To:_{ATTACKER}?=",
}
#: Subjects with a line break in any form, decoded or not, that a caller could hand over.
RAW_BREAKS = {
    "CR": "\r",
    "LF": "\n",
    "CRLF": "\r\n",
    "VT": "\x0b",
    "FF": "\x0c",
    "FS": "\x1c",
    "NEL": "\x85",
    "U+2028": "\u2028",
    "U+2029": "\u2029",
}
SUBJECTS = {
    **{f"raw {name}": f"Hi Ada{brk}Reply-To: {ATTACKER}" for name, brk in RAW_BREAKS.items()},
    **{f"encoded {name}": f"Hi {value}, reset" for name, value in ENCODED_NAMES.items()},
}


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    """A real SMTP server on a loopback port for the whole module."""
    with running_relay() as handler:
        yield handler


def header_names(raw: bytes) -> list[str]:
    """The field names of the header block as a receiver reads it: lines up to the first
    empty one, a line starting with a space or tab continuing the one before."""
    head = raw.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0]
    return [
        line.split(b":", 1)[0].decode("ascii", "replace")
        for line in head.split(b"\n")
        if line and line[:1] not in (b" ", b"\t")
    ]


def _smtp_table(relay: Relay) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": relay.port, "security": "none", "from": f"Shop <{SENDER}>"}


@pytest.fixture
def transport(store: Store, clock: FakeClock, relay: Relay) -> SmtpTransport:
    settings = make_settings(transport={"email": "smtp"}, smtp=_smtp_table(relay))
    built = build_transports(settings, store, clock, {})["email"]
    assert isinstance(built, SmtpTransport)
    return built


@pytest.fixture
def greeting_templates(tmp_path: Path) -> Path:
    """An operator's templates: the built-in v1 as v2, its subject greeting by name."""
    root = tmp_path / "templates"
    shutil.copytree(templates_root() / "v1", root / "v2")
    (root / "v2" / "email_subject.mustache").write_text(GREETING_SUBJECT, encoding="utf-8")
    return root


def _message(subject: str, recipient: str = "ada@example.org") -> Message:
    content = EmailContent(subject, f"Reset: {RESET_URL}\n", f'<p><a href="{RESET_URL}">x</a></p>')
    return Message("email", "ntc_header", recipient, 4e9, email=content)


def _one_safe_line(text: str) -> bool:
    return "=?" not in text and not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


@pytest.mark.parametrize("subject", SUBJECTS.values(), ids=SUBJECTS.keys())
def test_header_text_is_one_line_with_no_encoded_word(subject: str) -> None:
    """Every control character and line separator becomes a space, every encoded-word
    opener is split by an invisible joiner, and doing it again changes nothing."""
    safe = header_text(subject)
    assert _one_safe_line(safe)
    assert header_text(safe) == safe
    # The words stay, as text: only line breaks became spaces.
    spaced = "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in subject)
    assert safe.replace(ENCODED_WORD_BREAK, "=?").split() == spaced.split()


@pytest.mark.parametrize("name", ENCODED_NAMES.values(), ids=ENCODED_NAMES.keys())
def test_an_encoded_word_name_reaches_a_real_relay_as_text(
    tmp_path: Path, greeting_templates: Path, relay: Relay, name: str
) -> None:
    """enqueue → sweep → SMTP on loopback: the relay gets exactly the headers resetctl
    built, no Reply-To, the name shown as the person wrote it, and the body intact."""
    settings = make_settings(
        db=str(tmp_path / "resetctl.db"),
        templates={"dir": str(greeting_templates)},
        transport={"email": "smtp"},
        smtp=_smtp_table(relay),
        policy={"default": {"channels": ["email"], "template_version": "v2"}},
    )
    clock = FakeClock()
    with api.open(config=settings, clock=clock, sleep=clock.sleep, environ={}) as handle:
        [result] = handle.enqueue([reset_request(display_name=name, reset_url=RESET_URL)])
        before = len(relay.raw)
        handle.sweep()
        notice = handle.inspect(result.notice_id)
    assert len(relay.raw) == before + 1
    raw = relay.raw[-1]
    assert header_names(raw) == BUILT_HEADERS
    mail = relay.parsed()
    assert list(mail.keys()) == BUILT_HEADERS
    assert mail.get_all("Reply-To") is None
    assert mail["Subject"] == (
        f"Hi {name.replace('=?', ENCODED_WORD_BREAK)}, your password reset link"
        " (expires in 10 minutes)"
    )
    text, html = mail.iter_parts()
    assert RESET_URL in text.get_content()
    assert "Someone asked to reset the password" in text.get_content()
    assert f'href="{RESET_URL}"' in html.get_content()
    assert notice["phase"] == "accepted"


@pytest.mark.parametrize("subject", SUBJECTS.values(), ids=SUBJECTS.keys())
@pytest.mark.parametrize("recipient", ["ada@example.org", "jos\u00e9@example.org"])
def test_any_subject_handed_to_the_transport_stays_one_header(
    transport: SmtpTransport, relay: Relay, subject: str, recipient: str
) -> None:
    """A subject built by any caller (a library user, a plugin's renderer) with a line
    break in any form reaches the relay as one Subject, in 7-bit and SMTPUTF8 mail."""
    transport.submit(_message(subject, recipient), "ntc_header:email:1")
    assert header_names(relay.raw[-1]) == BUILT_HEADERS
    mail = relay.parsed()
    assert _one_safe_line(mail["Subject"])
    assert mail["To"] == recipient
    assert RESET_URL in mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def test_the_last_guard_refuses_headers_that_are_not_the_ones_built(
    transport: SmtpTransport, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the subject's neutralising taken away, the composed header block is checked
    before any I/O: an injected header is a permanent error, and nothing is sent (on an
    interpreter with the CVE, by resetctl's own check; on one without, by the email
    package's HeaderWriteError, mapped to the same error)."""
    monkeypatch.setattr(smtp, "header_text", lambda text: text)
    before = len(relay.raw)
    with pytest.raises(PermanentError, match="would not stay one header") as raised:
        transport.submit(_message(f"Hi {ENCODED_NAMES['q, CRLF, an early body']}"), "k:email:1")
    assert ATTACKER not in str(raised.value)
    assert len(relay.raw) == before


def test_header_write_error_is_a_clear_permanent_error(
    transport: SmtpTransport, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """email.errors.HeaderWriteError (CPython 3.11.10, 3.12.5 and later) is a permanent
    error that says what happened, not an unexpected exception; nothing is sent."""

    class HeaderWriteError(email.errors.MessageError):
        pass

    def refuse(self: EmailMessage, *args: Any, **kwargs: Any) -> bytes:
        raise HeaderWriteError(f"folded header contained newline: {ATTACKER}")

    monkeypatch.setattr(email.errors, "HeaderWriteError", HeaderWriteError, raising=False)
    monkeypatch.setattr(EmailMessage, "as_bytes", refuse)
    before = len(relay.raw)
    with pytest.raises(PermanentError, match="would not stay one header") as raised:
        transport.submit(_message("Hi"), "k:email:1")
    assert ATTACKER not in str(raised.value)
    assert len(relay.raw) == before


def test_a_recipient_holding_an_encoded_word_is_refused_before_connecting(
    store: Store, clock: FakeClock
) -> None:
    """The email package decodes an encoded word even in an address: such a recipient is
    permanent before any I/O (nothing listens here), never a To unlike the envelope."""
    table = {"host": "127.0.0.1", "port": free_port(), "security": "none", "from": SENDER}
    settings = make_settings(transport={"email": "smtp"}, smtp=table)
    transport = build_transports(settings, store, clock, {})["email"]
    recipient = "=?utf-8?q?ceo=40shop.example?=@example.org"
    with pytest.raises(PermanentError, match="not a valid address"):
        transport.submit(_message("Hi", recipient), "k:email:1")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"display_name": "Ada\u2028Reply-To: x"}, "line 1: display_name: contains control"),
        ({"display_name": "Ada\u2029Lovelace"}, "line 1: display_name: contains control"),
        ({"display_name": "Ada\x85Lovelace"}, "line 1: display_name: contains control"),
        ({"display_name": "Ada\r\nReply-To: x"}, "line 1: display_name: contains control"),
        ({"email": "=?utf-8?q?ceo?=@example.org"}, "line 1: email: not a valid email address"),
    ],
)
def test_enqueue_refuses_line_breaks_in_a_name_and_encoded_words_in_an_address(
    store: Store, settings: Settings, fields: dict[str, str], problem: str
) -> None:
    """Every form of line break in a display name, and an encoded word in an address,
    is refused at enqueue with the field named; nothing is written."""
    with pytest.raises(InputError) as raised:
        enqueue(store, settings, [reset_request(**fields)], 1e9)
    assert any(p.startswith(problem) for p in raised.value.problems)
    assert store.conn.execute("SELECT count(*) FROM notices").fetchone()[0] == 0


def test_an_encoded_word_name_is_kept_as_the_person_wrote_it(store: Store) -> None:
    """A display name holding ``=?`` is accepted (it is text), and shown as text."""
    name = ENCODED_NAMES["q, CRLF, an early body"]
    enqueue(store, make_settings(), [reset_request(display_name=name)], 1e9)
    email_content = render_email(RenderModel(RESET_URL, 10, "Support", name), "v1")
    assert _one_safe_line(email_content.subject)


@pytest.mark.parametrize(
    "subject",
    [
        GREETING_SUBJECT,
        "{{#display_name}}{{.}}: {{/display_name}}your reset link ({{{minutes_phrase}}})\n",
        "Your reset link\n({{{minutes_phrase}}}) {{{display_name}}}\n",
    ],
)
def test_templates_check_warns_when_the_subject_shows_user_text(
    greeting_templates: Path, subject: str
) -> None:
    """A subject showing the display name, however the template reaches it, passes the
    check with a warning naming the file and line; the built-ins warn of nothing."""
    (greeting_templates / "v2" / "email_subject.mustache").write_text(subject, encoding="utf-8")
    settings = make_settings(
        templates={"dir": str(greeting_templates)}, policy={"default": {"template_version": "v2"}}
    )
    checked = [c for c in check_templates(settings, "v2") if c.locale is None]
    [copy] = checked
    assert copy.problems == ()
    [warning] = copy.warnings
    line = next(n for n, text in enumerate(subject.splitlines(), 1) if "display_name" in text)
    assert warning.startswith(f"v2/email_subject.mustache line {line}: the subject shows")
    assert copy.to_json()["warnings"] == [warning]
    assert all(not c.warnings for c in check_templates(make_settings()))


def test_templates_check_prints_the_warning_and_passes(greeting_templates: Path) -> None:
    """`resetctl templates check` prints the warning under the copy and exits 0."""
    config = greeting_templates.parent / "resetctl.toml"
    config.write_text(
        f'[templates]\ndir = "{greeting_templates}"\n[policy.default]\ntemplate_version = "v2"\n',
        encoding="utf-8",
    )
    done = resetctl("templates", "check", "--version", "v2", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "  warning: v2/email_subject.mustache line 1: the subject shows" in done.stdout


def test_on_this_interpreter_the_email_package_alone_is_what_broke() -> None:
    """The premise, on the interpreter the suite runs on: before 3.11.10 (3.12.5) the
    email package writes the decoded line break, a Reply-To arrives; from then on it
    raises HeaderWriteError. resetctl's own header building holds on both (above)."""
    mail = EmailMessage(policy=default_policy.clone(linesep="\r\n"))
    mail["Subject"] = f"Hi {ENCODED_NAMES['q, CRLF, an early body']}"
    mail.set_content("body")
    fixed = getattr(email.errors, "HeaderWriteError", None)
    if fixed is None:
        assert "Reply-To" in header_names(mail.as_bytes())
    else:
        with pytest.raises(fixed):
            mail.as_bytes()
