"""The on-call page of `resetctl serve`: its timeline drawn from the inspect document, the
index of what is at risk and live, the search, its credentials, and the notice page as
headless Chromium renders it (as the template preview test opens email), with no contact
datum or link anywhere in it."""

from __future__ import annotations

import struct
import subprocess
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import FakeClock
from serving import TOKENS, Server, serve_process, write_tokens

import resetctl
from resetctl import api
from resetctl.serve.timeline import COLOURS, marks, timeline_svg

CHROMIUM = Path("/usr/bin/chromium")
CONFIG = """\
[serve]
tokens_file = "tokens.toml"
[outbox]
email_status = "pending"
sms_status = "pending"
[policy.default]
channels = ["email", "sms"]
ttl = "30m"
[policy.default.email]
poll_delays = [10, 30, 60]
[policy.default.sms]
poll_delays = [60, 120, 150]
"""
CANARY_EMAIL = "canary.page@example.com"
CANARY_PHONE = "+14155550177"
CANARY_URL = "https://shop.example/reset/PAGE-CANARY-91c2"
CANARIES = (CANARY_EMAIL, CANARY_PHONE, CANARY_URL, *(token for token, _ in TOKENS.values()))


class Page:
    """The module's server and the notice drawn on it: enqueued four minutes ago, its
    email polled until the budget was spent, the SMS fallback claimed and polled, the
    next SMS poll overdue (no sweep runs now)."""

    def __init__(self, server: Server, db: Path, config: Path, notice_id: str) -> None:
        self.server = server
        self.db = db
        self.config = config
        self.notice_id = notice_id

    def get(self, path: str, caller: str | None = "reader", **options: Any) -> httpx.Response:
        if caller is not None:
            options.setdefault("auth", ("on-call", TOKENS[caller][0]))
        return httpx.get(self.server.base + path, timeout=30, **options)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    directory = tmp_path_factory.mktemp("page")
    config = directory / "resetctl.toml"
    config.write_text(CONFIG, encoding="utf-8")
    write_tokens(directory / "tokens.toml")
    db = directory / "resetctl.db"
    clock = FakeClock(time.time() - 240)
    with resetctl.open(db, config, clock=clock, sleep=clock.sleep) as handle:
        contact = {"email": CANARY_EMAIL, "phone": CANARY_PHONE, "reset_url": CANARY_URL}
        request = {"idempotency_key": "page-key-1", "account_ref": "acct-page", **contact}
        (result,) = handle.enqueue([request], send=True)
        for _ in range(9):
            clock.advance(20)
            handle.sweep()
    assert result.notice_id is not None
    with serve_process(db, config) as server:
        yield Page(server, db, config, result.notice_id)


def inspected(page: Page) -> dict[str, Any]:
    with api.open(page.db, page.config, create=False) as handle:
        return handle.inspect(page.notice_id)


