"""A notice's timeline as an inline SVG, drawn on the server from its ``inspect`` document.

One row for the notice (enqueue, the fallback claim, how it ended), one per channel (each
attempt's intent, submission and observations, and the next action when it is that
channel's), and lines across them for the deadlines: the fallback deadline (the last
moment a fallback still has its reserve), the expiry, and now. It draws only what the
document holds (times, channels, statuses, phases), so it can show nothing ``inspect``
would not; every text it writes is escaped. Each kind of mark has its own class and
colour, which the page's legend repeats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any, NamedTuple

from resetctl.durations import format_duration
from resetctl.machine import TERMINAL_PHASES

#: Colours of the marks (the legend and the tests read the same table).
COLOURS = {
    "enqueue": "#1d4ed8",
    "intent": "#0f766e",
    "submission": "#0f766e",
    "fallback-claim": "#ea580c",
    "ended": "#111827",
    "next-action": "#6b7280",
    "fallback-deadline": "#d97706",
    "expiry": "#dc2626",
    "now": "#0284c7",
}
#: An observation's colour by its normalized status.
STATUS_COLOURS = {
    "pending": "#9ca3af",
    "accepted": "#22c55e",
    "delivered": "#15803d",
    "failed": "#b91c1c",
    "unknown": "#a855f7",
}
_TERMINAL = frozenset(p.value for p in TERMINAL_PHASES)
#: The event kinds whose status is an observation of an attempt.
OBSERVING = ("outcome", "poll", "callback", "lookup")

WIDTH = 960
_LEFT, _RIGHT, _TOP, _ROW, _AXIS, _KEY = 130, 24, 56, 46, 34, 26


class Mark(NamedTuple):
    """One thing that happened (or will) at a moment, on a row."""

    at: float
    kind: str
    row: int
    label: str
    colour: str


def _moment(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:  # "out of range": a time the document could not write
        return None


def report_now(report: Mapping[str, Any]) -> float | None:
    """The moment the document was made: its current phase's start plus its age."""
    since = _moment(report.get("phase_since"))
    age = report.get("state_age_seconds")
    return None if since is None or not isinstance(age, int | float) else since + age


def marks(report: Mapping[str, Any]) -> tuple[list[str], list[Mark], dict[str, float]]:
    """The rows' names, the marks on them, and the deadlines (name → moment)."""
    channels: list[str] = list(report.get("channels") or [])
    for attempt in report.get("attempts") or []:
        if attempt.get("channel") not in channels:
            channels.append(attempt["channel"])
    order = ("primary", "fallback")
    rows = ["notice", *(f"{c} ({order[i]})" if i < 2 else c for i, c in enumerate(channels))]
    found: list[Mark] = []

    def add(at: object, kind: str, row: int, label: str, colour: str | None = None) -> None:
        moment = _moment(at)
        if moment is not None:
            found.append(Mark(moment, kind, row, label, colour or COLOURS[kind]))

    add(report.get("created_at"), "enqueue", 0, "enqueued")
    history: Sequence[Mapping[str, Any]] = report.get("history") or []
    for event in history:
        if event.get("new_phase") == "fallback_pending" and event.get("old_phase") not in (
            None,
            "fallback_pending",
        ):
            add(event.get("at"), "fallback-claim", 0, f"fallback claimed ({event.get('reason')})")
            break
    ended = [e for e in history if e.get("new_phase") != e.get("old_phase")]
    if ended and report.get("phase") in _TERMINAL:
        add(ended[-1].get("at"), "ended", 0, f"{report['phase']} ({report.get('reason')})")
    for attempt in report.get("attempts") or []:
        row = 1 + channels.index(attempt["channel"])
        add(attempt.get("started_at"), "intent", row, f"{attempt['channel']}: intent")
        add(attempt.get("submitted_at"), "submission", row, f"{attempt['channel']}: submitted")
        seen: set[tuple[object, object]] = set()
        observed = [
            (e.get("at"), e.get("status"), e.get("kind"))
            for e in history
            if e.get("attempt_key") == attempt.get("attempt_key")
            and e.get("kind") in OBSERVING
            and e.get("status")
        ]
        last = attempt.get("last_observation")
        if last:
            observed.append((last.get("at"), last.get("status"), last.get("source")))
        for at, status, source in observed:
            if (at, status) in seen:
                continue
            seen.add((at, status))
            colour = STATUS_COLOURS.get(str(status), STATUS_COLOURS["unknown"])
            add(at, "observation", row, f"{attempt['channel']}: {status} ({source})", colour)
    action = report.get("next_action")
    if action and action.get("channel") in channels:
        row = 1 + channels.index(action["channel"])
        add(action.get("due_at"), "next-action", row, f"next: {action['action']}")
    deadlines = {}
    budget = report.get("action_budget") or {}
    if budget.get("fallback_channel"):
        deadline = _moment(budget.get("fallback_deadline"))
        if deadline is not None:
            deadlines["fallback-deadline"] = deadline
    expiry = _moment(report.get("expires_at"))
    if expiry is not None:
        deadlines["expiry"] = expiry
    now = report_now(report)
    if now is not None:
        deadlines["now"] = now
    return rows, found, deadlines


