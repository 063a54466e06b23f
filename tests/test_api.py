"""resetctl.open: the handle applications and the CLI share."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import T0, FakeClock, make_settings, reset_request

import resetctl
from resetctl.report import iso


def test_a_handle_enqueues_inspects_sweeps_and_reports_at_its_clock(
    db_path: Path, clock: FakeClock
) -> None:
    """The injected clock is `now` for every call: created, swept and counted at T0."""
    with resetctl.open(db_path, make_settings(), clock=clock, sleep=clock.sleep) as handle:
        [result] = handle.enqueue([reset_request()])
        assert (result.created, result.submitted) == (True, None)
        assert handle.inspect(result.notice_id)["created_at"] == iso(T0)
        summary = handle.sweep()
        assert (summary.claimed, summary.accepted) == (1, 1)
        clock.advance(60)
        health = handle.health(120)
        assert health["notices_by_phase"] == {"accepted": 1}
        assert health["seconds_since_last_sweep"] == 60


def test_enqueue_with_send_submits_before_returning(db_path: Path, clock: FakeClock) -> None:
    """send=True makes the first submission; a repeat of the key is not created again."""
    with resetctl.open(db_path, make_settings(), clock=clock) as handle:
        request = reset_request()
        [sent] = handle.enqueue([request], send=True)
        [again] = handle.enqueue([request])
        assert (sent.created, sent.submitted) == (True, True)
        assert (again.notice_id, again.created) == (sent.notice_id, False)
        assert handle.inspect(sent.notice_id)["phase"] == "accepted"


def test_errors_are_the_packages_own(db_path: Path, tmp_path: Path) -> None:
    """Bad input, an unknown id, a missing or locked database: resetctl errors, never
    sqlite3's."""
    with pytest.raises(resetctl.StoreError, match="no such file"):
        resetctl.open(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    with resetctl.open(db_path, make_settings(), busy_timeout=0.1) as handle:
        with pytest.raises(resetctl.InputError) as bad:
            handle.enqueue([{"idempotency_key": "k", "reset_url": "http://x.example/r"}])
        assert "line 1: reset_url: must be an absolute https:// URL" in bad.value.problems
        with pytest.raises(resetctl.NoticeNotFound):
            handle.inspect("ntc_0000000000000000")
        blocker = sqlite3.connect(db_path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(resetctl.StoreError, match="database is locked"):
                handle.enqueue([reset_request()])
        finally:
            blocker.close()
    with pytest.raises(resetctl.StoreError, match="closed"):
        handle.health(60)


def test_stop_ends_a_running_sweep(db_path: Path, clock: FakeClock) -> None:
    """stop() from elsewhere ends a max_runtime sweep at its next check, not at its end."""
    with resetctl.open(db_path, make_settings(), clock=clock) as handle:

        def sleep(seconds: float) -> None:
            clock.sleep(seconds)
            handle.stop()

        handle.sleep = sleep
        summary = handle.sweep(max_runtime=55)
    assert summary.duration <= 1.0


def test_threads_share_a_handle(db_path: Path, clock: FakeClock) -> None:
    """Threads enqueue through one handle at once, each on its own connection."""
    with resetctl.open(db_path, make_settings(), clock=clock) as handle:
        errors: list[BaseException] = []

        def enqueue_some() -> None:
            try:
                for _ in range(5):
                    handle.enqueue([reset_request()])
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=enqueue_some) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert handle.health(60)["notices_by_phase"] == {"queued": 20}


def test_importing_the_package_loads_nothing_heavy() -> None:
    """`import resetctl` (every cron tick pays it) loads no CLI, HTTP, template or DB module."""
    code = (
        "import resetctl, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('typer', 'rich', 'httpx', 'chevron', 'sqlite3', 'typing') or m.startswith('resetctl.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_the_handle_reads_and_scripts_the_outbox(db_path: Path, clock: FakeClock) -> None:
    """outbox_messages, outbox_message and outbox_set_status: what the outbox commands
    show and do; an unknown id is NoticeNotFound, a status outside the vocabulary a
    ConfigError, and neither changes anything."""
    settings = make_settings(outbox={"keep_content": True})
    with resetctl.open(db_path, settings, clock=clock) as handle:
        [sent] = handle.enqueue([reset_request()], send=True)
        [listed] = handle.outbox_messages(sent.notice_id)
        assert listed["submitted_at"] == iso(T0)
        assert "text" not in listed
        shown = handle.outbox_message(listed["message_id"])
        assert "text" in shown
        handle.outbox_set_status(listed["message_id"], "failed")
        assert handle.outbox_messages()[0]["status"] == "failed"
        with pytest.raises(resetctl.NoticeNotFound):
            handle.outbox_message("obx_0000000000000000")
        with pytest.raises(resetctl.NoticeNotFound):
            handle.outbox_set_status("obx_0000000000000000", "failed")
        with pytest.raises(resetctl.ConfigError, match="status: must be one of"):
            handle.outbox_set_status(listed["message_id"], "read")
        assert handle.outbox_messages()[0]["status"] == "failed"


def test_the_handle_runs_the_operators_calls_at_its_clock(
    db_path: Path, tmp_path: Path, clock: FakeClock
) -> None:
    """alerts, write_metrics, export_timings and purge, as their commands run them."""
    with resetctl.open(db_path, make_settings(), clock=clock, sleep=clock.sleep) as handle:
        handle.enqueue([reset_request()], send=True)
        assert handle.sweep().claimed == 0
        assert handle.alerts().to_json()["status"] == "ok"
        handle.write_metrics(tmp_path / "m.prom")
        assert "resetctl_live_notices" in (tmp_path / "m.prom").read_text(encoding="utf-8")
        header, trace = handle.export_timings()
        assert "timings" in header
        assert "notice_id" not in trace
        clock.advance(3600)
        purged = handle.purge(60)
        assert (purged["at"], purged["deleted"]) == (iso(T0 + 3600), 1)
        assert purged["deleted_by_policy"] == {"default": 1}
        assert handle.health(60)["notices_by_phase"] == {}


def test_a_handle_that_must_not_create_refuses_what_is_not_there(tmp_path: Path) -> None:
    """create=False, the read-only commands' handle: a missing file is a StoreError and
    stays missing; templates_check reads a missing database as none and creates nothing."""
    missing = tmp_path / "missing.db"
    with pytest.raises(resetctl.StoreError, match="no such file"):
        resetctl.open(missing, create=False)
    checked = resetctl.api.templates_check(db=missing)
    assert checked.missing_database == str(missing)
    assert checked.report.ok
    assert list(tmp_path.iterdir()) == []


def test_copy_and_demo_refuse_before_writing(db_path: Path, clock: FakeClock) -> None:
    """copy_database needs a postgresql:// target; run_demo never drives a database that
    holds notices."""
    with resetctl.open(db_path, make_settings(), clock=clock) as handle:
        with pytest.raises(resetctl.InputError, match="expected a postgresql:// URI"):
            handle.copy_database(str(db_path.with_name("copy.db")))
        handle.enqueue([reset_request()])
        with pytest.raises(resetctl.InputError, match="holds 1 notice"):
            handle.run_demo(T0, lambda event: None, lambda notice_id, text: None)
        assert handle.health(60)["notices_by_phase"] == {"queued": 1}


def test_replay_reads_exported_traces_and_reports_its_passes(
    db_path: Path, tmp_path: Path, clock: FakeClock
) -> None:
    """replay_candidates and replay: the current policy and its override, compared over
    an exported file; progress hears each pass from 0 to the file's size."""
    import json

    with resetctl.open(db_path, make_settings(), clock=clock) as handle:
        handle.enqueue([reset_request()], send=True)
        traces = handle.export_timings()
    path = tmp_path / "week.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in traces), encoding="utf-8")
    candidates = resetctl.api.replay_candidates(overrides=["on_poll_budget_spent=expire"])
    heard: list[tuple[int, int]] = []
    result = resetctl.api.replay(
        path, candidates, progress=lambda read, total: heard.append((read, total))
    )
    assert [r.policy for r in result.reports] == [
        "current",
        "current + on_poll_budget_spent=expire",
    ]
    size = path.stat().st_size
    starts = [i for i, (read, _) in enumerate(heard) if read == 0]
    assert len(starts) >= 2
    assert heard[-1] == (size, size)
    with pytest.raises(resetctl.InputError, match="cannot read"):
        resetctl.api.replay(tmp_path / "none.jsonl", candidates)
