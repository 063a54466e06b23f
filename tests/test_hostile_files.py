"""Files under hostile input (issue 24, item 4), each built the way it broke: a planted
link, an in-memory or ``file:`` database, a umask of 000, a planted ``.partial`` link
beside an export, a 1-byte key in the environment, templates anyone may edit."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, make_settings, reset_request, resetctl

import resetctl as rc
from resetctl import api, files, privacy
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError, StoreError
from resetctl.store import Store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _jsonl(*requests: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """This process's umask (children started inside inherit it)."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def _notices(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT count(*) FROM notices").fetchone()
    return int(count)


# -- the database file ---------------------------------------------------------------------


def test_a_planted_dangling_database_link_is_refused_and_nothing_lands_where_it_points(
    tmp_path: Path,
) -> None:
    """A `resetctl.db` symlink to a missing file: enqueue exits 1 naming the link, and
    SQLite creates nothing at the target (it used to, 0644)."""
    target = tmp_path / "elsewhere" / "loot.db"
    target.parent.mkdir()
    db = tmp_path / "resetctl.db"
    db.symlink_to(target)
    done = resetctl("enqueue", db=db, input=_jsonl(reset_request()))
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "is a symbolic link" in done.stderr
    assert list(target.parent.iterdir()) == []


def test_a_link_to_a_real_database_is_refused_by_every_command_the_tick_included(
    tmp_path: Path,
) -> None:
    """A link to an existing database: the idle sweep (the fast path) and a full sweep
    refuse it too, and nothing is written through it."""
    real = tmp_path / "real.db"
    Store(real).close()
    db = tmp_path / "resetctl.db"
    db.symlink_to(real)
    before = real.read_bytes()
    idle = resetctl("sweep", db=db)
    assert idle.returncode == 1, idle.stdout + idle.stderr
    assert "is a symbolic link" in idle.stderr
    assert real.read_bytes() == before
    assert not Path(f"{real}-wal").exists()


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_planted_wal_or_shm_link_is_refused(tmp_path: Path, suffix: str) -> None:
    """A link at the database's -wal or -shm would take reset links wherever it
    points: the store refuses to open, and the target stays absent."""
    db = tmp_path / "resetctl.db"
    Store(db).close()
    target = tmp_path / f"loot{suffix}"
    Path(f"{db}{suffix}").symlink_to(target)
    with pytest.raises(StoreError, match=r"is a symbolic link"):
        Store(db)
    assert not target.exists()


@pytest.mark.parametrize(
    "name", [":memory:", "file:{tmp}/x.db", "FILE:{tmp}/x.db?mode=rwc", "file::memory:"]
)
def test_in_memory_and_file_uri_databases_are_refused(tmp_path: Path, name: str) -> None:
    """`--db :memory:` answered "created": true for a notice that vanished, `--db
    file:x.db` made a 0644 file: both exit 1 with one line, printing no notice and
    creating nothing."""
    db = name.format(tmp=tmp_path)
    done = resetctl("enqueue", "--db", db, input=_jsonl(reset_request()))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert "not a database file" in done.stderr
    assert done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("umask", [0o000, 0o277])
def test_a_new_database_is_exactly_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    """Under umask 000 nothing is loosened; under 0277, which would strip the owner's
    own write bit, the file is still 0600 (fchmod after create) and takes notices."""
    db = tmp_path / "resetctl.db"
    with _umask(umask), Store(db) as store:
        enqueue(store, make_settings(), [reset_request()], T0)
        modes = {p.name: _mode(p) for p in tmp_path.iterdir() if p.name.startswith("resetctl")}
    assert modes == {"resetctl.db": 0o600, "resetctl.db-wal": 0o600, "resetctl.db-shm": 0o600}
    assert _notices(db) == 1


# -- files resetctl writes for others to read ----------------------------------------------


def test_templates_init_under_umask_000_makes_dirs_0755_and_files_0644(tmp_path: Path) -> None:
    """A copy made under umask 000 used to be 0777/0666: anyone could edit the copy."""
    root = tmp_path / "etc" / "templates"
    with _umask(0o000):
        api.init_templates(root)
    made = [root.parent, root, *root.rglob("*")]
    assert {p.relative_to(tmp_path).as_posix(): _mode(p) for p in made if p.is_dir()} == {
        p.relative_to(tmp_path).as_posix(): 0o755 for p in made if p.is_dir()
    }
    copied = [p for p in made if p.is_file()]
    assert copied
    assert {_mode(p) for p in copied} == {0o644}


