"""replay and export-timings: fidelity with real sweeps, round trips, policy trade-offs."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import time_machine
from conftest import T0, FakeClock, make_settings, resetctl, run_sweep

from resetctl.config import Settings
from resetctl.controls import cancel
from resetctl.enqueue import enqueue
from resetctl.errors import InputError
from resetctl.machine import CANCEL_REASONS, NoticeState, Reason
from resetctl.replay import (
    Candidate,
    ReplayStats,
    Simulation,
    SimulationOptions,
    Trace,
    read_header,
    read_traces,
    replay,
    with_header,
)
from resetctl.store import Store
from resetctl.sweep import Sweeper
from resetctl.timings import export_timings
from resetctl.transports import build_transports
from resetctl.work import SweepOptions

PENDING = make_settings(outbox={"email_status": "pending", "sms_status": "pending"})

#: Hand-made traces covering each path: quick delivery, bounce then SMS, silence then
#: escalation, both silent, SMS failing too, a short link, and arrivals around cron ticks.
TRACES: list[dict[str, Any]] = [
    {"trace_id": "a", "arrived_at": 0, "ttl": 600, "email": [[4, "delivered"]]},
    {
        "trace_id": "b",
        "arrived_at": 5,
        "ttl": 600,
        "email": [[30, "failed"]],
        "sms": [[3, "delivered"]],
    },
    {
        "trace_id": "c",
        "arrived_at": 59,
        "ttl": 600,
        "email": [[2, "pending"]],
        "sms": [[40, "delivered"]],
    },
    {"trace_id": "d", "arrived_at": 60, "ttl": 600},
    {
        "trace_id": "e",
        "arrived_at": 61,
        "ttl": 600,
        "email": [[10, "failed"]],
        "sms": [[12, "failed"]],
    },
    {
        "trace_id": "f",
        "arrived_at": 130,
        "ttl": 240,
        "email": [[200, "delivered"]],
        "sms": [[5, "pending"], [25, "accepted"]],
    },
    {
        "trace_id": "g",
        "arrived_at": 131,
        "ttl": 600,
        "email": [[140, "delivered"]],
        "sms": [[10, "delivered"]],
    },
    {"trace_id": "h", "arrived_at": 200, "ttl": 90, "email": [[50, "delivered"]]},
    {"trace_id": "i", "arrived_at": 201, "ttl": 600, "email": [[1, "unknown"], [70, "accepted"]]},
]


def trace_lines(traces: list[dict[str, Any]]) -> list[str]:
    return [json.dumps({"region": "default", **t}) for t in traces]


def simulate(
    traces: list[dict[str, Any]], settings: Settings, options: SimulationOptions
) -> dict[str, tuple[str, dict[str, int]]]:
    """Replay outcome per trace id: phase and messages sent per channel."""
    ends: dict[str, tuple[str, dict[str, int]]] = {}

    def on_end(trace: Trace, state: NoticeState, sent: Counter[str]) -> None:
        ends[trace.trace_id] = (state.phase.value, dict(sent))

    simulation = Simulation(Candidate("current", settings.policies), options, on_end)
    for trace in read_traces(trace_lines(traces), Counter()):
        simulation.arrive(trace)
    simulation.finish()
    return ends


@contextmanager
def production(
    db_path: Path, settings: Settings, traces: list[dict[str, Any]], max_runtime: float
) -> Iterator[Store]:
    """Real cron sweeps on a SQLite file: notices enqueued at their arrival and cancelled
    at their cancel's time (between a sweep's rounds too), the outbox's statuses scripted
    from each trace's timeline, time moved with time-machine."""
    by_id = {t["trace_id"]: t for t in traces}
    arrivals = sorted(traces, key=lambda t: t["arrived_at"])
    # (when, arrival before a cancel at the same moment, trace)
    happenings = sorted(
        [(t["arrived_at"], 0, t) for t in traces]
        + [(t["arrived_at"] + t["cancelled"][0] / 1000, 1, t) for t in traces if "cancelled" in t],
        key=lambda happening: happening[:2],
    )
    notice_ids: dict[str, str] = {}
    with Store(db_path) as store, time_machine.travel(T0, tick=False) as traveller:

        def now() -> float:
            return time.time()

        def move_to(moment: float) -> None:
            while happenings and T0 + happenings[0][0] <= moment:
                at, is_cancel, trace = happenings.pop(0)
                traveller.move_to(T0 + at)
                if is_cancel:
                    why = Reason(trace["cancelled"][1])
                    cancel(store, [notice_ids[trace["trace_id"]]], why, now())
                    continue
                arrivals.remove(trace)
                request = {
                    "idempotency_key": trace["trace_id"],
                    "email": f"{trace['trace_id']}@example.com",
                    "phone": "+14155550123",
                    "reset_url": "https://shop.example/r/x",
                    "ttl": trace["ttl"],
                }
                (result,) = enqueue(store, settings, [request], now())
                notice_ids[trace["trace_id"]] = result.notice_id
            traveller.move_to(moment)
            for message in store.outbox_messages():
                trace = by_id[_trace_of(store, message["notice_id"])]
                timeline = trace.get(message["channel"], [])
                offset = moment - message["submitted_at"]
                seen = [status for at, status in timeline if at <= offset]
                store.outbox_set_status(
                    message["message_id"], seen[-1] if seen else "pending", moment
                )

        sweeper = Sweeper(
            store,
            settings,
            build_transports(settings, store, now),
            sleep=lambda seconds: move_to(now() + seconds),
        )
        tick = T0
        while arrivals or store.next_due_at() is not None:
            move_to(tick)
            sweeper.run(SweepOptions("cron", 50, 60.0, max_runtime))
            tick += 60
        yield store


