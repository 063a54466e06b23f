"""`demo` never touches a database that holds notices (its clock is simulated), and the
command it suggests at the end runs as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import T0, make_settings, reset_request, resetctl

from resetctl.enqueue import enqueue
from resetctl.store import Store


def test_demo_refuses_a_database_with_notices(tmp_path: Path) -> None:
    """--db naming a live database exits 2, and its notices are untouched."""
    db_path = tmp_path / "live.db"
    with Store(db_path) as store:
        enqueue(store, make_settings(), [reset_request()], T0)
        before = store.all_events()
    done = resetctl("demo", "--db", str(db_path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"error: --db {db_path}: holds 1 notice(s);")
    with Store(db_path) as store:
        assert store.all_events() == before
        assert store.phase_counts() == {"queued": 1}


def test_demo_without_db_uses_a_fresh_file_and_ignores_resetctl_db(tmp_path: Path) -> None:
    """Without --db, RESETCTL_DB is not used: the demo writes a new temporary file."""
    live = tmp_path / "live.db"
    with Store(live) as store:
        enqueue(store, make_settings(), [reset_request()], T0)
    done = resetctl("demo", db=live)
    assert done.returncode == 0, done.stderr
    (shown,) = re.findall(r"^database: (.+)$", done.stdout, flags=re.MULTILINE)
    assert Path(shown) != live
    assert Path(shown).is_file()
    with Store(live) as store:
        assert store.phase_counts() == {"queued": 1}


def _shell_env(path_dirs: list[str]) -> dict[str, str]:
    """This environment with PATH set to ``path_dirs`` and no RESETCTL_ setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    return {**env, "PATH": os.pathsep.join(path_dirs)}


VENV_BIN = str(Path(sys.executable).parent)
#: A shell whose PATH lacks the virtual environment (one that was never activated).
BARE_PATH = ["/usr/bin", "/bin"]


@pytest.mark.parametrize(
    ("start", "path_dirs"),
    [
        pytest.param(f"{VENV_BIN}/resetctl", BARE_PATH, id="the venv's resetctl, not on PATH"),
        pytest.param(f"{sys.executable} -m resetctl", BARE_PATH, id="python -m resetctl"),
        pytest.param("resetctl", [VENV_BIN, *BARE_PATH], id="resetctl on PATH"),
    ],
)
def test_the_suggested_inspect_runs_as_printed(
    tmp_path: Path, start: str, path_dirs: list[str]
) -> None:
    """The demo's closing `try:` command, pasted into the same shell, inspects the notice,
    however the demo was started and whether or not the venv is on PATH."""
    env = _shell_env(path_dirs)
    db_path = tmp_path / "demo db" / "demo.db"
    db_path.parent.mkdir()
    done = subprocess.run(
        ["/bin/sh", "-c", f"{start} demo --db '{db_path}'"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (suggested,) = re.findall(r"^try: (.+)$", done.stdout, flags=re.MULTILINE)
    if start == "resetctl":
        assert suggested.startswith("resetctl inspect "), "the short name, when it is this one"
    pasted = subprocess.run(
        ["/bin/sh", "-c", suggested], capture_output=True, text=True, env=env, timeout=120
    )
    assert pasted.returncode == 0, pasted.stderr
    notice_id = suggested.split()[-1]
    assert pasted.stdout.startswith(f"{notice_id}  phase accepted")
