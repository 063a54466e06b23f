"""The idle cron tick answers before the command-line stack loads, and says the same thing
the full sweep would; anything it is unsure of goes to the full command line."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl

from resetctl.enqueue import enqueue
from resetctl.store import Store
from resetctl.tick import idle_tick


@pytest.fixture
def idle_db(tmp_path: Path) -> Path:
    path = tmp_path / "resetctl.db"
    with Store(path):
        pass
    return path


def _tick(argv: list[str], env: dict[str, str] | None = None) -> tuple[int | None, str]:
    out = io.StringIO()
    return idle_tick(argv, env or {}, out), out.getvalue()


def test_an_idle_tick_records_the_sweep_and_prints_the_summary(idle_db: Path) -> None:
    """Nothing due: exit 0, the summary line with its time, the sweep recorded for alerts."""
    code, out = _tick(["sweep", "--db", str(idle_db), "--json"])

    assert code == 0
    summary = json.loads(out)
    assert summary["claimed"] == 0
    assert summary["at"].endswith("Z")
    with Store(idle_db) as store:
        last = store.last_sweep()
    assert last is not None


def test_the_tick_and_the_full_sweep_print_the_same_shape(idle_db: Path) -> None:
    """The fast path's JSON summary has exactly the keys of the full command line's."""
    _, fast = _tick(["sweep", "--db", str(idle_db), "--json"])
    from typer.testing import CliRunner

    from resetctl.cli import app

    full = CliRunner().invoke(app, ["sweep", "--db", str(idle_db), "--json"])
    assert full.exit_code == 0, full.output
    assert json.loads(fast).keys() == json.loads(full.stdout).keys()


def test_due_work_goes_to_the_full_sweep(idle_db: Path) -> None:
    """A notice due now is never answered by the tick."""
    with Store(idle_db) as store:
        enqueue(store, make_settings(), [reset_request()], FakeClock()())
    assert _tick(["sweep", "--db", str(idle_db)])[0] is None


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--max-runtime", "55s"],
        ["sweep", "--unknown"],
        ["--help"],
        ["inspect", "ntc_1"],
        ["sweep", "--db"],
    ],
)
def test_anything_else_goes_to_the_full_command_line(idle_db: Path, argv: list[str]) -> None:
    """Options the tick does not know, other commands and --max-runtime are not its own."""
    assert _tick([*argv, "--db", str(idle_db)] if argv[-1] != "--db" else argv)[0] is None


def test_a_missing_or_shared_database_goes_to_the_full_command_line(
    idle_db: Path, tmp_path: Path
) -> None:
    """The full path reports a missing file and warns about a shared one."""
    assert _tick(["sweep", "--db", str(tmp_path / "missing.db")])[0] is None
    idle_db.chmod(0o644)
    assert _tick(["sweep", "--db", str(idle_db)])[0] is None


def test_a_bad_config_is_reported_by_the_full_command_line(idle_db: Path, tmp_path: Path) -> None:
    """An idle tick never hides a broken config: exit 2 with the key named."""
    config = tmp_path / "bad.toml"
    config.write_text("[policy.default]\nttl = 'soon'\n", encoding="utf-8")

    done = resetctl("sweep", "--config", str(config), db=idle_db)

    assert done.returncode == 2
    assert "policy.default.ttl" in done.stderr


def test_the_console_script_answers_an_idle_tick_without_the_cli_stack(idle_db: Path) -> None:
    """`python -m resetctl sweep` with nothing due never imports typer or rich."""
    probe = (
        "import runpy, sys; sys.argv = ['resetctl', 'sweep', '--db', sys.argv[1]];"
        "\ntry:\n    runpy.run_module('resetctl', run_name='__main__')"
        "\nexcept SystemExit as exit:\n    assert exit.code == 0, exit.code"
        "\nassert 'typer' not in sys.modules and 'rich' not in sys.modules, 'cli loaded'"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(idle_db)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "claimed 0" in done.stdout