def _trace_of(store: Store, notice_id: str) -> str:
    (key,) = store.conn.execute(
        "SELECT idempotency_key FROM notices WHERE id = ?", (notice_id,)
    ).fetchone()
    return str(key)


def outcomes(store: Store) -> dict[str, tuple[str, dict[str, int]]]:
    """Production outcome per trace id: phase and outbox messages per channel."""
    ends = {}
    for notice_id, key, phase in store.conn.execute(
        "SELECT id, idempotency_key, phase FROM notices"
    ).fetchall():
        sent = Counter(m["channel"] for m in store.outbox_messages(notice_id))
        ends[key] = (phase, dict(sent))
    return ends


@pytest.mark.parametrize("max_runtime", [0.0, 55.0])
def test_replay_matches_real_sweeps(db_path: Path, max_runtime: float) -> None:
    """Replayed traces end like real sweeps over the same timelines: phases, messages."""
    options = SimulationOptions(sweep_interval=60, max_runtime=max_runtime)
    simulated = simulate(TRACES, PENDING, options)
    with production(db_path, PENDING, TRACES, max_runtime) as store:
        real = outcomes(store)
        attempts = Counter(
            (_trace_of(store, n), c)
            for n, c in store.conn.execute("SELECT notice_id, channel FROM attempts")
        )
    assert simulated == real
    assert {k: dict(v[1]) for k, v in real.items()} == {
        t: {c: n for (tt, c), n in attempts.items() if tt == t} for t in real
    }
    assert {phase for phase, _ in real.values()} >= {"accepted", "expired", "failed"}


