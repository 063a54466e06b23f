"""The key of recipient hashes lives outside the database (and, with no config file, outside
its directory: in the user's configuration)."""

from __future__ import annotations

import hashlib
import hmac
import shutil
import stat
from pathlib import Path

import pytest
from conftest import T0, FakeClock, make_settings, reset_request, resetctl, run_sweep

from resetctl import privacy
from resetctl.config import load_settings
from resetctl.enqueue import enqueue, recipient_hash
from resetctl.errors import ConfigError
from resetctl.store import Store

ADDRESSES = [f"person{n}@example.com" for n in range(5)]


def _hashes(db_path: Path) -> list[str]:
    with Store(db_path) as store:
        rows = store.conn.execute("SELECT recipient_hash FROM notices").fetchall()
    return [str(r[0]) for r in rows]


def test_a_copied_database_without_the_key_cannot_reproduce_any_hash(tmp_path: Path) -> None:
    """Everything in a copy of the database, tried as a key, matches no recipient_hash."""
    live = tmp_path / "live"
    live.mkdir()
    with Store(live / "resetctl.db") as store:
        enqueue(store, make_settings(), [reset_request(email=a) for a in ADDRESSES], T0)
    key_file = privacy.default_key_path()
    assert key_file.is_file()
    copy = tmp_path / "stolen" / "resetctl.db"
    copy.parent.mkdir()
    shutil.copy(live / "resetctl.db", copy)
    hashes = set(_hashes(copy))
    assert len(hashes) == len(ADDRESSES)
    with Store(copy) as store:
        candidates = [str(v) for (v,) in store.conn.execute("SELECT value FROM meta")]
    keys = [c.encode() for c in candidates]
    keys += [bytes.fromhex(c) for c in candidates if len(c) % 2 == 0 and c.isalnum()]
    keys += [b""]
    guessed = {
        hmac.new(key, address.encode(), hashlib.sha256).hexdigest()[:24]
        for key in keys
        for address in ADDRESSES
    }
    assert not guessed & hashes
    # With the key file, the same hash is reproduced: it is the key that links.
    key = key_file.read_bytes().strip()
    assert {recipient_hash(key, a) for a in ADDRESSES} == hashes


def test_key_file_is_created_0600_beside_the_config_on_first_use(tmp_path: Path) -> None:
    """With a config file and no key named, hash.key appears beside it, private."""
    config = tmp_path / "etc" / "resetctl.toml"
    config.parent.mkdir()
    config.write_text('support_label = "Acme"\n')
    done = resetctl(
        "enqueue",
        "--config",
        str(config),
        db=tmp_path / "r.db",
        input='{"idempotency_key": "k", "email": "a@example.com", "reset_url": "https://x.example/r"}',
    )
    assert done.returncode == 0, done.stderr
    key = config.parent / "hash.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not (tmp_path / "hash.key").exists()
    assert _hashes(tmp_path / "r.db") == [recipient_hash(key.read_bytes().strip(), "a@example.com")]


def test_privacy_hash_key_file_and_the_older_top_level_key_mean_the_same(tmp_path: Path) -> None:
    """[privacy] hash_key_file and top-level hash_key_file name the same key file."""
    for text in ('[privacy]\nhash_key_file = "keys/k"\n', 'hash_key_file = "keys/k"\n'):
        config = tmp_path / "resetctl.toml"
        config.write_text(text)
        settings = load_settings(config)
        assert privacy.hash_key_path(settings, "/elsewhere/r.db") == tmp_path / "keys" / "k"


def test_both_hash_key_file_keys_at_once_is_a_config_error(tmp_path: Path) -> None:
    """Giving the old and the new key together is refused, naming the old one."""
    config = tmp_path / "resetctl.toml"
    config.write_text('hash_key_file = "a"\n[privacy]\nhash_key_file = "b"\n')
    with pytest.raises(ConfigError, match=r", line 1: hash_key_file: moved to \[privacy\]"):
        load_settings(config)


def test_environment_key_wins_and_no_file_is_created(tmp_path: Path) -> None:
    """RESETCTL_HASH_KEY keys the hashes; no key file is written."""
    key = privacy.hash_key(make_settings(), tmp_path / "r.db", {"RESETCTL_HASH_KEY": "k" * 32})
    assert key == b"k" * 32
    assert not (tmp_path / "hash.key").exists()


def test_a_database_with_salt_keyed_hashes_keeps_working(tmp_path: Path) -> None:
    """Notices hashed with the old in-file salt still sweep; new ones use the key file."""
    db_path = tmp_path / "resetctl.db"
    settings = make_settings()
    with Store(db_path) as store:
        salt = store.salt()
        # What an older resetctl wrote: the hash keyed by the database's own salt.
        enqueue(store, settings, [reset_request(email="old@example.com")], T0, hash_key=salt)
        enqueue(store, settings, [reset_request(email="new@example.com")], T0)
        summary = run_sweep(store, settings, FakeClock(T0))
        assert summary.submitted == 2
    key = privacy.default_key_path().read_bytes().strip()
    assert _hashes(db_path) == [
        recipient_hash(salt, "old@example.com"),
        recipient_hash(key, "new@example.com"),
    ]
