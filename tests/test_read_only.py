"""Commands that read never create a database: a typo'd path is an error, not a new file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from resetctl.cli import app

READERS = [
    ["inspect", "ntc_0000000000000000"],
    ["health"],
    ["health", "--storage"],
    ["alerts"],
    ["metrics", "--textfile", "{tmp}/m.prom"],
    ["export-timings"],
    ["outbox", "list"],
    ["outbox", "show", "obx_0000000000000000"],
    ["outbox", "set-status", "obx_0000000000000000", "failed"],
    ["purge"],
]


@pytest.mark.parametrize("args", READERS, ids=lambda a: " ".join(a[:2]))
def test_a_missing_database_is_one_line_naming_it_and_nothing_is_created(
    tmp_path: Path, args: list[str]
) -> None:
    """No reading command creates the file (or its -wal/-shm); one line names the path."""
    db_path = tmp_path / "typo.db"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(app, [*argv, "--db", str(db_path)], env={"RESETCTL_DB": ""})
    expected_exit = 3 if args[0] == "alerts" else 1
    assert result.exit_code == expected_exit, result.output
    text = (result.stderr or result.stdout).strip()
    assert len(text.splitlines()) == 1
    assert str(db_path) in text
    assert "no such file" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_directory_where_the_database_should_be_is_not_a_database(tmp_path: Path) -> None:
    """A directory named as the database is refused without creating anything in it."""
    result = CliRunner().invoke(app, ["health", "--db", str(tmp_path)])
    assert result.exit_code == 1
    assert list(tmp_path.iterdir()) == []