#: Cancels at every stage, each ending the same way whether sweeps run once a minute or
#: loop for 55 s: (completed) before the SMS would go out, after it went out, and after
#: it went out with the primary's delivery in between; (superseded) while queued, and at
#: the very cron tick that would submit it; (completed) after acceptance, moot;
#: (withdrawn) while the fallback awaits its status.
CANCELLED: list[dict[str, Any]] = [
    {
        "trace_id": "before-sms",
        "arrived_at": 0,
        "ttl": 600,
        "email": [[2, "pending"]],
        "sms": [[3, "delivered"]],
        "cancelled": [100_000, "completed"],
    },
    {
        "trace_id": "after-sms",
        "arrived_at": 0,
        "ttl": 600,
        "email": [[2, "pending"]],
        "sms": [[40, "delivered"]],
        "cancelled": [130_000, "completed"],
    },
    {
        "trace_id": "wasted-sms",
        "arrived_at": 0,
        "ttl": 600,
        "email": [[2, "pending"], [121, "delivered"]],
        "sms": [[40, "delivered"]],
        "cancelled": [128_000, "completed"],
    },
    {"trace_id": "queued", "arrived_at": 56, "ttl": 600, "cancelled": [2_000, "superseded"]},
    {
        "trace_id": "at-the-tick",
        "arrived_at": 116,
        "ttl": 600,
        "email": [[4, "delivered"]],
        "cancelled": [4_000, "superseded"],
    },
    {
        "trace_id": "moot",
        "arrived_at": 117,
        "ttl": 600,
        "email": [[4, "delivered"]],
        "cancelled": [300_000, "completed"],
    },
    {
        "trace_id": "fallback-pending",
        "arrived_at": 118,
        "ttl": 600,
        "email": [[10, "failed"]],
        "sms": [[5, "pending"]],
        "cancelled": [100_000, "withdrawn"],
    },
]
#: How each of CANCELLED ends, and what it sent.
CANCELLED_ENDS = {
    "before-sms": ("cancelled", {"email": 1}),
    "after-sms": ("cancelled", {"email": 1, "sms": 1}),
    "wasted-sms": ("cancelled", {"email": 1, "sms": 1}),
    "queued": ("cancelled", {}),
    "at-the-tick": ("cancelled", {}),
    "moot": ("accepted", {"email": 1}),
    "fallback-pending": ("cancelled", {"email": 1, "sms": 1}),
}


@pytest.mark.parametrize("max_runtime", [0.0, 55.0])
def test_cancels_replay_like_real_cancels(db_path: Path, max_runtime: float) -> None:
    """Traces cancelled at every stage end like real sweeps with real cancels at those
    times: same phases, same messages, nothing sent after a cancel."""
    options = SimulationOptions(sweep_interval=60, max_runtime=max_runtime)
    simulated = simulate(CANCELLED, PENDING, options)
    with production(db_path, PENDING, CANCELLED, max_runtime) as store:
        real = outcomes(store)
        cancelled_at = dict(
            store.conn.execute(
                "SELECT idempotency_key, phase_since FROM notices WHERE phase = 'cancelled'"
            ).fetchall()
        )
        last_sent = {
            _trace_of(store, m["notice_id"]): m["submitted_at"] for m in store.outbox_messages()
        }
    assert simulated == real == CANCELLED_ENDS
    for key, at in cancelled_at.items():
        assert key not in last_sent or last_sent[key] < at


def simulated_stats(traces: list[dict[str, Any]], options: SimulationOptions) -> ReplayStats:
    """The point estimate's counters of ``traces`` replayed under PENDING's policies."""
    simulation = Simulation(Candidate("current", PENDING.policies), options)
    for trace in read_traces(trace_lines(traces), Counter()):
        simulation.arrive(trace)
    return simulation.finish()


@pytest.mark.parametrize("max_runtime", [0.0, 55.0])
def test_completed_resets_count_fallbacks_avoided_sent_and_wasted(max_runtime: float) -> None:
    """A completion before the fallback's time sends no SMS and counts the one it avoided;
    after it, the SMS counts as sent before completion, and as wasted when the primary
    had succeeded by then; cancels count by reason."""
    stats = simulated_stats(CANCELLED, SimulationOptions(max_runtime=max_runtime))
    assert stats.sent["sms"] == 3
    assert stats.fallback_avoided_by_completion == 1  # before-sms
    assert stats.fallback_before_completion == 2  # after-sms, wasted-sms
    assert stats.fallback_wasted == 1  # wasted-sms: its email was delivered at 121 s
    assert stats.late_primary_after_fallback == 1
    assert (stats.cancelled, stats.accepted) == (6, 1)
    assert stats.cancelled_by_reason == {"completed": 3, "superseded": 2, "withdrawn": 1}
    (before_sms,) = [t for t in CANCELLED if t["trace_id"] == "before-sms"]
    assert simulated_stats([{**before_sms, "cancelled": None}], SimulationOptions()).sent == {
        "email": 1,
        "sms": 1,
    }