def test_the_metrics_textfile_is_0644_under_umask_000(tmp_path: Path) -> None:
    """The textfile (and a directory made for it) is readable by node_exporter and
    writable by nobody else, whatever the umask; nothing else is left beside it."""
    db = tmp_path / "resetctl.db"
    Store(db).close()
    textfile = tmp_path / "textfile" / "resetctl.prom"
    with _umask(0o000), rc.open(db, make_settings()) as handle:
        handle.write_metrics(textfile)
        handle.write_metrics(textfile)  # replacing it keeps the mode too
    assert _mode(textfile) == 0o644
    assert _mode(textfile.parent) == 0o755
    assert [p.name for p in textfile.parent.iterdir()] == ["resetctl.prom"]
    assert "resetctl_sweep_lag_seconds" in textfile.read_text()


def test_an_export_never_writes_through_a_planted_partial_link(tmp_path: Path) -> None:
    """`week.jsonl.partial` planted as a link: the export writes a new file of its own
    (0600 under umask 000), renames it into place, and the link's target stays absent."""
    db = tmp_path / "resetctl.db"
    Store(db).close()
    output = tmp_path / "week.jsonl"
    target = tmp_path / "loot.jsonl"
    Path(f"{output}.partial").symlink_to(target)
    with _umask(0o000):
        done = resetctl("export-timings", "--output", str(output), db=db)
    assert done.returncode == 0, done.stderr
    assert not target.exists()
    assert stat.S_ISREG(output.lstat().st_mode)
    assert _mode(output) == 0o600
    assert json.loads(output.read_text().splitlines()[0])["timings"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("week", ".week"))) == [
        "week.jsonl",
        "week.jsonl.partial",
    ]


def test_an_export_into_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    """No traceback: one line naming --output, exit 1."""
    db = tmp_path / "resetctl.db"
    Store(db).close()
    done = resetctl("export-timings", "--output", str(tmp_path / "no" / "week.jsonl"), db=db)
    assert done.returncode == 1
    assert done.stderr.startswith("error: --output: cannot write ")
    assert done.stderr.count("\n") == 1


# -- the hash key ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["Z", "Z" * 15])
def test_a_short_key_in_the_environment_is_refused_as_a_short_file_is(
    tmp_path: Path, key: str
) -> None:
    """A 1-byte RESETCTL_HASH_KEY was accepted: now under 16 bytes it is refused like a
    short key file (exit 2, naming the variable, never its value), and nothing is
    written."""
    db = tmp_path / "r.db"
    done = resetctl("enqueue", db=db, input=_jsonl(reset_request()), env={"RESETCTL_HASH_KEY": key})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: RESETCTL_HASH_KEY: too short to be a key")
    assert key not in done.stderr.replace("RESETCTL_HASH_KEY", "")
    assert not db.exists()
    assert privacy.hash_key(make_settings(), db, {"RESETCTL_HASH_KEY": "Z" * 16}) == b"Z" * 16


def test_with_no_config_the_key_goes_to_the_user_config_dir_not_beside_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No config file, no key named: the key is made in $XDG_CONFIG_HOME/resetctl
    (directory 0700, key 0600, under umask 000), and the database's directory holds
    no key: a copy of it cannot test an address."""
    home = tmp_path / "config-home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    data = tmp_path / "data"
    data.mkdir()
    with _umask(0o000), Store(data / "resetctl.db") as store:
        enqueue(store, make_settings(), [reset_request()], T0)
    key = home / "resetctl" / "hash.key"
    assert (_mode(home), _mode(key.parent), _mode(key)) == (0o700, 0o700, 0o600)
    assert len(key.read_bytes().strip()) == 64
    assert [p.name for p in data.iterdir()] == ["resetctl.db"]


def test_a_key_an_older_resetctl_left_beside_the_database_is_read_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its hashes keep matching across the upgrade, and the operator is told to move it;
    no second key is made."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    legacy = tmp_path / "hash.key"
    legacy.write_text("a" * 64 + "\n")
    legacy.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="resetctl"):
        key = privacy.hash_key(
            make_settings(),
            tmp_path / "resetctl.db",
            environ={"XDG_CONFIG_HOME": str(tmp_path / "config-home")},
        )
    assert key == b"a" * 64
    assert not (tmp_path / "config-home").exists()
    assert any("sits beside the database" in r.getMessage() for r in caplog.records)


def test_with_no_home_to_keep_the_key_in_the_error_says_how_to_name_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No XDG_CONFIG_HOME, no HOME, no account entry: one ConfigError, not a crash."""

    def no_home(cls: type[Path]) -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", classmethod(no_home))
    with pytest.raises(ConfigError, match=r"no home directory .* set RESETCTL_HASH_KEY"):
        privacy.default_key_path({})


