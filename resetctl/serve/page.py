"""The on-call page: what is at risk now, the live notices by phase and age, a search, and
a notice's own page with its timeline drawn (:mod:`resetctl.serve.timeline`).

Server-rendered HTML from Mustache templates (``pages/``, rendered by chevron, the engine
of the reset copy; every value escaped), no script, refreshed by a meta tag, laid out for
a phone as for a desk. It shows what ``list`` and ``inspect`` show (timing and state) and
so never a contact datum or a link. A search by id, idempotency key or account answers a
redirect to the notice; what was searched for is never repeated on the page.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from resetctl.durations import format_duration
from resetctl.errors import NoticeNotFound
from resetctl.machine import LIVE_PHASES
from resetctl.serve.replies import HTML, Reply
from resetctl.serve.timeline import report_now, timeline_svg

if TYPE_CHECKING:
    from resetctl.api import Handle

#: Seconds between the page's own refreshes.
REFRESH = 30
#: The most live notices the index lists (the counts cover them all).
LIVE_SHOWN = 200
#: No script, no frame, no outside resource: the page is HTML and its own styles.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:;"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_PAGE_HEADERS = (("Content-Security-Policy", CSP), ("X-Frame-Options", "DENY"))


@cache
def _template(name: str) -> str:
    return (resources.files("resetctl.serve") / "pages" / f"{name}.mustache").read_text("utf-8")


def _render(name: str, data: Mapping[str, Any], status: int = 200) -> Reply:
    import chevron

    partials = {"head": _template("head"), "foot": _template("foot")}
    context = {"refresh": REFRESH, **data}
    html: str = chevron.render(_template(name), context, partials_dict=partials)
    return Reply(status, html.encode(), HTML, _PAGE_HEADERS)


def _ago(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) else format_duration(float(seconds))


def _row(row: Mapping[str, Any], now: float, base: str) -> dict[str, Any]:
    """A ``list`` row as the page shows it."""
    return {
        **row,
        "href": f"{base}/notices/{quote(str(row['notice_id']), safe='')}",
        "remaining": _ago(row.get("remaining_seconds")),
        "state_age": _ago(now - _epoch(row.get("phase_since"), now)),
        "age": _ago(now - _epoch(row.get("created_at"), now)),
    }


def _epoch(text: object, default: float) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return default


def index(handle: Handle, query: Mapping[str, list[str]], base: str = "") -> Reply:
    """``GET /``: at risk now, the live notices by phase and age, the search. With
    ``?q=`` a redirect to the notice it names (an id, an idempotency key, an account's
    latest), or the index saying none does (404)."""
    wanted = (query.get("q") or [""])[0].strip()
    if wanted:
        found = _search(handle, wanted)
        if found is not None:
            location = f"{base}/notices/{quote(found, safe='')}"
            return Reply(303, b"", HTML, (("Location", location),))
    now = handle.clock()
    at_risk = [_row(r, now, base) for r in handle.find(at_risk=True, limit=LIVE_SHOWN)]
    live = handle.find(phases=[p.value for p in LIVE_PHASES], limit=LIVE_SHOWN)
    health = handle.health(300.0)
    by_phase = health.get("notices_by_phase", {})
    phases = []
    for phase in LIVE_PHASES:
        rows = [_row(r, now, base) for r in live if r["phase"] == phase.value]
        rows.sort(key=lambda r: r["created_at"])
        count = by_phase.get(phase.value, 0)
        phases.append({"phase": phase.value, "count": count, "rows": rows, "has_rows": bool(rows)})
    data = {
        "title": "resetctl on-call",
        "at_risk": at_risk,
        "no_risk": not at_risk,
        "phases": phases,
        "shown": LIVE_SHOWN,
        "missing": bool(wanted),
        "sweep_lag": _ago(health.get("sweep_lag_seconds")),
        "last_sweep": _ago(health.get("seconds_since_last_sweep")),
        "ended": [
            {"phase": p, "count": n} for p, n in sorted(by_phase.items()) if p not in _LIVE_NAMES
        ],
    }
    return _render("index", {**data, "base": base}, 404 if wanted else 200)


_LIVE_NAMES = frozenset(p.value for p in LIVE_PHASES)


def _search(handle: Handle, wanted: str) -> str | None:
    """The notice ``wanted`` names: an id, else an idempotency key, else an account."""
    for how in ("notice_id", "key", "account"):
        try:
            report = handle.inspect(**{how: wanted})
        except NoticeNotFound:
            continue
        return str(report["notice_id"])
    return None


def notice(handle: Handle, notice_id: str, base: str = "") -> Reply:
    """``GET /notices/{id}``: the notice's timing and state, its timeline drawn, its next
    action and budget, attempts and history (NoticeNotFound: the 404 page)."""
    report = handle.inspect(notice_id)
    now = report_now(report) or handle.clock()
    action = report.get("next_action")
    budget = report.get("action_budget") or {}
    attempts = []
    for attempt in report.get("attempts") or []:
        last = attempt.get("last_observation") or {}
        attempts.append({**attempt, "last": last, "has_last": bool(last)})
    data = {
        "title": f"resetctl {report['notice_id']}",
        "report": report,
        "live": report["phase"] in _LIVE_NAMES,
        "remaining": _ago(report.get("remaining_seconds")),
        "state_age": _ago(report.get("state_age_seconds")),
        "action": action,
        "due": None if not action else _relative(action.get("due_in_seconds")),
        "budget": budget,
        "to_deadline": _relative(budget.get("seconds_to_fallback_deadline")),
        "needed": _ago(budget.get("needed_seconds")),
        "success": [
            {"channel": c, "statuses": ", ".join(s)}
            for c, s in (budget.get("success_statuses") or {}).items()
        ],
        "timeline": timeline_svg(report),
        "attempts": attempts,
        "history": report.get("history") or [],
        "lease": report.get("lease"),
        "generated": _clock_time(now),
        "base": base,
    }
    return _render("notice", data)


def _relative(seconds: object) -> str:
    """``in 2m`` or ``6m5s ago``."""
    if not isinstance(seconds, int | float):
        return "-"
    if abs(seconds) < 1:
        return "now"
    text = format_duration(abs(float(seconds)))
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _clock_time(now: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def not_found(base: str = "") -> Reply:
    """The page for a notice that does not exist."""
    data = {"title": "resetctl: no such notice", "refresh": None, "base": base}
    return _render("missing", data, 404)


def unauthorized(base: str = "") -> Reply:
    """401 with a Basic challenge, so a browser asks for the token (as the password)."""
    data = {"title": "resetctl: sign in", "refresh": None, "base": base}
    reply = _render("unauthorized", data, 401)
    challenge = ("WWW-Authenticate", 'Basic realm="resetctl on-call", charset="UTF-8"')
    return reply._replace(headers=(*reply.headers, challenge))