def test_a_cancel_between_two_reads_counts_at_its_own_time() -> None:
    """The email delivered a second after the person completed, long before the next
    read: neither a wasted fallback nor a late primary success, though the notice is
    only looked at again after both."""
    (wasted,) = [t for t in CANCELLED if t["trace_id"] == "wasted-sms"]
    for cancel_ms, counted in ((120_500, 0), (122_000, 1)):
        trace = {**wasted, "cancelled": [cancel_ms, "completed"]}
        stats = simulated_stats([trace], SimulationOptions())
        assert stats.sent["sms"] == 1  # at 120 s, before either cancel
        assert (stats.fallback_wasted, stats.late_primary_after_fallback) == (counted, counted)
        assert stats.cancelled == 1


def test_readings_that_disagree_before_a_cancel_each_end_the_notice_once() -> None:
    """A delivery known only to lie in (10 s, 200 s]: read at 45 s, the optimistic
    reading is accepted before the completion at 70 s, the pessimistic one is cancelled
    then and would have escalated at 105 s; the point estimate is one or the other."""
    seen = {"seen": [[0, 0, "pending"], [10_000, 200_000, "delivered"]], "end_ms": 200_000}
    line = {"version": 2, "trace_id": "a", "arrived_at": 0, "ttl": 600, "email": seen}
    line["sms"] = {"seen": [[0, 2_000, "delivered"]], "end_ms": 2_000}
    line["cancelled"] = [70_000, "completed"]
    options = SimulationOptions(max_runtime=55)
    (report,) = replay([json.dumps(line)], [Candidate("c", PENDING.policies)], options).reports
    summary = report.to_json()
    for reading in (summary, summary["optimistic"], summary["pessimistic"]):
        assert reading["accepted"] + reading["cancelled"] == 1
        assert reading["messages_sent"] == {"email": 1, "sms": 0}
    assert (summary["optimistic"]["accepted"], summary["pessimistic"]["cancelled"]) == (1, 1)
    assert summary["pessimistic"]["fallback_avoided_by_completion"] == 1
    assert summary["range"]["fallback_avoided_by_completion"] == [0, 1]
    assert summary["range"]["cancelled_by_reason.completed"] == [0, 1]


def test_export_then_replay_of_cancelled_notices_cancels_them_again(db_path: Path) -> None:
    """Cancelled notices exported and replayed under their policy are cancelled again,
    for the same reasons, having sent the same messages."""
    with production(db_path, PENDING, CANCELLED, 55.0) as store:
        exported = list(export_timings(store, 0, float("inf")))
        real = outcomes(store)
        reasons = Counter(
            reason
            for (reason,) in store.conn.execute(
                "SELECT reason FROM notices WHERE phase = 'cancelled'"
            )
        )
    assert sum("cancelled" in trace for trace in exported[1:]) == sum(reasons.values())
    lines = [json.dumps(t) for t in exported]
    options = with_header(SimulationOptions(max_runtime=55.0), read_header(lines))
    (report,) = replay(lines, [Candidate("current", PENDING.policies)], options).reports
    summary = report.to_json()
    assert summary["cancelled"] == sum(reasons.values())
    assert summary["cancelled_by_reason"] == {
        reason.value: reasons[reason.value] for reason in CANCEL_REASONS
    }
    sent: Counter[str] = Counter()
    for _, channels in real.values():
        sent.update(channels)
    assert summary["messages_sent"] == {"email": sent["email"], "sms": sent["sms"]}


