"""`demo` never touches a database that holds notices: its clock is simulated."""

from __future__ import annotations

import re
from pathlib import Path

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
