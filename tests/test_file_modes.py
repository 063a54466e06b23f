"""Files that hold secrets are private to their owner (0600) from the moment they exist."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep

from resetctl import ops, privacy
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.transports import transport_secrets


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _private_files(db_path: Path) -> dict[str, int]:
    found = {
        path.name: _mode(path)
        for path in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm"))
        if path.exists()
    }
    found["hash.key"] = _mode(privacy.default_key_path())
    return found


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_database_wal_shm_and_key_are_0600_after_enqueue_sweep_and_purge(
    tmp_path: Path, umask: int
) -> None:
    """Whatever the umask, the database, its -wal/-shm and the key file stay 0600."""
    import os

    db_path = tmp_path / "resetctl.db"
    old = os.umask(umask)
    try:
        settings = make_settings()
        with Store(db_path) as store:
            enqueue(store, settings, [reset_request(ttl="10m")], T0)
            after_enqueue = _private_files(db_path)
            run_sweep(store, settings, FakeClock(T0))
            after_sweep = _private_files(db_path)
            ops.purge(store, 1.0, T0 + 86400)
            after_purge = _private_files(db_path)
    finally:
        os.umask(old)
    expected = {"resetctl.db": 0o600, "resetctl.db-wal": 0o600, "resetctl.db-shm": 0o600}
    for files in (after_enqueue, after_sweep, after_purge):
        assert files == {**expected, "hash.key": 0o600}


def test_a_database_others_can_read_warns_once(tmp_path: Path) -> None:
    """Opening a group- or world-readable database logs one warning naming it, once."""
    db_path = tmp_path / "shared.db"
    Store(db_path).close()
    db_path.chmod(0o644)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("resetctl")
    logger.addHandler(handler)
    try:
        Store(db_path).close()
        Store(db_path).close()
    finally:
        logger.removeHandler(handler)
    warnings = [r.getMessage() for r in records if str(db_path) in r.getMessage()]
    assert len(warnings) == 1
    assert "shared.db 0644" in warnings[0]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_credentials_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    """A credentials file readable by group or others is refused, naming the key."""
    credentials = tmp_path / "twilio.toml"
    credentials.write_text('TWILIO_AUTH_TOKEN = "tok_secret_value"\n')
    credentials.chmod(mode)
    with pytest.raises(ConfigError) as raised:
        transport_secrets("twilio", {"credentials_file": str(credentials)}, {})
    message = str(raised.value)
    assert message.startswith("twilio.credentials_file: ")
    assert f"{mode:04o}" in message
    assert "tok_secret_value" not in message


def test_private_credentials_file_is_read(tmp_path: Path) -> None:
    """A 0600 credentials file supplies its secrets."""
    credentials = tmp_path / "twilio.toml"
    credentials.write_text('TWILIO_AUTH_TOKEN = "tok"\n')
    credentials.chmod(0o600)
    secret = transport_secrets("twilio", {"credentials_file": str(credentials)}, {})
    assert secret("TWILIO_AUTH_TOKEN") == "tok"


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    """The hash key file is a secret too: readable by others, it is refused."""
    key = tmp_path / "hash.key"
    key.write_text("0" * 64 + "\n")
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^privacy\.hash_key_file: .*0644"):
        privacy.hash_key(
            make_settings(), tmp_path / "r.db", environ={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
        )