def test_export_then_replay_reproduces_the_outcome_counts(db_path: Path) -> None:
    """Swept notices exported as traces and replayed under their policy give the same counts."""
    with production(db_path, PENDING, TRACES, 55.0) as store:
        exported = list(export_timings(store, 0, float("inf")))
        real = outcomes(store)
    lines = [json.dumps(t) for t in exported]
    options = SimulationOptions(sweep_interval=60, max_runtime=55.0)
    (report,) = replay(lines, [Candidate("current", PENDING.policies)], options).reports
    summary = report.to_json()
    phases = Counter(phase for phase, _ in real.values())
    assert summary["notices"] == len(TRACES)
    assert (summary["accepted"], summary["expired"], summary["failed"]) == (
        phases["accepted"],
        phases["expired"],
        phases["failed"],
    )
    sent = Counter()
    for _, channels in real.values():
        sent.update(channels)
    assert summary["messages_sent"] == {"email": sent["email"], "sms": sent["sms"]}
    assert summary["escalated"] == sum(1 for _, c in real.values() if "sms" in c)


def test_exported_traces_hold_no_identifiers(db_path: Path) -> None:
    """export-timings carries no notice id, account, contact data or URL."""
    with production(db_path, PENDING, TRACES, 55.0) as store:
        ids = [r[0] for r in store.conn.execute("SELECT id FROM notices")]
        text = "\n".join(json.dumps(t) for t in export_timings(store, 0, float("inf")))
    for secret in [*ids, "@example.com", "+14155550123", "shop.example", "4155550123"]:
        assert secret not in text
    header, *traces = map(json.loads, text.splitlines())
    assert set(header) <= {"timings", "sweep_interval", "first_sweep_at", "read_lag"}
    assert all(t["trace_id"] not in ids for t in traces)


@pytest.mark.parametrize("reason", list(CANCEL_REASONS))
def test_a_cancelled_notice_exports_its_cancel_and_nothing_secret(
    store: Store, reason: Reason
) -> None:
    """A notice cancelled 42.5 s after arrival, its email awaiting a status, exports
    `"cancelled": [42500, reason]` beside the email's reads; no id, account or contact."""
    request = {
        "idempotency_key": "cancel-me",
        "account_ref": "acct-7731",
        "email": "cancel-me@example.com",
        "phone": "+14155550123",
        "reset_url": "https://shop.example/r/x",
    }
    (result,) = enqueue(store, PENDING, [request], T0)
    run_sweep(store, PENDING, FakeClock(T0))
    cancel(store, [result.notice_id], reason, T0 + 42.5)
    header, trace = export_timings(store, 0, math.inf)
    assert trace["cancelled"] == [42_500, reason.value]
    assert set(trace) & {"email", "sms"} == {"email"}
    text = json.dumps([header, trace])
    for secret in [result.notice_id, "acct-7731", "cancel-me", "shop.example", "4155550123"]:
        assert secret not in text


def _crafted(tmp_path: Path) -> Path:
    """Email that answers late or never; SMS that answers: where policies differ."""
    traces = []
    for n in range(60):
        email: list[list[Any]] = []
        if n % 3 == 0:
            email = [[25 + n, "delivered"]]
        elif n % 3 == 1:
            email = [[12, "pending"], [70 + n, "failed"]]
        traces.append(
            {
                "trace_id": f"t{n}",
                "arrived_at": n * 7,
                "ttl": 600,
                "email": email,
                "sms": [[5, "delivered"]],
            }
        )
    path = tmp_path / "crafted.jsonl"
    path.write_text("\n".join(trace_lines(traces)) + "\n", encoding="utf-8")
    return path