class _Html(HTMLParser):
    """Tags, their classes, and the text of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.classes: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.classes += [v or "" for k, v in attrs if k == "class"]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(html: str) -> _Html:
    found = _Html()
    found.feed(html)
    return found


def test_the_timeline_is_drawn_from_the_inspect_document() -> None:
    """Every timeline element comes from the inspect document, and its text is escaped."""
    report = {
        "notice_id": "ntc_x",
        "phase": "fallback_pending",
        "reason": "poll_scheduled",
        "channels": ["email", "sms"],
        "created_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T00:30:00Z",
        "phase_since": "2026-01-01T00:01:00Z",
        "state_age_seconds": 180.0,
        "next_action": {"action": "poll", "channel": "sms", "due_at": "2026-01-01T00:05:00Z"},
        "action_budget": {"fallback_channel": "sms", "fallback_deadline": "2026-01-01T00:27:00Z"},
        "attempts": [
            {
                "channel": "email",
                "attempt_key": "ntc_x:email:1",
                "started_at": "2026-01-01T00:00:00Z",
                "submitted_at": "2026-01-01T00:00:01Z",
                "last_observation": {"at": "2026-01-01T00:01:00Z", "status": "pending"},
            },
            {
                "channel": "sms",
                "attempt_key": "ntc_x:sms:1",
                "started_at": "2026-01-01T00:01:00Z",
                "submitted_at": "2026-01-01T00:01:02Z",
                "last_observation": None,
            },
        ],
        "history": [
            {"at": "2026-01-01T00:00:30Z", "kind": "poll", "attempt_key": "ntc_x:email:1",
             "status": "pending", "old_phase": "primary_pending", "new_phase": "primary_pending"},
            {"at": "2026-01-01T00:01:00Z", "kind": "poll", "attempt_key": "ntc_x:email:1",
             "status": "pending", "old_phase": "primary_pending", "new_phase": "fallback_pending",
             "reason": "budget_spent_escalate"},
            {"at": "2026-01-01T00:02:00Z", "kind": "callback", "attempt_key": "ntc_x:sms:1",
             "status": "<b>odd</b>", "old_phase": "fallback_pending",
             "new_phase": "fallback_pending"},
        ],
    }  # fmt: skip
    rows, found, deadlines = marks(report)
    assert rows == ["notice", "email (primary)", "sms (fallback)"]
    t0 = 1767225600.0
    kinds = Counter((m.kind, m.row) for m in found)
    assert kinds == {
        ("enqueue", 0): 1,
        ("fallback-claim", 0): 1,
        ("intent", 1): 1,
        ("submission", 1): 1,
        ("observation", 1): 2,  # 00:00:30 and 00:01:00 (the last observation is one of them)
        ("intent", 2): 1,
        ("submission", 2): 1,
        ("observation", 2): 1,
        ("next-action", 2): 1,
    }
    claim = next(m for m in found if m.kind == "fallback-claim")
    assert claim.at == t0 + 60
    assert deadlines == {"fallback-deadline": t0 + 27 * 60, "expiry": t0 + 30 * 60, "now": t0 + 240}
    svg = timeline_svg(report)
    for kind in ("enqueue", "submission", "observation", "fallback-claim", "next-action"):
        assert f'class="mark {kind}"' in svg
    for kind in ("fallback-deadline", "expiry", "now"):
        assert f'class="deadline {kind}"' in svg
    assert "<b>" not in svg
    assert "&lt;b&gt;odd&lt;/b&gt;" in svg


def test_long_after_a_notice_ended_now_is_a_label_not_the_axis() -> None:
    """Long after a notice ended, its axis ends with it and now is a label at the edge."""
    report = {
        "phase": "accepted",
        "reason": "accepted",
        "channels": ["email"],
        "created_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T00:10:00Z",
        "phase_since": "2026-01-01T00:00:02Z",
        "state_age_seconds": 3 * 3600.0,
        "attempts": [],
        "history": [
            {"at": "2026-01-01T00:00:02Z", "old_phase": "primary_pending", "new_phase": "accepted"}
        ],
    }
    svg = timeline_svg(report)
    assert 'class="deadline now"' not in svg
    assert 'class="deadline expiry"' in svg
    assert "now: 2h50m2s later →" in svg  # after the expiry, the last thing drawn
    assert 'class="mark ended"' in svg
    live = {**report, "phase": "primary_pending", "state_age_seconds": 60.0}
    assert 'class="deadline now"' in timeline_svg(live)


@pytest.mark.slow
def test_the_page_takes_the_read_token_as_basic_credentials(page: Page) -> None:
    """The page takes the read token as Basic password: 401 challenge, 401, 403, then 200."""
    missing = page.get("/", caller=None)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"] == 'Basic realm="resetctl on-call", charset="UTF-8"'
    assert "text/html" in missing.headers["Content-Type"]
    wrong = page.get("/", caller=None, auth=("on-call", TOKENS["reader"][0] + "x"))
    assert wrong.status_code == 401
    assert page.get("/", caller="app").status_code == 403
    assert page.get("/").status_code == 200
    bearer = {"Authorization": f"Bearer {TOKENS['oncall'][0]}"}
    assert page.get("/", caller=None, headers=bearer).status_code == 200


@pytest.mark.slow
def test_the_index_shows_what_is_at_risk_and_the_live_notices(page: Page) -> None:
    """The index lists the notices at risk, then the live ones by phase; no secret."""
    clock = FakeClock(time.time() - 300)
    with resetctl.open(page.db, page.config, clock=clock) as handle:
        request = {"idempotency_key": "page-at-risk", "email": CANARY_EMAIL, "ttl": "6m30s"}
        (risky,) = handle.enqueue([{**request, "reset_url": CANARY_URL}])
    response = page.get("/")
    assert response.status_code == 200
    html = response.text
    at_risk, live = html.split("<h1>Live notices</h1>")
    assert risky.notice_id in at_risk
    assert page.notice_id not in at_risk
    fallback = live.split("<h2>fallback_pending")[1].split("<h2>")[0]
    assert page.notice_id in fallback
    assert f'href="/notices/{page.notice_id}"' in fallback
    assert '<meta http-equiv="refresh" content="30">' in html
    assert not [c for c in CANARIES if c in html]


@pytest.mark.slow
def test_a_search_by_id_key_or_account_goes_to_the_notice(page: Page) -> None:
    """A search by id, key or account redirects to the notice; a miss is 404, unrepeated."""
    for wanted in (page.notice_id, "page-key-1", "acct-page"):
        found = page.get(f"/?q={wanted}", follow_redirects=False)
        assert found.status_code == 303
        assert found.headers["Location"] == f"/notices/{page.notice_id}"
    nothing = page.get(f"/?q={CANARY_EMAIL}")
    assert nothing.status_code == 404
    assert "No notice has that id, idempotency key or account." in nothing.text
    assert CANARY_EMAIL not in nothing.text
    assert page.get("/notices/ntc_000000").status_code == 404


@pytest.mark.slow
def test_the_notice_page_shows_its_state_and_timeline_without_a_secret(page: Page) -> None:
    """The notice page: state, budget, every timeline element; no script, no secret."""
    response = page.get(f"/notices/{page.notice_id}")
    assert response.status_code == 200
    html = response.text
    found = parsed(html)
    assert "script" not in found.tags
    assert "svg" in found.tags
    csp = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp
    assert "script-src" not in csp  # none: default-src covers it
    for kind in ("enqueue", "submission", "observation", "fallback-claim", "next-action"):
        assert f"mark {kind}" in found.classes
    for kind in ("fallback-deadline", "expiry", "now"):
        assert f"deadline {kind}" in found.classes
    text = " ".join(" ".join(found.text).split())
    assert "fallback_pending" in text
    assert "poll sms" in text
    assert "budget_spent_escalate" in text
    assert not [c for c in CANARIES if c in html]


def _pixels(png: bytes) -> tuple[int, int, list[bytes], int]:
    """Width, height, rows of pixels and bytes per pixel of an 8-bit RGB(A) PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    offset, data = 8, b""
    width = height = channels = 0
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        kind, chunk = png[offset + 4 : offset + 8], png[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8
            channels = {2: 3, 6: 4}[colour]
        elif kind == b"IDAT":
            data += chunk
        offset += 12 + length
    raw, stride, rows = zlib.decompress(data), width * channels, []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = previous[x]
            c = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows, channels


def _columns(png: bytes) -> dict[str, int]:
    """For each timeline colour, the screenshot's column holding most of its pixels (a
    mark's centre, a deadline's line); absent colours are left out."""
    width, _, rows, channels = _pixels(png)
    wanted = {bytes.fromhex(colour[1:]): kind for kind, colour in COLOURS.items()}
    found: dict[str, Counter[int]] = {}
    for row in rows:
        for x in range(width):
            kind = wanted.get(row[x * channels : x * channels + 3])
            if kind is not None:
                found.setdefault(kind, Counter())[x] += 1
    return {kind: counts.most_common(1)[0][0] for kind, counts in found.items()}


def _chromium(url: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--force-device-scale-factor=1",
            f"--user-data-dir={tmp_path / 'chromium'}",
            *options,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_chromium_draws_the_timeline_and_shows_no_secret(page: Page, tmp_path: Path) -> None:
    """Chromium draws the timeline's marks in time order, on a phone too; no secret in its DOM."""
    host = page.server.base.removeprefix("http://")
    url = f"http://on-call:{TOKENS['reader'][0]}@{host}/notices/{page.notice_id}"
    screenshot = tmp_path / "notice.png"
    _chromium(url, tmp_path, f"--screenshot={screenshot}", "--window-size=1100,700")
    columns = _columns(screenshot.read_bytes())
    order = ["enqueue", "fallback-claim", "now", "fallback-deadline", "expiry"]
    assert set(order) <= set(columns), columns
    assert [columns[kind] for kind in order] == sorted(columns[kind] for kind in order), columns
    assert "submission" in columns
    report = inspected(page)
    assert report["phase"] == "fallback_pending"
    dom = _chromium(url, tmp_path, "--dump-dom").stdout
    assert 'class="timeline"' in dom
    assert page.notice_id in dom
    assert not [c for c in CANARIES if c in dom]

    phone = tmp_path / "phone.png"
    _chromium(url, tmp_path, f"--screenshot={phone}", "--window-size=390,1400")
    on_phone = _columns(phone.read_bytes())
    assert {"enqueue", "fallback-claim", "now"} <= set(on_phone), on_phone
    assert on_phone["enqueue"] < on_phone["now"] < 390


def test_mounted_under_a_prefix_its_links_and_redirects_carry_it(tmp_path: Path) -> None:
    """Mounted under /resetctl, its links, redirects and Location start with /resetctl."""
    from flask import Flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from resetctl.serve import load_tokens, serve_app

    tokens = load_tokens(write_tokens(tmp_path / "tokens.toml"))
    with resetctl.open(tmp_path / "resetctl.db") as handle:
        request = {"idempotency_key": "mounted", "email": CANARY_EMAIL, "reset_url": CANARY_URL}
        (result,) = handle.enqueue([request])
        app = Flask("marketplace")
        app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
            app.wsgi_app, {"/resetctl": serve_app(handle, tokens)}
        )
        client = app.test_client()
        reader = {"Authorization": f"Bearer {TOKENS['reader'][0]}"}
        index = client.get("/resetctl/", headers=reader).get_data(as_text=True)
        found = client.get("/resetctl/?q=mounted", headers=reader)
        created = client.post(
            "/resetctl/v1/notices",
            json={"email": CANARY_EMAIL, "reset_url": CANARY_URL},
            headers={"Authorization": f"Bearer {TOKENS['app'][0]}", "Idempotency-Key": "m-2"},
        )
    assert f'href="/resetctl/notices/{result.notice_id}"' in index
    assert 'action="/resetctl/"' in index
    assert found.status_code == 303
    assert found.headers["Location"] == f"/resetctl/notices/{result.notice_id}"
    assert created.status_code == 201
    assert created.headers["Location"] == f"/resetctl/v1/notices/{created.json['notice_id']}"
