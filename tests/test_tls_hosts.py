"""Cleartext goes only to this machine, judged by the host the URL actually names.

The loopback exception once split a base_url by hand, so ``http://evil.example#@127.0.0.1``
passed as 127.0.0.1 while httpx sent the credentials to evil.example. Now every check reads
the host httpx parses (the one it connects to); ``[smtp] security = "none"`` and http://
status-callback and public URLs are held to the same rule. Each refusal is a ConfigError
naming its key, exit 2 on the command line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FakeClock, make_settings
from typer.testing import CliRunner

import resetctl
import resetctl.api
from resetctl.cli import app
from resetctl.config import loopback_host, settings_from_mapping
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.transports import build_transports
from resetctl.web import twilio_callbacks

TWILIO_ENV = {
    "TWILIO_ACCOUNT_SID": "AC" + "0" * 32,
    "TWILIO_AUTH_TOKEN": "token-0123456789",
    "POSTMARK_SERVER_TOKEN": "pm-token-0123",
}
SENDER = "+14155550100"

#: URLs whose host, as httpx parses it, is not this machine, however they read.
REMOTE = [
    "http://evil.example#@127.0.0.1",
    "http://evil.example?@127.0.0.1",
    "http://evil.example/@127.0.0.1",
    "http://127.0.0.1.evil.example/",
    "http://localhost.evil.example/",
    "http://127.0.0.1%2f@evil.example/",
    "HTTP://evil.example/",
    "http://0x7f000001/",
    "http://[::ffff:7f00:1]/",
    "http://203.0.113.7:80/",
]
#: Cleartext URLs that do stay here.
LOOPBACK = [
    "http://127.0.0.1:8080",
    "http://127.9.8.7/x",
    "http://localhost:1/",
    "http://LOCALHOST:1/",
    "http://[::1]:8080/",
    "http://user@127.0.0.1:8080/",
]


def test_the_remote_forms_parse_to_a_remote_host() -> None:
    """The table's premise: httpx connects to a host that is not loopback for each."""
    for url in REMOTE:
        assert not loopback_host(httpx.URL(url).host), url
    for url in LOOPBACK:
        assert loopback_host(httpx.URL(url).host), url


@pytest.mark.parametrize("transport", ["twilio", "postmark"])
@pytest.mark.parametrize("url", REMOTE)
def test_a_cleartext_base_url_off_this_machine_is_refused(transport: str, url: str) -> None:
    """An http:// base_url whose parsed host is elsewhere is refused, naming the key."""
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping({transport: {"base_url": url}})
    assert str(raised.value).startswith(f"{transport}.base_url: must be https://")


@pytest.mark.parametrize("url", LOOPBACK)
def test_a_cleartext_base_url_on_this_machine_is_accepted(url: str) -> None:
    """A provider stand-in on loopback (tests, demos) keeps working over http://."""
    settings_from_mapping({"twilio": {"base_url": url}, "postmark": {"base_url": url}})


def test_a_base_url_httpx_cannot_parse_is_refused() -> None:
    """A base_url with a tab is one ConfigError, not a traceback when the client is made."""
    with pytest.raises(ConfigError, match=r"^twilio\.base_url: not a valid URL$"):
        settings_from_mapping({"twilio": {"base_url": "http://127.0.0.1\t/x"}})


def _build(store: Store, clock: FakeClock, **tables: Any) -> None:
    settings = settings_from_mapping(tables)
    build_transports(settings, store, clock, TWILIO_ENV)


@pytest.mark.parametrize(
    "host", ["mail.example", "127.0.0.1.mail.example", "203.0.113.9", "localhost.mail.example"]
)
def test_smtp_without_tls_to_a_remote_relay_is_refused(
    store: Store, clock: FakeClock, host: str
) -> None:
    """security = "none" to a relay elsewhere would carry every link in clear: refused."""
    smtp = {"host": host, "security": "none", "from": "no-reply@shop.example"}
    with pytest.raises(ConfigError, match=r'^smtp\.security: "none" only to a loopback host'):
        _build(store, clock, transport={"email": "smtp"}, smtp=smtp)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]"])
