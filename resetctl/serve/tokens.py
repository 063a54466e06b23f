"""The bearer tokens ``resetctl serve`` accepts, from the file ``[serve] tokens_file`` names.

The file is TOML, one table per token, private to its owner (0600, as ssh wants a key):

    [tokens.rails-app]
    token = "…"                       # python -c 'import secrets; print(secrets.token_urlsafe(32))'
    scopes = ["enqueue"]

A token's name is what the audit log shows; the token itself is kept only as its SHA-256
digest, compared in constant time against every token (which one matched takes no longer
to find than a miss), and never logged, answered or put in an error.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from resetctl.config import Settings
from resetctl.errors import ConfigError, label

#: What a token may let its holder do: enqueue notices, read them (the API, the page,
#: health and metrics), cancel them.
SCOPES = ("enqueue", "read", "cancel")
#: The shortest token accepted: ``secrets.token_urlsafe(32)`` gives 43 characters.
MIN_TOKEN_CHARS = 32
#: Characters a token may hold (RFC 6750's b64token): it travels in a header as is.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
#: A token's name, as the audit log shows it.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_WHERE = "serve.tokens_file"


@dataclass(frozen=True, slots=True)
class Token:
    """One caller: its name (for the audit log), its scopes, its token's digest."""

    name: str
    scopes: frozenset[str]
    digest: bytes


class Tokens:
    """The accepted tokens; :meth:`find` names the one a request presented."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: Sequence[Token]) -> None:
        self._tokens = tuple(tokens)

    @property
    def names(self) -> list[str]:
        """Each token's name, in the file's order."""
        return [token.name for token in self._tokens]

    def find(self, presented: str) -> Token | None:
        """The token ``presented`` is, or None. Every token is compared, each in constant
        time over digests of one length, so the time taken says nothing of which one
        matched or how much of it."""
        digest = _digest(presented)
        found = None
        for token in self._tokens:
            if hmac.compare_digest(token.digest, digest):
                found = token
        return found


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def tokens_path(settings: Settings) -> Path:
    """Where ``[serve] tokens_file`` points: relative to the config file's directory (or,
    with none, the working directory). ConfigError when the config names none."""
    if not settings.serve_tokens_file:
        raise ConfigError(
            "serve: set [serve] tokens_file in the config: the TOML file of the bearer"
            " tokens that may call it (0600)"
        )
    named = Path(settings.serve_tokens_file).expanduser()
    return Path(settings.config_path).parent / named if settings.config_path else named


def load_tokens(path: Path) -> Tokens:
    """Read and check the tokens file. ConfigError, never quoting a token, when it cannot
    be read, is a link or not a regular file, group or others may access it, or a table
    is wrong (a short token, an unknown scope, one token under two names)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{_WHERE}: {path}: cannot read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        # The mode of the file read, not of a name someone may swap in between.
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{_WHERE}: {path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{_WHERE}: {path} is accessible by group or others (mode {mode:04o});"
                f" run chmod 600 {path}"
            )
        raw = file.read(1024 * 1024 + 1)
    if len(raw) > 1024 * 1024:
        raise ConfigError(f"{_WHERE}: {path}: larger than 1 MiB")
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{_WHERE}: {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:  # its message gives a line and column, no text
        raise ConfigError(f"{_WHERE}: {path}: {exc}") from None
    return Tokens(_tokens(document, path))


def _tokens(document: Mapping[str, object], path: Path) -> list[Token]:
    where = f"{_WHERE} {path}"
    unknown = [key for key in document if key != "tokens"]
    if unknown:
        raise ConfigError(f"{where}: {label(unknown[0])}: unknown key (expected [tokens.<name>])")
    tables = document.get("tokens", {})
    if not isinstance(tables, Mapping) or not tables:
        raise ConfigError(f"{where}: no token: add a [tokens.<name>] table")
    found: list[Token] = []
    for name, table in tables.items():
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: tokens.{label(name)}: a name of letters, digits, _ . -")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: tokens.{name}: expected a table")
        for key in table:
            if key not in ("token", "scopes"):
                raise ConfigError(f"{where}: tokens.{name}.{label(key)}: unknown key")
        token = table.get("token")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise ConfigError(
                f"{where}: tokens.{name}.token: expected letters, digits and -._~+/ (a"
                " header carries it as is)"
            )
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{where}: tokens.{name}.token: at least {MIN_TOKEN_CHARS} characters"
                " (secrets.token_urlsafe(32) makes one)"
            )
        scopes = table.get("scopes")
        if (
            not isinstance(scopes, list)
            or not scopes
            or not all(isinstance(s, str) and s in SCOPES for s in scopes)
        ):
            raise ConfigError(
                f"{where}: tokens.{name}.scopes: expected a list of {', '.join(SCOPES)}"
            )
        digest = _digest(token)
        twin = [t.name for t in found if hmac.compare_digest(t.digest, digest)]
        if twin:
            raise ConfigError(f"{where}: tokens.{name}.token: the same token as tokens.{twin[0]}")
        found.append(Token(name, frozenset(scopes), digest))
    return found
