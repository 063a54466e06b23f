"""Third-party transports plug in through the resetctl.transports entry-point group."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import FakeClock, make_settings

from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.transports import build_transports, plugin, status_vocabulary

PLUGIN_MODULE = """
from resetctl.machine import Status
from resetctl.transports.base import ProviderStatus, StatusVocabulary, TransportPlugin


class Pigeon:
    name = "pigeon"
    recovers_by_key = True

    def __init__(self, context):
        context.reject_unknown({"loft"})
        self.loft = context.option("loft", "north", str)

    def submit(self, message, attempt_key):
        return ProviderStatus("pg-" + attempt_key, "landed", Status.DELIVERED)

    def status(self, message_id):
        return ProviderStatus(message_id, "landed", Status.DELIVERED)

    def close(self):
        pass


PLUGIN = TransportPlugin(
    name="pigeon",
    channels=frozenset({"sms"}),
    create=Pigeon,
    vocabulary=StatusVocabulary(
        "pigeon",
        frozenset({"landed", "lost"}),
        lambda raw: {"landed": Status.DELIVERED, "lost": Status.FAILED}.get(raw, Status.UNKNOWN),
    ),
)
"""


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package installed the usual way: a module and a dist-info with entry_points.txt."""
    (tmp_path / "resetctl_pigeon.py").write_text(PLUGIN_MODULE, encoding="utf-8")
    dist = tmp_path / "resetctl_pigeon-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: resetctl-pigeon\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """
            [resetctl.transports]
            pigeon = resetctl_pigeon:PLUGIN
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.usefixtures("installed_plugin")
def test_an_installed_plugin_is_configured_like_a_built_in(store: Store) -> None:
    """[transport] sms = "pigeon" builds the plugin with its own [pigeon] table."""
    settings = make_settings(transport={"sms": "pigeon"}, pigeon={"loft": "south"})
    transports = build_transports(settings, store, FakeClock())
    assert transports["sms"].name == "pigeon"
    assert transports["sms"].loft == "south"  # type: ignore[attr-defined]
    vocabulary = status_vocabulary("pigeon")
    assert vocabulary is not None
    assert vocabulary.normalize("lost").value == "failed"


@pytest.mark.usefixtures("installed_plugin")
def test_a_plugin_cannot_serve_a_channel_it_does_not_declare(store: Store) -> None:
    """A plugin for SMS configured for email is refused before anything runs."""
    settings = make_settings(transport={"email": "pigeon"})
    with pytest.raises(ConfigError, match=r"transport\.email: pigeon cannot send email"):
        build_transports(settings, store, FakeClock())


def test_unknown_transport_names_are_refused_at_load() -> None:
    """A transport nobody installed is a configuration error naming the key."""
    assert plugin("no-such-transport") is None
    with pytest.raises(ConfigError, match=r"^transport\.sms: unknown transport"):
        make_settings(transport={"sms": "no-such-transport"})