def test_shorter_poll_schedule_reads_more_and_escalates_sooner(tmp_path: Path) -> None:
    """A tighter, longer poll schedule costs status reads and sends the fallback earlier."""
    result = resetctl(
        "replay",
        str(_crafted(tmp_path)),
        "--max-runtime",
        "55s",
        "--json",
        "--set",
        "email.poll_delays=5,10,20,30,45",
    )
    assert result.returncode == 0, result.stderr
    current, shorter = json.loads(result.stdout)
    assert shorter["policy"].startswith("current + email.poll_delays")
    assert shorter["status_reads"] > current["status_reads"]
    assert shorter["remaining_at_fallback"]["p50"] > current["remaining_at_fallback"]["p50"]
    assert shorter["escalated"] >= current["escalated"]


def test_expire_policy_trades_sms_volume_for_expiries(tmp_path: Path) -> None:
    """on_poll_budget_spent = "expire": fewer texts sent, more notices expired."""
    result = resetctl(
        "replay",
        str(_crafted(tmp_path)),
        "--max-runtime",
        "55s",
        "--json",
        "--set",
        "on_poll_budget_spent=expire",
    )
    assert result.returncode == 0, result.stderr
    current, expire = json.loads(result.stdout)
    assert expire["messages_sent"]["sms"] < current["messages_sent"]["sms"]
    assert expire["expired"] > current["expired"]
    assert expire["messages_sent"]["email"] == current["messages_sent"]["email"]
    assert set(current) >= {
        "policy",
        "notices",
        "accepted_primary",
        "escalated",
        "expired",
        "failed",
        "both_channels",
        "late_primary_after_fallback",
        "status_reads",
        "messages_sent",
        "remaining_at_fallback",
        "time_to_acceptance",
        "would_page",
        "queue_delay_p95",
        "cancelled",
        "cancelled_by_reason",
        "fallback_before_completion",
        "fallback_wasted",
        "fallback_avoided_by_completion",
    }