# -- templates others can change -------------------------------------------------------------


def _owned_templates(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "templates"
    api.init_templates(root)
    config = tmp_path / "resetctl.toml"
    config.write_text(f'[templates]\ndir = "{root}"\n')
    return root, config


def test_a_world_writable_templates_dir_stops_sweep_and_enqueue_send(tmp_path: Path) -> None:
    """A 0777 version directory (what templates init made under umask 000): a sweep
    with a notice due exits 2 naming it before sending anything, and `enqueue --send`
    exits 2 writing nothing. A plain enqueue renders nothing and still works."""
    root, config = _owned_templates(tmp_path)
    (root / "v1").chmod(0o777)
    db = tmp_path / "resetctl.db"
    queued = resetctl("enqueue", "--config", str(config), db=db, input=_jsonl(reset_request()))
    assert queued.returncode == 0, queued.stderr

    swept = resetctl("sweep", "--config", str(config), db=db)
    assert swept.returncode == 2, swept.stdout + swept.stderr
    assert swept.stderr.count("\n") == 1
    assert f"templates: {root / 'v1'} can be changed by group or others (mode 0777)" in (
        swept.stderr
    )
    with Store(db, must_exist=True) as store:
        assert store.conn.execute("SELECT count(*) FROM attempts").fetchone() == (0,)

    sent = resetctl(
        "enqueue", "--send", "--config", str(config), db=db, input=_jsonl(reset_request())
    )
    assert sent.returncode == 2, sent.stdout + sent.stderr
    assert "can be changed by group or others" in sent.stderr
    assert _notices(db) == 1


def test_a_world_writable_template_file_is_refused_too(tmp_path: Path) -> None:
    """One 0666 file is as good as an open directory to whoever rewrites the link."""
    root, _ = _owned_templates(tmp_path)
    (root / "v1" / "es" / "sms.mustache").chmod(0o666)
    settings = make_settings(templates={"dir": str(root)})
    db = tmp_path / "r.db"
    Store(db).close()
    with (
        rc.open(db, settings) as handle,
        pytest.raises(ConfigError, match=r"es/sms\.mustache can be changed .* \(mode 0666\)"),
    ):
        handle.sweep()


def test_copy_inside_a_directory_anyone_may_write_is_refused_unless_it_is_sticky(
    tmp_path: Path,
) -> None:
    """Whoever may write the directory above the copy can swap the copy for theirs; a
    sticky directory (/tmp's 1777) lets nobody rename what is not theirs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    root = shared / "templates"
    api.init_templates(root)
    shared.chmod(0o777)
    assert files.writable_by_others(root) == [(shared, 0o777)]
    shared.chmod(0o1777)
    assert files.writable_by_others(root) == []


def test_a_copy_another_group_may_write_is_refused(tmp_path: Path) -> None:
    """Group write counts as the owner's only for a group nobody else is in (a user's
    private group, as umask 002 systems make); a group with other members is refused."""
    import grp
    import pwd

    shared = next(
        (
            g
            for g in grp.getgrall()
            if g.gr_gid != os.getegid()
            and (g.gr_mem or any(p.pw_gid == g.gr_gid for p in pwd.getpwall()))
        ),
        None,
    )
    if shared is None or os.geteuid() != 0:
        pytest.skip("needs root and a group with members to hand the file to")
    copy = tmp_path / "sms.mustache"
    copy.write_text("{{reset_url}}")
    copy.chmod(0o664)
    os.chown(copy, -1, shared.gr_gid)
    assert files.writable_by_others(tmp_path) == [(copy, 0o664)]