_DEADLINE_LABELS = {"fallback-deadline": "fallback deadline", "expiry": "expires", "now": "now"}


def timeline_svg(report: Mapping[str, Any]) -> str:
    """The SVG of ``report`` (an ``inspect`` document), scaled to its container."""
    rows, found, deadlines = marks(report)
    moments = [m.at for m in found] + list(deadlines.values())
    start = _moment(report.get("created_at")) or (min(moments) if moments else 0.0)
    end = max([start + 60.0, *moments])
    # Long after a notice ended, "now" would squeeze its whole life into the left edge:
    # then the axis ends with the notice, and now is a label at the right edge.
    late = None
    if "now" in deadlines and report.get("phase") in _TERMINAL:
        before = max([start + 60.0, *(at for at in moments if at != deadlines["now"])])
        if deadlines["now"] > before + (before - start) * 0.25:
            late = deadlines.pop("now") - before
            end = before
    pad = (end - start) * 0.03
    span = end - start + 2 * pad
    height = _TOP + _ROW * len(rows) + _AXIS + _KEY
    plot = WIDTH - _LEFT - _RIGHT

    def x(at: float) -> int:
        return round(_LEFT + (at - start + pad) / span * plot)

    def y(row: int) -> int:
        return _TOP + _ROW * row + _ROW // 2

    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH}'
        f' {height}" width="100%" role="img" aria-label="timeline of the notice"'
        ' font-family="system-ui, sans-serif" font-size="13">'
    ]
    for row, name in enumerate(rows):
        top = _TOP + _ROW * row
        shade = "#f3f4f6" if row % 2 == 0 else "#ffffff"
        parts.append(f'<rect x="0" y="{top}" width="{WIDTH}" height="{_ROW}" fill="{shade}"/>')
        parts.append(f'<text x="8" y="{y(row) + 4}" fill="#111827">{escape(name)}</text>')
    for row in range(1, len(rows)):
        on_row = sorted(m.at for m in found if m.row == row and m.kind != "next-action")
        if on_row:
            parts.append(
                f'<line x1="{x(on_row[0])}" y1="{y(row)}" x2="{x(on_row[-1])}" y2="{y(row)}"'
                ' stroke="#9ca3af" stroke-width="2"/>'
            )
    parts.extend(_axis(start, end, x, _TOP + _ROW * len(rows)))
    for level, (kind, at) in enumerate(sorted(deadlines.items(), key=lambda d: d[1])):
        parts.append(_deadline(kind, at, x(at), level, _TOP + _ROW * len(rows)))
    # The notice's labelled marks (enqueue, claim, end) take turns below and above it, so
    # two close together do not write over each other.
    labelled = sorted((m for m in found if m.kind in _LABELLED), key=lambda m: m.at)
    for mark in sorted(found, key=lambda m: (m.kind == "observation", m.at)):
        above = mark in labelled and labelled.index(mark) % 2 == 1
        parts.append(_mark(mark, x(mark.at), y(mark.row), start, above))
    if late is not None:
        later = f"now: {format_duration(late)} later →"
        parts.append(
            f'<text class="now-later" x="{WIDTH - 4}" y="16" text-anchor="end"'
            f' fill="{COLOURS["now"]}" font-weight="600">{later}</text>'
        )
    parts.extend(_key(height - _KEY // 2))
    parts.append("</svg>")
    return "".join(parts)


def _title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


_LABELLED = ("enqueue", "fallback-claim", "ended")


def _mark(mark: Mark, cx: int, cy: int, start: float, above: bool) -> str:
    """One mark, its kind as its class, its label and time as its tooltip."""
    when = f"{mark.label} at +{format_duration(mark.at - start)}"
    head = f'<g class="mark {mark.kind}">{_title(when)}'
    fill = mark.colour
    if mark.kind in _LABELLED:
        label = f'<text x="{cx}" y="{cy - 13 if above else cy + 21}" text-anchor="middle"'
        label += f' fill="#111827">{escape(mark.label.split(" (")[0])}</text>'
    else:
        label = ""
    if mark.kind == "enqueue":
        shape = f'<circle cx="{cx}" cy="{cy}" r="8" fill="{fill}"/>'
    elif mark.kind == "fallback-claim":
        shape = f'<path d="M{cx - 9} {cy + 8} L{cx} {cy - 10} L{cx + 9} {cy + 8} Z" fill="{fill}"/>'
    elif mark.kind == "ended":
        shape = f'<rect x="{cx - 7}" y="{cy - 7}" width="14" height="14" fill="{fill}"/>'
    elif mark.kind == "intent":
        shape = (
            f'<circle cx="{cx}" cy="{cy}" r="7" fill="#ffffff" stroke="{fill}" stroke-width="3"/>'
        )
    elif mark.kind == "submission":
        shape = f'<rect x="{cx - 7}" y="{cy - 7}" width="14" height="14" fill="{fill}"/>'
    elif mark.kind == "next-action":
        shape = (
            f'<circle cx="{cx}" cy="{cy}" r="8" fill="none" stroke="{fill}" stroke-width="2"'
            ' stroke-dasharray="3 2"/>'
        )
        label = f'<text x="{cx}" y="{cy - 13}" text-anchor="middle" fill="#374151">'
        label += f"{escape(mark.label)}</text>"
    else:
        shape = (
            f'<path d="M{cx} {cy - 8} L{cx + 8} {cy} L{cx} {cy + 8} L{cx - 8} {cy} Z"'
            f' fill="{fill}" stroke="#ffffff" stroke-width="1"/>'
        )
    return f"{head}{shape}{label}</g>"


def _deadline(kind: str, at: float, cx: int, level: int, bottom: int) -> str:
    """A line across every row at a deadline (or now), labelled above the rows; labels
    of deadlines close together sit on different levels."""
    colour = COLOURS[kind]
    dash = ' stroke-dasharray="8 4"' if kind == "fallback-deadline" else ""
    ly = 16 + 15 * (level % 3)
    name = _DEADLINE_LABELS[kind]
    # A label runs to the line's right, or, in the right third, ends at its left.
    tx, anchor = (cx - 5, "end") if cx > WIDTH * 2 // 3 else (cx + 5, "start")
    return (
        f'<g class="deadline {kind}">{_title(name)}'
        f'<line x1="{cx}" y1="{ly + 4}" x2="{cx}" y2="{bottom}" stroke="{colour}"'
        f' stroke-width="3"{dash}/>'
        f'<text x="{tx}" y="{ly}" text-anchor="{anchor}" fill="{colour}" font-weight="600">'
        f"{escape(name)}</text></g>"
    )


def _key(cy: int) -> list[str]:
    """What the shapes and an observation's colours mean, along the bottom."""
    ink = "#374151"
    parts = ['<g class="key">']
    cx = 8

    def entry(shape: str, name: str) -> None:
        nonlocal cx
        parts.append(shape)
        parts.append(f'<text x="{cx + 16}" y="{cy + 4}" fill="{ink}">{name}</text>')
        cx += 24 + 8 * len(name)

    entry(f'<circle cx="{cx + 5}" cy="{cy}" r="5" fill="none" stroke="{ink}"/>', "intent")
    entry(f'<rect x="{cx}" y="{cy - 5}" width="10" height="10" fill="{ink}"/>', "submitted")
    parts.append(f'<text x="{cx}" y="{cy + 4}" fill="{ink}">observed:</text>')
    cx += 80
    for status, colour in STATUS_COLOURS.items():
        diamond = f"M{cx + 5} {cy - 6} L{cx + 11} {cy} L{cx + 5} {cy + 6} L{cx - 1} {cy} Z"
        entry(f'<path d="{diamond}" fill="{colour}"/>', status)
    parts.append("</g>")
    return parts


_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)


def _axis(start: float, end: float, x: Any, top: int) -> list[str]:
    """Ticks below the rows, as time since the enqueue."""
    span = end - start
    step = next((s for s in _STEPS if span / s <= 8), 86400 * max(1, round(span / 86400 / 8)))
    parts = [f'<line x1="{_LEFT}" y1="{top}" x2="{WIDTH - _RIGHT}" y2="{top}" stroke="#6b7280"/>']
    tick = 0.0
    while tick <= span:
        tx = x(start + tick)
        text = "0" if tick == 0 else f"+{format_duration(tick)}"
        parts.append(f'<line x1="{tx}" y1="{top}" x2="{tx}" y2="{top + 6}" stroke="#6b7280"/>')
        parts.append(
            f'<text x="{tx}" y="{top + 22}" text-anchor="middle" fill="#374151">{text}</text>'
        )
        tick += step
    return parts