def test_policy_files_are_compared_side_by_side(tmp_path: Path) -> None:
    """Each --policy file is one column, labelled by its file name."""
    strict = tmp_path / "strict.toml"
    strict.write_text('[policy.default]\non_poll_budget_spent = "expire"\n', encoding="utf-8")
    loose = tmp_path / "loose.toml"
    loose.write_text("[policy.default]\nversion = 2\n", encoding="utf-8")
    result = resetctl(
        "replay",
        str(_crafted(tmp_path)),
        "--policy",
        str(strict),
        "--policy",
        str(loose),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert [r["policy"] for r in json.loads(result.stdout)] == ["strict", "loose"]
    table = resetctl("replay", str(_crafted(tmp_path)), "--policy", str(strict))
    assert "remaining lifetime when the fallback was sent" in table.stdout
    assert "strict" in table.stdout


def test_the_report_shows_cancels_and_fallbacks_around_completion(tmp_path: Path) -> None:
    """`replay` prints cancels by reason and the fallbacks avoided, sent before and wasted
    around a completion; --json gives the same figures with their ranges."""
    path = tmp_path / "cancelled.jsonl"
    path.write_text("\n".join(trace_lines(CANCELLED)) + "\n", encoding="utf-8")
    result = resetctl("replay", str(path), "--json")
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)
    assert report["cancelled"] == 6
    assert report["cancelled_by_reason"] == {"completed": 3, "superseded": 2, "withdrawn": 1}
    figures = ("fallback_avoided_by_completion", "fallback_before_completion", "fallback_wasted")
    assert [report[key] for key in figures] == [1, 2, 1]
    assert all(report["range"][key] == [report[key]] * 2 for key in figures)
    table = resetctl("replay", str(path))
    assert table.returncode == 0, table.stderr
    for row in (
        "cancelled ",
        "  completed ",
        "  superseded ",
        "fallback sent before completion",
        "of which wasted",
        "fallback avoided (due after completion)",
    ):
        assert row in table.stdout


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"trace_id": "a", "arrived_at": 0, "ttl": 60}', "{oops"], "line 2: (line)"),
        (
            [
                '{"trace_id": "a", "arrived_at": 9, "ttl": 60}',
                '{"trace_id": "b", "arrived_at": 3, "ttl": 60}',
            ],
            "line 2: arrived_at: traces must be sorted by arrival",
        ),
        (
            [
                (
                    '{"trace_id": "a", "arrived_at": 0, "ttl": 60,'
                    ' "email": [[9, "pending"], [3, "failed"]]}'
                )
            ],
            "line 1: email[1]: timeline offsets must not decrease",
        ),
        (['{"trace_id": "a", "arrived_at": 0, "ttl": -1}'], "line 1: ttl:"),
        (
            ['{"trace_id": "a", "arrived_at": 0, "ttl": 60, "fax": []}'],
            "line 1: fax: unknown field",
        ),
        (
            ['{"trace_id": "a", "arrived_at": 0, "ttl": 60, "transport": {"sms": "pigeon"}}'],
            "line 1: transport.sms",
        ),
        (
            [
                '{"trace_id": "a", "arrived_at": 0, "ttl": 60}',
                '{"trace_id": "b", "arrived_at": 1, "ttl": 60, "cancelled": "completed"}',
            ],
            "line 2: cancelled: expected [after_ms, reason]",
        ),
        (
            ['{"trace_id": "a", "arrived_at": 0, "ttl": 60, "cancelled": [5000]}'],
            "line 1: cancelled: expected [after_ms, reason]",
        ),
        (
            ['{"trace_id": "a", "arrived_at": 0, "ttl": 60, "cancelled": [-1, "completed"]}'],
            "line 1: cancelled[0]: expected milliseconds (≥ 0) after arrival",
        ),
        (
            ['{"trace_id": "a", "arrived_at": 0, "ttl": 60, "cancelled": [true, "completed"]}'],
            "line 1: cancelled[0]:",
        ),
        (
            ['{"trace_id": "a", "arrived_at": 0, "ttl": 60, "cancelled": [5000, "expired"]}'],
            "line 1: cancelled[1]: expected a cancel reason: one of completed, superseded,"
            " withdrawn",
        ),
    ],
)
def test_bad_trace_input_names_line_and_field(
    tmp_path: Path, lines: list[str], message: str
) -> None:
    """A malformed line, unsorted arrivals or a decreasing timeline: line and field, exit 2."""
    with pytest.raises(
        InputError,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        list(read_traces(lines, Counter()))
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = resetctl("replay", str(path))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_raw_statuses_are_counted_once_in_a_summary(tmp_path: Path) -> None:
    """Unrecognized raw statuses count as unknown and are reported once, not per line."""
    traces = [
        {"trace_id": f"t{n}", "arrived_at": n, "ttl": 600, "email": [[5, "bounced-ish"]]}
        for n in range(5)
    ]
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(trace_lines(traces)) + "\n", encoding="utf-8")
    result = resetctl("replay", str(path), "--json")
    assert result.returncode == 0
    assert result.stderr.count("bounced-ish") == 1
    assert "x5" in result.stderr
    (report,) = json.loads(result.stdout)
    assert report["notices"] == 5


def test_a_notice_whose_fallback_came_too_late_would_have_paged() -> None:
    """An email failure seen after cron's queue delay, too late for a fallback, pages."""
    traces = [{"trace_id": "late", "arrived_at": 1, "ttl": 200, "email": [[10, "failed"]]}]
    ends: list[str] = []
    simulation = Simulation(
        Candidate("current", PENDING.policies),
        SimulationOptions(sweep_interval=60),
        lambda trace, state, sent: ends.append(state.phase.value),
    )
    for trace in read_traces(trace_lines(traces), Counter()):
        simulation.arrive(trace)
    stats = simulation.finish()
    assert ends == ["expired"]
    assert stats.would_page == 1
    assert stats.sent["sms"] == 0
