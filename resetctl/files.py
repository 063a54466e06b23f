"""Files and directories resetctl creates: each gets the mode it names, whatever the
process umask (a cron job or a service can run under ``umask 000``), is written whole or
not at all, and never through a link someone else planted.

A mode given to ``open`` or ``mkdir`` only passes through the umask, which can loosen
nothing but can take the owner's own bits away; so every file and directory made here is
``fchmod``-ed (or ``chmod``-ed) to its mode as soon as it exists.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from resetctl.errors import InputError

#: Secrets and what holds them: the database, the hash key, exported timings.
PRIVATE_FILE = 0o600
#: A directory only its owner may enter (the hash key's).
PRIVATE_DIR = 0o700
#: What others must read but nobody else may change: templates, the metrics textfile.
SHARED_FILE = 0o644
#: Directories of shared files.
SHARED_DIR = 0o755


def create_private(path: Path) -> bool:
    """Create ``path`` empty with mode 0600 unless it exists; True when created.

    ``O_EXCL`` with ``O_NOFOLLOW``: a name that exists, a dangling symbolic link
    included, is never written through; the mode is set on the open descriptor, so no
    umask can loosen or narrow it.
    """
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, PRIVATE_FILE)
    finally:
        os.close(fd)
    return True


def make_directories(path: Path, mode: int) -> None:
    """Create ``path`` and any missing parents, each new one with ``mode`` exactly;
    directories that exist are left as they are."""
    missing = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # made meanwhile by another process: its mode is its own
        directory.chmod(mode)


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` whole: into a new file of its own beside it (mkstemp:
    a random name, created exclusively, so nothing planted is written through), with
    ``mode``, flushed to disk, then renamed over ``path`` (a reader sees the old file
    or the new one; a symbolic link at ``path`` is replaced, never followed)."""
    import tempfile

    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def copy_tree(source: Path, destination: Path, dir_mode: int, file_mode: int) -> None:
    """Copy the directory ``source`` to ``destination`` (which must not exist): its
    directories with ``dir_mode``, its regular files with ``file_mode``, whatever modes
    the source has; anything else in it (a link, a socket) is skipped."""
    destination.mkdir()
    destination.chmod(dir_mode)
    for entry in sorted(source.iterdir()):
        target = destination / entry.name
        if entry.is_symlink():
            continue
        if entry.is_dir():
            copy_tree(entry, target, dir_mode, file_mode)
        elif entry.is_file():
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(target, flags, file_mode)
            with os.fdopen(fd, "wb") as file:
                os.fchmod(file.fileno(), file_mode)
                file.write(entry.read_bytes())


def writable_by_others(root: Path) -> list[tuple[Path, int]]:
    """What under ``root`` (itself included) or above it someone besides its owner can
    change: (path, permission bits) for each directory or file that group or others may
    write. A directory above ``root`` with the sticky bit (``/tmp``) is safe: others
    cannot rename or remove what they do not own in it. A group holding only the owner
    (a user's private group, as ``umask 002`` systems make) counts as the owner, as in
    Debian's OpenSSH."""
    found: list[tuple[Path, int]] = []
    resolved = root.resolve()
    for above in resolved.parents:
        info = above.stat()
        if info.st_mode & stat.S_ISVTX:
            continue
        if _others_may_write(info):
            found.append((above, stat.S_IMODE(info.st_mode)))
    for directory, dirs, files in os.walk(resolved):
        for name in (None, *dirs, *files):
            path = Path(directory) if name is None else Path(directory) / name
            try:
                info = path.stat()
            except OSError:
                continue  # a dangling link renders nothing; the check says it is missing
            if _others_may_write(info):
                found.append((path, stat.S_IMODE(info.st_mode)))
    return found


def _others_may_write(info: os.stat_result) -> bool:
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _private_group(info)


def _private_group(info: os.stat_result) -> bool:
    """True when the file's group has one member, its owner: no other account has it
    as its primary group or lists it as a supplementary one."""
    import grp
    import pwd

    try:
        group = grp.getgrgid(info.st_gid)
        owner = pwd.getpwuid(info.st_uid)
    except KeyError:
        return False
    if any(member != owner.pw_name for member in group.gr_mem):
        return False
    primary = [account.pw_uid for account in pwd.getpwall() if account.pw_gid == group.gr_gid]
    return primary == [owner.pw_uid] or (not primary and group.gr_mem == [owner.pw_name])


def bounded_lines(stream: BinaryIO, limit: int) -> Iterator[str]:
    """The lines of a byte stream as UTF-8 text, split at ``\n`` only (a U+2028 or U+0085
    is text, not a line end), each at most ``limit`` bytes. InputError naming the line
    otherwise, having read no more than one byte past it: ``/dev/zero`` or a 1 GB line is
    refused, not loaded."""
    number = 0
    while raw := stream.readline(limit + 1):
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise InputError([f"line {number}: (line): longer than {limit} bytes"])
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError([f"line {number}: (line): not UTF-8 text"]) from None
