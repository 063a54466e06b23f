"""`resetctl serve` mounts each provider instance's callbacks at its own public URL's
path, whatever its kind, and refuses a path two instances (or serve itself) would share."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_settings

from resetctl import api
from resetctl.config import Settings
from resetctl.errors import ConfigError
from resetctl.serve import callback_apps

ENVIRON = {
    "POSTMARK_SERVER_TOKEN": "pm-token",
    "POSTMARK_WEBHOOK_USERNAME": "resetctl",
    "POSTMARK_WEBHOOK_PASSWORD": "a-long-webhook-password",
    "MAILGUN_API_KEY": "key-mailgun",
    "MAILGUN_WEBHOOK_SIGNING_KEY": "mailgun-signing-key",
    "TWILIO_AUTH_TOKEN": "twilio-token",
}


def _settings(mailgun_hook: str = "https://hooks.example/hooks/mailgun") -> Settings:
    return make_settings(
        transport={"email": ["pm_main", "mg_backup"], "sms": "twilio"},
        twilio={"from": "+14155550100", "status_callback": "https://hooks.example/hooks/twilio"},
        providers={
            "pm_main": {
                "kind": "postmark",
                "from": "no-reply@shop.example",
                "webhook_url": "https://hooks.example/hooks/postmark",
            },
            "mg_backup": {
                "kind": "mailgun",
                "domain": "mg.shop.example",
                "from": "no-reply@mg.shop.example",
                "webhook_url": mailgun_hook,
            },
            # configured, named by no channel, and given no public URL: not mounted
            "pm_spare": {"kind": "postmark", "from": "no-reply@shop.example"},
        },
    )


def test_each_instance_is_mounted_at_its_public_urls_path(db_path: Path) -> None:
    """Postmark's and Mailgun's webhooks and Twilio's callbacks, each at its own path."""
    with api.open(db_path, _settings(), environ=ENVIRON) as handle:
        mounted = callback_apps(handle)
    assert sorted(mounted) == ["/hooks/mailgun", "/hooks/postmark", "/hooks/twilio"]


@pytest.mark.parametrize(
    ("hook", "words"),
    [
        ("https://hooks.example/hooks/postmark", "another instance's"),
        ("https://hooks.example/v1/mailgun", "one of serve's own routes"),
    ],
)
def test_a_shared_path_is_refused_naming_the_instance(db_path: Path, hook: str, words: str) -> None:
    """Two instances on one path, or one on serve's own routes: a ConfigError at start."""
    with (
        api.open(db_path, _settings(hook), environ=ENVIRON) as handle,
        pytest.raises(ConfigError, match=rf"providers\.mg_backup: .*{words}"),
    ):
        callback_apps(handle)


def test_an_instance_missing_its_webhook_key_fails_at_start(db_path: Path) -> None:
    """A webhook URL without the key that verifies its requests fails when serve starts,
    naming the key and never a value."""
    environ = {k: v for k, v in ENVIRON.items() if k != "MAILGUN_WEBHOOK_SIGNING_KEY"}
    with (
        api.open(db_path, _settings(), environ=environ) as handle,
        pytest.raises(ConfigError, match="MAILGUN_WEBHOOK_SIGNING_KEY") as raised,
    ):
        callback_apps(handle)
    assert "mailgun-signing-key" not in str(raised.value)
