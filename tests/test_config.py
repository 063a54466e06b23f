"""Configuration and policy: built-in defaults, TOML loading, validation that names the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resetctl.config import load_settings, settings_from_mapping
from resetctl.durations import parse_duration
from resetctl.errors import ConfigError
from resetctl.policy import Channel, OnBudgetSpent, Policy


def test_built_in_defaults_are_the_documented_policy() -> None:
    """No config: 10-minute links, email first, polls at 15/45/105 s, SMS fallback, escalate."""
    policy = load_settings(None).policy_for("default")
    assert policy is not None
    assert policy.name == "default"
    assert policy.ttl == 600
    assert policy.channels == (Channel.EMAIL, Channel.SMS)
    assert policy.polls_for("email") == (15, 45, 105)
    assert policy.on_poll_budget_spent is OnBudgetSpent.ESCALATE


def test_toml_file_with_regions(tmp_path: Path) -> None:
    """A region's own table wins; other regions use [policy.default] once the file says
    unknown_region = "default" (without it they are refused: test_loud_mistakes.py)."""
    path = tmp_path / "resetctl.toml"
    path.write_text(
        """
support_label = "Acme support"
unknown_region = "default"
[policy.default]
version = 3
ttl = "15m"
[policy.apac]
version = 7
channels = ["sms", "email"]
on_poll_budget_spent = "expire"
[policy.apac.sms]
poll_delays = ["10s", "30s", "1m"]
""",
        encoding="utf-8",
    )
    settings = load_settings(path)
    eu = settings.policy_for("eu")
    assert eu is not None
    assert (eu.name, eu.version, eu.ttl) == ("default", 3, 900)
    apac = settings.policy_for("apac")
    assert apac is not None
    assert (apac.version, apac.channels[0], apac.polls_for("sms")) == (7, "sms", (10, 30, 60))
    assert settings.support_label == "Acme support"


def test_policy_record_round_trips() -> None:
    """A stored policy record rebuilds the same policy (notices in flight keep theirs)."""
    policy = settings_from_mapping({"policy": {"eu": {"version": 2, "ttl": 900}}}).policies["eu"]
    assert Policy.from_record(policy.to_record()) == policy


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"policy": {"default": {"ttl": 0}}}, "policy.default.ttl"),
        ({"policy": {"default": {"ttl": "-5m"}}}, "policy.default.ttl"),
        ({"policy": {"default": {"lease": "0s"}}}, "policy.default.lease"),
        ({"policy": {"eu": {"fallback_reserve": "10m"}}}, "policy.eu.fallback_reserve"),
        ({"policy": {"eu": {"email": {"poll_delays": [15, 500]}}}}, "policy.eu.email.poll_delays"),
        ({"policy": {"eu": {"sms": {"poll_delays": [30, 200]}}}}, "policy.eu.sms.poll_delays"),
        ({"policy": {"eu": {"email": {"poll_delays": [45, 15]}}}}, "policy.eu.email.poll_delays"),
        ({"policy": {"eu": {"colour": "red"}}}, "policy.eu.colour"),
        ({"policy": {"eu": {"email": {"retries": 3}}}}, "policy.eu.email.retries"),
        ({"policy": {"eu": {"channels": ["fax"]}}}, "policy.eu.channels"),
        ({"policy": {"eu": {"channels": []}}}, "policy.eu.channels"),
        ({"policy": {"eu": {"on_poll_budget_spent": "panic"}}}, "policy.eu.on_poll_budget_spent"),
        ({"policy": {"eu": {"batch_size": 0}}}, "policy.eu.batch_size"),
        ({"policy": {"eu": {"version": "one"}}}, "policy.eu.version"),
        ({"policy": {"eu": {"template_version": "../x"}}}, "policy.eu.template_version"),
        ({"colour": "red"}, "colour"),
        ({"outbox": {"email_status": "sent"}}, "outbox.email_status"),
        ({"transport": {"email": "carrier-pigeon"}}, "transport.email"),
    ],
)
def test_validation_names_the_bad_key(config: dict[str, Any], key: str) -> None:
    """Each invalid setting is refused with a message that starts with its key."""
    with pytest.raises(ConfigError) as error:
        settings_from_mapping(config)
    assert str(error.value).startswith(key + ":")


def test_malformed_toml_names_the_file_and_line(tmp_path: Path) -> None:
    """A TOML syntax error says which file and where."""
    path = tmp_path / "bad.toml"
    path.write_text("[policy.default]\nttl = \n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.toml.*line 2"):
        load_settings(path)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90.0), ("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0), ("250ms", 0.25)],
)
def test_durations(text: object, seconds: float) -> None:
    """Durations accept seconds or unit suffixes."""
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("text", ["", "10 minutes", "m", True, [], "0", -1])
def test_bad_durations(text: object) -> None:
    """Anything else, or a non-positive value, is refused naming the key."""
    with pytest.raises(ConfigError, match=r"^x:"):
        parse_duration(text, "x")


@pytest.mark.parametrize("transport", ["twilio", "postmark"])
@pytest.mark.parametrize(
    "url", ["http://api.twilio.com", "HTTP://api.postmarkapp.com/", "http://user@10.0.0.5:8080/x"]
)
def test_cleartext_base_url_is_refused_naming_the_key(transport: str, url: str) -> None:
    """Credentials travel with every request: an http:// base_url elsewhere is refused."""
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping({transport: {"base_url": url}})
    message = str(raised.value)
    assert message.startswith(f"{transport}.base_url: must be https://")
    assert "\n" not in message


@pytest.mark.parametrize(
    "url",
    [
        "https://api.twilio.com",
        "http://127.0.0.1:8080",
        "http://localhost:9/x",
        "http://[::1]:8080/",
    ],
)
def test_tls_or_loopback_base_url_is_accepted(url: str) -> None:
    """https:// anywhere, http:// only to this machine (tests' stand-in servers)."""
    settings = settings_from_mapping({"twilio": {"base_url": url}})
    assert settings.transport_options["twilio"]["base_url"] == url


def test_policies_stored_before_the_new_keys_read_with_their_defaults() -> None:
    """A policy record without alert_stalled_after and max_ttl gets 3 minutes and 24 hours."""
    record = load_settings(None).default_policy.to_record()
    del record["alert_stalled_after"], record["max_ttl"]
    policy = Policy.from_record(record)
    assert (policy.alert_stalled_after, policy.max_ttl) == (180.0, 86400.0)
    assert policy == load_settings(None).default_policy
