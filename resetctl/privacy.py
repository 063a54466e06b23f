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
#: (with no config file) in the user's configuration directory, never beside the database.
DEFAULT_KEY_NAME = "hash.key"
#: The shortest key accepted, from the environment or a file: 16 bytes (a key made here
#: is 32 random bytes, written as 64 hex digits).
MIN_KEY_BYTES = 16

#: Permission bits that let anyone but the owner in (ssh's rule for private keys).
_NOT_OWNER = stat.S_IRWXG | stat.S_IRWXO
_warned: set[str] = set()


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
    no file or a whole key, and of two racing creators exactly one wins. The key is
    written through the descriptor that created its file (0600 whatever the umask)."""
    from resetctl.files import PRIVATE_DIR, PRIVATE_FILE, make_directories

    make_directories(path.parent, PRIVATE_DIR)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(partial, flags, PRIVATE_FILE), "w", encoding="ascii") as file:
        os.fchmod(file.fileno(), PRIVATE_FILE)
        file.write(secrets.token_hex(32) + "\n")
    try:
        os.link(partial, path)
    except FileExistsError:
        return False
    finally:
        partial.unlink(missing_ok=True)
    return True


def default_key_path(environ: Mapping[str, str] | None = None) -> Path:
    """The key file with no config file: ``$XDG_CONFIG_HOME/resetctl/hash.key`` (by
    default ``~/.config/resetctl/hash.key``), the user's own configuration, never the
    database's directory, so a copy of that directory cannot test an address."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "")
    if os.path.isabs(base):
        return Path(base) / "resetctl" / DEFAULT_KEY_NAME
    try:
        home = Path.home()
    except RuntimeError:  # no HOME and no account entry (a bare container)
        raise ConfigError(
            f"privacy.hash_key_file: no home directory to keep the key in; set {HASH_KEY_ENV}"
            " or name [privacy] hash_key_file in a config file"
        ) from None
    return home / ".config" / "resetctl" / DEFAULT_KEY_NAME


def hash_key_path(
    settings: Settings, db_path: str | Path, environ: Mapping[str, str] | None = None
) -> Path:
    """Where the hash key file is: ``[privacy] hash_key_file`` (relative to the config
    file, or with none to the working directory), else ``hash.key`` beside the config
    file, else :func:`default_key_path`."""
    on_server = str(db_path).startswith(("postgresql:", "postgres:"))
    if on_server and not settings.config_path and not settings.hash_key_file:
        # Every host must hash with the same key: a key made on each would differ.
        raise ConfigError(
            "privacy.hash_key_file: a PostgreSQL database needs its key named; set"
            f" {HASH_KEY_ENV} or [privacy] hash_key_file in the config (the same key on every host)"
        )
    if settings.hash_key_file:
        named = Path(settings.hash_key_file).expanduser()
        return Path(settings.config_path).parent / named if settings.config_path else named
    if settings.config_path:
        return Path(settings.config_path).parent / DEFAULT_KEY_NAME
    return default_key_path(environ)


def _legacy_key(settings: Settings, db_path: str | Path, environ: Mapping[str, str]) -> Path | None:
    """A key an older resetctl wrote beside the database (no config file, no key named),
    if there is one: still read, so its hashes keep matching, with a warning to move it."""
    if settings.config_path or settings.hash_key_file or str(db_path).startswith("postgres"):
        return None
    legacy = Path(db_path).parent / DEFAULT_KEY_NAME
    if not legacy.is_file():
        return None
    if str(legacy) not in _warned:
        _warned.add(str(legacy))
        LOGGER.warning(
            "the recipient hash key %s sits beside the database, where a copy of the"
            " directory takes it along: move it to %s, or name it in [privacy] hash_key_file",
            legacy,
            default_key_path(environ),
        )
    return legacy


def hash_key(
    settings: Settings, db_path: str | Path, environ: Mapping[str, str] | None = None
) -> bytes:
    """The key of recipient hashes: ``RESETCTL_HASH_KEY``, else the key file.

    Either must hold at least MIN_KEY_BYTES. A missing key file is created (0600 in a
    0700 directory it makes, 32 random bytes as hex) on first use; an existing one that
    group or others may read is refused.
    """
    env = os.environ if environ is None else environ
    value = env.get(HASH_KEY_ENV)
    if value:
        if len(value.encode()) < MIN_KEY_BYTES:
            raise ConfigError(
                f"{HASH_KEY_ENV}: too short to be a key (at least {MIN_KEY_BYTES} bytes;"
                " 32 random bytes as hex expected)"
            )
        return value.encode()
    path = hash_key_path(settings, db_path, env)
    where = "privacy.hash_key_file"
    try:
        if not path.exists():
            legacy = _legacy_key(settings, db_path, env)
            if legacy is not None:
                path = legacy
            elif _create_key(path):
                LOGGER.debug("created the recipient hash key %s", path)
        require_private(path, where)
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{where}: {path}: cannot read or create ({exc.strerror})") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{where}: {path}: too short to be a key (32 random bytes expected)")
    return key