def test_smtp_without_tls_to_a_local_relay_is_accepted(
    store: Store, clock: FakeClock, host: str
) -> None:
    """A relay on this machine (a local MTA that forwards over TLS) may be spoken to plainly."""
    smtp = {"host": host, "security": "none", "from": "no-reply@shop.example"}
    _build(store, clock, transport={"email": "smtp"}, smtp=smtp)


@pytest.mark.parametrize(
    "url", ["http://hooks.example/twilio", "http://hooks.example#@127.0.0.1/twilio"]
)
def test_a_cleartext_status_callback_off_this_machine_is_refused(
    store: Store, clock: FakeClock, url: str
) -> None:
    """Twilio would post each status and number to it in clear: refused, naming the key."""
    twilio = {"from": SENDER, "status_callback": url}
    with pytest.raises(ConfigError, match=r"^twilio\.status_callback: must be https://"):
        _build(store, clock, transport={"sms": "twilio"}, twilio=twilio)


@pytest.mark.parametrize("url", ["https://hooks.example/twilio", "http://127.0.0.1:9/twilio"])
def test_an_https_or_loopback_status_callback_is_accepted(
    store: Store, clock: FakeClock, url: str
) -> None:
    """https:// anywhere, or http:// to this machine."""
    twilio = {"from": SENDER, "status_callback": url}
    _build(store, clock, transport={"sms": "twilio"}, twilio=twilio)


def test_a_cleartext_public_url_off_this_machine_is_refused(db_path: Path) -> None:
    """The callback endpoint's public URL, given or from [twilio] status_callback."""
    with resetctl.open(db_path, make_settings(), environ=TWILIO_ENV) as handle:
        with pytest.raises(ConfigError, match=r"^public_url: must be https://"):
            twilio_callbacks(handle, "http://hooks.example/twilio")
        twilio_callbacks(handle, "http://127.0.0.1:8080/twilio")
        twilio_callbacks(handle, "https://hooks.example/twilio")
    settings = make_settings(twilio={"status_callback": "http://hooks.example/twilio"})
    with (
        resetctl.open(db_path, settings, environ=TWILIO_ENV) as handle,
        pytest.raises(ConfigError, match=r"^twilio\.status_callback: must be https://"),
    ):
        twilio_callbacks(handle)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ('[twilio]\nbase_url = "http://evil.example#@127.0.0.1"\n', "twilio.base_url"),
        ('[postmark]\nbase_url = "http://evil.example?@127.0.0.1"\n', "postmark.base_url"),
        (
            '[transport]\nemail = "smtp"\n[smtp]\nhost = "mail.example"\nsecurity = "none"\n'
            'from = "no-reply@shop.example"\n',
            "smtp.security",
        ),
        (
            f'[transport]\nsms = "twilio"\n[twilio]\nfrom = "{SENDER}"\n'
            'status_callback = "http://hooks.example/twilio"\n',
            "twilio.status_callback",
        ),
    ],
)
def test_the_command_line_names_the_key_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, key: str
) -> None:
    """`resetctl sweep` with each refused setting: one line naming the key, exit 2, no
    request made (a sweep builds its transports before it claims anything)."""
    path = tmp_path / "resetctl.toml"
    path.write_text(config, encoding="utf-8")
    for name, value in TWILIO_ENV.items():
        monkeypatch.setenv(name, value)
    resetctl.api.init_database(tmp_path / "resetctl.db")  # sweep refuses a missing one first
    result = CliRunner().invoke(
        app, ["sweep", "--db", str(tmp_path / "resetctl.db"), "--config", str(path)]
    )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    # The file's mistake names the file and, where the key is set, its line, then the key.
    assert re.match(rf"error: (config \S+, line \d+: )?{re.escape(key)}: ", lines[0]), lines[0]


def test_serve_callbacks_refuses_a_cleartext_public_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--public-url http://… to another host: exit 2 before anything listens."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", TWILIO_ENV["TWILIO_AUTH_TOKEN"])
    db = tmp_path / "resetctl.db"
    resetctl.api.init_database(db)
    result = CliRunner().invoke(
        app,
        [
            "serve-callbacks",
            "--db",
            str(db),
            "--bind",
            "127.0.0.1:0",
            "--public-url",
            "http://hooks.example/twilio",
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "error: public_url: must be https://; http:// only for a loopback host"
    )
