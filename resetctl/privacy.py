"""Files that hold secrets: private modes, and the key of recipient hashes.

The database holds reset links until a notice ends, credentials files hold provider
tokens, and the hash key is what keeps a recipient hash from being tested against a
guessed address. All of them are private to their owner (0600). The hash key lives
outside the database, so a copy of the database (or a backup) cannot link a hash to
an address.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from resetctl.config import Settings
from resetctl.errors import ConfigError

LOGGER = logging.getLogger("resetctl")

#: Environment variable holding the hash key itself (it wins over any key file).
HASH_KEY_ENV = "RESETCTL_HASH_KEY"
#: The key file's name when the config does not name one: beside the config file, or
#: (with no config file) beside the database.
DEFAULT_KEY_NAME = "hash.key"

#: Permission bits that let anyone but the owner in (ssh's rule for private keys).
_NOT_OWNER = stat.S_IRWXG | stat.S_IRWXO
_warned: set[str] = set()


def create_private(path: Path) -> bool:
    """Create ``path`` empty with mode 0600 unless it exists; True when created.

    The mode is set at creation (never a window where the file is readable) and the
    process umask can only make it stricter.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def loose_mode(path: Path) -> int | None:
    """The file's permission bits when group or others may access it, else None."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    return mode if mode & _NOT_OWNER else None


def require_private(path: Path, key: str) -> None:
    """Refuse a secrets file that group or others may access, as ssh refuses keys."""
    mode = loose_mode(path)
    if mode is not None:
        raise ConfigError(
            f"{key}: {path} is accessible by group or others (mode {mode:04o});"
            f" run chmod 600 {path}"
        )


def warn_if_shared(path: Path) -> None:
    """Warn once per process when a database (or its -wal/-shm) is readable by others."""
    if str(path) in _warned:
        return
    loose = {
        candidate.name: mode
        for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-shm"))
        if (mode := loose_mode(candidate)) is not None
    }
    if not loose:
        return
    _warned.add(str(path))
    modes = ", ".join(f"{name} {mode:04o}" for name, mode in loose.items())
    LOGGER.warning(
        "database %s is readable by group or others (%s): it holds reset links;"
        " run chmod 600 on the database and its -wal and -shm files",
        path,
        modes,
    )


def _create_key(path: Path) -> bool:
    """Write a new key beside ``path`` and link it into place: a concurrent reader sees
    no file or a whole key, and of two racing creators exactly one wins."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    create_private(partial)
    try:
        partial.write_text(secrets.token_hex(32) + "\n", encoding="ascii")
        os.link(partial, path)
    except FileExistsError:
        return False
    finally:
        partial.unlink(missing_ok=True)
    return True


def hash_key_path(settings: Settings, db_path: str | Path) -> Path:
    """Where the hash key file is: ``[privacy] hash_key_file`` (relative to the config
    file), else ``hash.key`` beside the config file, else beside the database."""
    if settings.config_path:
        base = Path(settings.config_path).parent
    elif str(db_path).startswith(("postgresql:", "postgres:")):
        # A database server has no "beside": and every host must hash with the same key.
        raise ConfigError(
            "privacy.hash_key_file: a PostgreSQL database keeps no key beside it; set"
            f" {HASH_KEY_ENV} or [privacy] hash_key_file in the config (the same key on every host)"
        )
    else:
        base = Path(db_path).parent
    if settings.hash_key_file:
        return base / Path(settings.hash_key_file).expanduser()
    return base / DEFAULT_KEY_NAME


def hash_key(
    settings: Settings, db_path: str | Path, environ: Mapping[str, str] | None = None
) -> bytes:
    """The key of recipient hashes: ``RESETCTL_HASH_KEY``, else the key file.

    A missing key file is created (0600, 32 random bytes as hex) on first use; an
    existing one that group or others may read is refused.
    """
    env = os.environ if environ is None else environ
    value = env.get(HASH_KEY_ENV)
    if value:
        return value.encode()
    path = hash_key_path(settings, db_path)
    where = "privacy.hash_key_file"
    try:
        if not path.exists() and _create_key(path):
            LOGGER.debug("created the recipient hash key %s", path)
        require_private(path, where)
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{where}: {path}: cannot read or create ({exc.strerror})") from None
    if len(key) < 16:
        raise ConfigError(f"{where}: {path}: too short to be a key (32 random bytes expected)")
    return key
