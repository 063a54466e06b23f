"""``[rollout]`` in the config (issue 26, item 5): mode and percent are checked when the
settings are read, every error names its key, and from a file the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings, reset_request, resetctl

from resetctl.config import Rollout, RolloutMode, load_settings
from resetctl.errors import ConfigError


def test_without_a_rollout_table_every_notice_is_live_and_taken() -> None:
    """No [rollout]: mode live, percent 100 (what resetctl always did)."""
    assert make_settings().rollout == Rollout(RolloutMode.LIVE, 100.0)


def test_mode_and_percent_are_read() -> None:
    """mode = "shadow" and a whole or fractional percent are taken as given."""
    assert make_settings(rollout={"mode": "shadow", "percent": 2.5}).rollout == Rollout(
        RolloutMode.SHADOW, 2.5
    )
    assert make_settings(rollout={"percent": 0}).rollout.percent == 0.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"mode": "dark"}, 'rollout.mode: must be "live" or "shadow"'),
        ({"mode": 1}, 'rollout.mode: must be "live" or "shadow"'),
        ({"percent": 101}, "rollout.percent: expected a number from 0 to 100"),
        ({"percent": -1}, "rollout.percent: expected a number from 0 to 100"),
        ({"percent": True}, "rollout.percent: expected a number from 0 to 100"),
        ({"percent": "10%"}, "rollout.percent: expected a number from 0 to 100"),
        ({"percent": float("nan")}, "rollout.percent: expected a number from 0 to 100"),
        ({"channels": ["email"]}, "rollout.channels: unknown key"),
    ],
)
def test_a_bad_value_names_its_key(table: dict[str, Any], message: str) -> None:
    """Each wrong value or unknown key is refused naming rollout.<key>."""
    with pytest.raises(ConfigError) as refused:
        make_settings(rollout=table)
    assert str(refused.value).startswith(message)


def test_rollout_must_be_a_table() -> None:
    """rollout = "shadow" (not a table) is refused, saying what is expected."""
    with pytest.raises(ConfigError, match=r"^rollout: expected a table such as \[rollout\]"):
        make_settings(rollout="shadow")


def test_an_error_in_a_file_names_the_file_and_the_line(tmp_path: Path) -> None:
    """From a file, the error names the file, the line of the key, and the key."""
    config = tmp_path / "resetctl.toml"
    config.write_text(
        '[policy.default]\nttl = "10m"\n\n[rollout]\npercent = 5\nmode = "shadwo"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(config)
    assert str(refused.value) == (
        f'config {config}, line 6: rollout.mode: must be "live" or "shadow"'
    )


def test_the_command_line_refuses_a_bad_mode_and_writes_nothing(tmp_path: Path) -> None:
    """``enqueue`` with a bad [rollout] exits 2 with the file, line and key, and creates
    no database."""
    config = tmp_path / "resetctl.toml"
    config.write_text("[rollout]\npercent = 150\n", encoding="utf-8")
    db = tmp_path / "resetctl.db"
    done = resetctl(
        "enqueue", "--config", str(config), db=db, input=json.dumps(reset_request()) + "\n"
    )
    assert done.returncode == 2
    assert f"config {config}, line 2: rollout.percent: expected a number" in done.stderr
    assert not db.exists()
