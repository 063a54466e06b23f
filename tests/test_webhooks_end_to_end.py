"""Provider webhooks end to end (issue 27): a bounce after acceptance escalates while the
link still has time, and each callback belongs to the instance it was addressed to.

Every notice is enqueued and swept through a handle opened on a TOML config in the test's
directory, its sends go to a fake provider on loopback (Postmark, Mailgun, Plivo), and its
webhooks are posted over real HTTP to ``resetctl.web.provider_callbacks`` under waitress on
loopback, signed by the fakes' own signers (never by the code under test). The handle,
the fakes and the sweep share one fake clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from conftest import FakeClock, reset_request
from providers_mailgun import API_KEY as MAILGUN_API_KEY
from providers_mailgun import DOMAIN as MAILGUN_DOMAIN
from providers_mailgun import SENDER as MAILGUN_SENDER
from providers_mailgun import SIGNING_KEY, FakeMailgun
from providers_plivo import AUTH_ID, AUTH_TOKEN, FakePlivo
from providers_plivo import SENDER as PLIVO_SENDER
from providers_postmark import SENDER as POSTMARK_SENDER
from providers_postmark import (
    TOKEN,
    WEBHOOK_PASSWORD,
    WEBHOOK_USERNAME,
    FakePostmark,
    PostmarkWebhookSender,
    credentialed,
    post_webhook,
    webhook_request,
)
from test_web_callbacks import serving

import resetctl
from resetctl.errors import ConfigError, SignatureMismatch
from resetctl.transports.base import CallbackRequest
from resetctl.transports.mailgun import WEBHOOK_MAX_AGE
from resetctl.web import provider_callbacks

ENVIRON = {
    "POSTMARK_SERVER_TOKEN": TOKEN,
    "POSTMARK_WEBHOOK_USERNAME": WEBHOOK_USERNAME,
    "POSTMARK_WEBHOOK_PASSWORD": WEBHOOK_PASSWORD,
    "MAILGUN_API_KEY": MAILGUN_API_KEY,
    "MAILGUN_WEBHOOK_SIGNING_KEY": SIGNING_KEY,
    "PLIVO_AUTH_ID": AUTH_ID,
    "PLIVO_AUTH_TOKEN": AUTH_TOKEN,
}
#: The recipient and link of every notice here: none of them may leave resetctl.
EMAIL = "dana.bounce@example.org"
PHONE = "+14155550199"
RESET_URL = "https://shop.example/reset/hook-secret-token-7f3a"
SECRETS = (EMAIL, PHONE, PHONE.lstrip("+"), RESET_URL, "hook-secret-token-7f3a")


class Mounts:
    """A WSGI application serving each instance's callbacks at ``/hooks/<instance>``,
    mounted once the server's port (written into the config) is known."""

    def __init__(self) -> None:
        self.apps: dict[str, Any] = {}

    def __call__(self, environ: Any, start_response: Any) -> Iterable[bytes]:
        app = self.apps.get(str(environ.get("PATH_INFO", "")))
        if app is None:
            start_response("404 Not Found", [("Content-Length", "0")])
            return []
        result: Iterable[bytes] = app(environ, start_response)
        return result


class Rig:
    """The loopback endpoint and a handle on a config file written for it."""

    def __init__(self, base: str, mounts: Mounts, tmp_path: Path, clock: FakeClock) -> None:
        self.base = base
        self.mounts = mounts
        self.tmp_path = tmp_path
        self.clock = clock
        self.handle: resetctl.Handle | None = None
        #: every HTTP answer the endpoint gave, for the privacy check
        self.responses: list[httpx.Response] = []

    def hook_url(self, instance: str) -> str:
        return f"{self.base}/hooks/{instance}"

    def open(self, config: str) -> resetctl.Handle:
        """Write ``config`` to config.toml and open a handle on it (the rig's clock)."""
        path = self.tmp_path / "config.toml"
        path.write_text(config, encoding="utf-8")
        self.handle = resetctl.open(
            self.tmp_path / "resetctl.db",
            path,
            clock=self.clock,
            sleep=self.clock.sleep,
            environ=ENVIRON,
            busy_timeout=5,
        )
        return self.handle

    def mount(self, instance: str) -> None:
        assert self.handle is not None
        self.mounts.apps[f"/hooks/{instance}"] = provider_callbacks(self.handle, instance)

    def post(self, url: str, request: CallbackRequest) -> httpx.Response:
        """POST ``request``'s body and headers to ``url`` over loopback."""
        response = httpx.post(url, content=request.body, headers=request.headers, timeout=30)
        self.responses.append(response)
        return response

    def notice(self) -> str:
        """Enqueue one notice to EMAIL, PHONE with RESET_URL, and sweep its first send."""
        assert self.handle is not None
        fields: dict[str, Any] = {"email": EMAIL, "phone": PHONE, "reset_url": RESET_URL}
        (result,) = self.handle.enqueue([reset_request(**fields)])
        assert result.notice_id is not None
        self.handle.sweep()
        return result.notice_id


@pytest.fixture
def rig(tmp_path: Path, clock: FakeClock) -> Iterator[Rig]:
    mounts = Mounts()
    with serving(mounts) as base:
        made = Rig(base, mounts, tmp_path, clock)
        try:
            yield made
        finally:
            if made.handle is not None:
                made.handle.close()


@pytest.fixture
def postmark(clock: FakeClock) -> Iterator[FakePostmark]:
    fake = FakePostmark(clock)
    yield fake
    fake.close()
    assert fake.problems == []


@pytest.fixture
def mailgun(clock: FakeClock) -> Iterator[FakeMailgun]:
    fake = FakeMailgun(clock)
    yield fake
    fake.close()
    assert fake.problems == []


@pytest.fixture
def plivo(clock: FakeClock) -> Iterator[FakePlivo]:
    fake = FakePlivo(clock)
    yield fake
    fake.close()
    assert fake.violations == []


def postmark_config(rig: Rig, postmark: FakePostmark) -> str:
    return f"""
[transport]
email = "postmark"

[postmark]
base_url = "{postmark.base_url}"
from = "{POSTMARK_SENDER}"
webhook_url = "{rig.hook_url("postmark")}"

[policy.default]
channels = ["email", "sms"]
"""


def mailgun_config(rig: Rig, mailgun: FakeMailgun, *instances: str) -> str:
    """Email through the Mailgun instances named (default: mailgun_eu alone), in order."""
    names = instances or ("mailgun_eu",)
    tables = "".join(
        f"""
[providers.{name}]
kind = "mailgun"
base_url = "{mailgun.base_url}"
domain = "{MAILGUN_DOMAIN}"
from = "{MAILGUN_SENDER}"
webhook_url = "{rig.hook_url(name)}"
"""
        for name in names
    )
    return f"""
[transport]
email = {json.dumps(list(names))}
{tables}
[policy.default]
channels = ["email", "sms"]
"""


def plivo_config(rig: Rig, plivo: FakePlivo) -> str:
    return f"""
[transport]
sms = ["plivo_main"]

[providers.plivo_main]
kind = "plivo"
base_url = "{plivo.base_url}"
from = "{PLIVO_SENDER}"
status_callback = "{rig.hook_url("plivo_main")}"

[policy.default]
channels = ["sms", "email"]
"""


def callbacks(handle: resetctl.Handle, notice_id: str) -> list[dict[str, Any]]:
    """The notice's history events that a callback wrote."""
    return [h for h in handle.inspect(notice_id)["history"] if h["kind"] == "callback"]


def observe_args(request: CallbackRequest) -> dict[str, Any]:
    """``request`` as handle.observe takes it."""
    return {"body": request.body, "url": request.url, "headers": request.headers}


def attempt(report: dict[str, Any], channel: str) -> dict[str, Any]:
    """The report's one attempt on ``channel``."""
    found: list[dict[str, Any]] = [a for a in report["attempts"] if a["channel"] == channel]
    (only,) = found
    return only


def postmark_sent(rig: Rig, postmark: FakePostmark) -> tuple[str, str]:
    """One email-first notice whose email Postmark took: (notice id, MessageID)."""
    rig.open(postmark_config(rig, postmark))
    rig.mount("postmark")
    notice_id = rig.notice()
    (message_id,) = postmark.sent
    return notice_id, message_id


# -- Postmark: a bounce after acceptance ----------------------------------------------


def test_a_postmark_hard_bounce_escalates_to_sms_while_the_link_has_time(
    rig: Rig, postmark: FakePostmark, clock: FakeClock
) -> None:
    """Queued by Postmark, then a verified HardBounce webhook: the next sweep sends the SMS."""
    notice_id, message_id = postmark_sent(rig, postmark)
    assert rig.handle is not None
    before = rig.handle.inspect(notice_id)
    email = attempt(before, "email")
    assert (before["phase"], email["state"]) == ("primary_pending", "submitted")
    assert email["last_observation"]["raw_status"] == "Queued"
    assert email["last_observation"]["status"] == "pending"
    assert postmark.sent[message_id]["Metadata"] == {"attempt_key": email["attempt_key"]}

    clock.advance(10)  # before the first poll: only the webhook can say it bounced
    bounce = PostmarkWebhookSender(postmark).bounce(message_id, "HardBounce")
    response = post_webhook(credentialed(rig.hook_url("postmark")), bounce)
    rig.responses.append(response)
    assert response.status_code == 204

    (event,) = callbacks(rig.handle, notice_id)
    assert (event["old_phase"], event["new_phase"]) == ("primary_pending", "fallback_pending")
    assert event["status"] == "failed"
    assert event["attempt_key"] == email["attempt_key"]
    # more than the policy's fallback reserve (3m) is left for the SMS
    assert rig.handle.inspect(notice_id)["remaining_seconds"] > 180
    assert rig.handle.outbox_messages(notice_id) == []

    rig.handle.sweep()

    report = rig.handle.inspect(notice_id)
    assert report["phase"] == "accepted"  # the outbox's SMS is delivered at once
    observed = attempt(report, "email")["last_observation"]
    assert (observed["source"], observed["raw_status"], observed["status"]) == (
        "callback",
        "HardBounce",
        "failed",
    )
    sms = attempt(report, "sms")
    assert (sms["transport"], sms["state"], sms["counts_as_success"]) == (
        "outbox",
        "submitted",
        True,
    )
    assert [m["channel"] for m in rig.handle.outbox_messages(notice_id)] == ["sms"]
    assert len(postmark.sent) == 1  # the bounced email is not sent again


def test_a_postmark_bounce_too_late_for_the_fallback_expires_the_notice(
    rig: Rig, postmark: FakePostmark, clock: FakeClock
) -> None:
    """A bounce read with less than the fallback reserve left sends no SMS: the notice expires."""
    notice_id, message_id = postmark_sent(rig, postmark)
    assert rig.handle is not None
    clock.advance(8 * 60)  # no sweep ran meanwhile: 2m left, under the 3m reserve
    bounce = PostmarkWebhookSender(postmark).bounce(message_id, "HardBounce")

    response = post_webhook(credentialed(rig.hook_url("postmark")), bounce)
    rig.handle.sweep()

    assert response.status_code == 204
    (event,) = callbacks(rig.handle, notice_id)
    assert (event["new_phase"], event["reason"]) == ("expired", "fallback_reserve_not_met")
    assert rig.handle.inspect(notice_id)["phase"] == "expired"
    assert rig.handle.outbox_messages(notice_id) == []


def test_a_replayed_postmark_bounce_is_stored_once(rig: Rig, postmark: FakePostmark) -> None:
    """Postmark's retry of the same Bounce record is a duplicate: one observation, one SMS."""
    notice_id, message_id = postmark_sent(rig, postmark)
    assert rig.handle is not None
    bounce = PostmarkWebhookSender(postmark).bounce(message_id, "HardBounce")
    url = credentialed(rig.hook_url("postmark"))

    answers = [post_webhook(url, bounce), post_webhook(url, bounce)]
    rig.responses += answers
    again = rig.handle.observe("postmark", **observe_args(webhook_request(bounce, url)))
    rig.handle.sweep()
    rig.handle.sweep()

    assert [a.status_code for a in answers] == [204, 204]
    assert again is not None
    assert again.duplicate
    assert len(callbacks(rig.handle, notice_id)) == 1
    assert [m["channel"] for m in rig.handle.outbox_messages(notice_id)] == ["sms"]


def test_a_postmark_webhook_with_wrong_credentials_is_403_and_records_nothing(
    rig: Rig, postmark: FakePostmark
) -> None:
    """A bounce posted with another password, another user or none is refused: 403, no trace."""
    notice_id, message_id = postmark_sent(rig, postmark)
    assert rig.handle is not None
    bounce = PostmarkWebhookSender(postmark).bounce(message_id, "HardBounce")
    hook = rig.hook_url("postmark")

    answers = [
        post_webhook(credentialed(hook, pw="not-the-hook-password-0"), bounce),
        post_webhook(credentialed(hook, user="someone-else"), bounce),
        post_webhook(hook, bounce),
    ]
    rig.responses += answers
    rig.handle.sweep()

    assert [a.status_code for a in answers] == [403, 403, 403]
    assert callbacks(rig.handle, notice_id) == []
    report = rig.handle.inspect(notice_id)
    assert report["phase"] == "primary_pending"
    assert attempt(report, "email")["last_observation"]["source"] == "submit"
    assert rig.handle.outbox_messages(notice_id) == []


# -- Mailgun: a named instance --------------------------------------------------------


def mailgun_failure(rig: Rig, mailgun: FakeMailgun) -> tuple[str, CallbackRequest]:
    """One notice whose email [providers.mailgun_eu] took, and Mailgun's signed webhook
    saying it failed for good."""
    notice_id = rig.notice()
    (message_id,) = mailgun.sent
    assert rig.handle is not None
    email = attempt(rig.handle.inspect(notice_id), "email")
    assert (email["transport"], email["last_observation"]["status"]) == ("mailgun_eu", "pending")
    return notice_id, mailgun.webhook(mailgun.event_data(message_id, "failed", "permanent"))


def assert_escalated_by_mailgun(handle: resetctl.Handle, notice_id: str) -> None:
    """The permanent failure was recorded as a callback and the SMS fallback went out."""
    (event,) = callbacks(handle, notice_id)
    assert (event["old_phase"], event["new_phase"]) == ("primary_pending", "fallback_pending")
    assert event["status"] == "failed"
    handle.sweep()
    report = handle.inspect(notice_id)
    observed = attempt(report, "email")["last_observation"]
    assert (observed["source"], observed["raw_status"]) == ("callback", "failed/permanent")
    sms = attempt(report, "sms")
    assert (report["phase"], sms["transport"], sms["state"]) == ("accepted", "outbox", "submitted")


def test_a_mailgun_permanent_failure_over_http_reaches_its_named_instance(
    rig: Rig, mailgun: FakeMailgun, clock: FakeClock
) -> None:
    """Posted to /hooks/mailgun_eu, a signed failed/permanent webhook escalates the notice."""
    rig.open(mailgun_config(rig, mailgun))
    rig.mount("mailgun_eu")
    notice_id, request = mailgun_failure(rig, mailgun)
    clock.advance(5)

    assert rig.post(rig.hook_url("mailgun_eu"), request).status_code == 204
    assert rig.handle is not None
    assert_escalated_by_mailgun(rig.handle, notice_id)


def test_a_mailgun_permanent_failure_through_observe_reaches_its_named_instance(
    rig: Rig, mailgun: FakeMailgun
) -> None:
    """handle.observe("mailgun_eu", …) routes by the instance name to the mailgun kind."""
    handle = rig.open(mailgun_config(rig, mailgun))
    notice_id, request = mailgun_failure(rig, mailgun)

    result = handle.observe("mailgun_eu", **observe_args(request))

    assert result is not None
    assert (result.notice_id, result.channel, result.status) == (notice_id, "email", "failed")
    assert (result.old_phase, result.duplicate) == ("primary_pending", False)
    assert_escalated_by_mailgun(handle, notice_id)


def test_a_stale_mailgun_webhook_is_refused_and_records_nothing(
    rig: Rig, mailgun: FakeMailgun, clock: FakeClock
) -> None:
    """A correctly signed webhook whose timestamp is past the window: 403, nothing stored."""
    handle = rig.open(mailgun_config(rig, mailgun))
    rig.mount("mailgun_eu")
    notice_id = rig.notice()
    (message_id,) = mailgun.sent
    event = mailgun.event_data(message_id, "failed", "permanent")
    stale = mailgun.webhook(event, timestamp=str(int(clock() - WEBHOOK_MAX_AGE - 1)))

    assert rig.post(rig.hook_url("mailgun_eu"), stale).status_code == 403
    with pytest.raises(SignatureMismatch):
        handle.observe("mailgun_eu", **observe_args(stale))
    handle.sweep()

    assert callbacks(handle, notice_id) == []
    assert handle.inspect(notice_id)["phase"] == "primary_pending"
    assert handle.outbox_messages(notice_id) == []


def test_a_mailgun_webhook_belongs_to_the_instance_that_sent_the_message(
    rig: Rig, mailgun: FakeMailgun
) -> None:
    """To another instance of the same kind it is 404 and records nothing; to its own, recorded."""
    handle = rig.open(mailgun_config(rig, mailgun, "mailgun_eu", "mailgun_us"))
    rig.mount("mailgun_eu")
    rig.mount("mailgun_us")
    notice_id, request = mailgun_failure(rig, mailgun)

    elsewhere = rig.post(rig.hook_url("mailgun_us"), request)
    assert elsewhere.status_code == 404
    assert callbacks(handle, notice_id) == []
    assert handle.inspect(notice_id)["phase"] == "primary_pending"

    assert rig.post(rig.hook_url("mailgun_eu"), request).status_code == 204
    assert_escalated_by_mailgun(handle, notice_id)


# -- Plivo: an SMS-first notice ---------------------------------------------------------


def plivo_sent(rig: Rig, plivo: FakePlivo) -> tuple[str, str, str]:
    """One SMS-first notice Plivo took: (notice id, MessageUUID, the attempt key)."""
    rig.open(plivo_config(rig, plivo))
    rig.mount("plivo_main")
    notice_id = rig.notice()
    (message_uuid,) = plivo.messages
    assert rig.handle is not None
    key = attempt(rig.handle.inspect(notice_id), "sms")["attempt_key"]
    return notice_id, message_uuid, key


def test_a_plivo_delivered_callback_ends_an_sms_first_notice_accepted(
    rig: Rig, plivo: FakePlivo
) -> None:
    """The callback URL the send gave carries attempt=<key>; its signed "delivered" ends it."""
    notice_id, message_uuid, key = plivo_sent(rig, plivo)
    url = plivo.sent[message_uuid]["url"]
    assert url.startswith(rig.hook_url("plivo_main") + "?")
    assert parse_qs(urlsplit(url).query) == {"attempt": [key]}

    assert rig.post(url, plivo.callback(message_uuid, "delivered")).status_code == 204

    assert rig.handle is not None
    report = rig.handle.inspect(notice_id)
    assert report["phase"] == "accepted"
    observed = attempt(report, "sms")["last_observation"]
    assert (observed["source"], observed["raw_status"]) == ("callback", "delivered")
    rig.handle.sweep()
    assert len(plivo.requests) == 1
    assert rig.handle.outbox_messages(notice_id) == []


def test_a_forged_plivo_signature_is_403(rig: Rig, plivo: FakePlivo) -> None:
    """A callback signed with another token, or re-signed for a changed body, is refused."""
    notice_id, message_uuid, _ = plivo_sent(rig, plivo)
    good = plivo.callback(message_uuid, "delivered")
    other = plivo.callback(message_uuid, "delivered", nonce="11111111111111111111")
    wrong_nonce = CallbackRequest(good.url, {**good.headers, **_nonce(other)}, good.body)
    changed = CallbackRequest(good.url, good.headers, good.body.replace(b"delivered", b"read"))
    unsigned = CallbackRequest(good.url, {"content-type": good.headers["content-type"]}, good.body)

    answers = [rig.post(good.url, r) for r in (wrong_nonce, changed, unsigned)]

    assert [a.status_code for a in answers] == [403, 403, 403]
    assert rig.handle is not None
    assert callbacks(rig.handle, notice_id) == []
    assert rig.handle.inspect(notice_id)["phase"] == "primary_pending"


def _nonce(request: CallbackRequest) -> dict[str, str]:
    """The V3 nonce header alone (its signature stays the original's)."""
    return {"x-plivo-signature-v3-nonce": request.headers["x-plivo-signature-v3-nonce"]}


# -- the endpoint knows no provider ----------------------------------------------------


def test_the_outbox_takes_no_callbacks(rig: Rig, postmark: FakePostmark) -> None:
    """observe (and mounting) of the outbox instance is a ConfigError saying it takes none."""
    handle = rig.open(postmark_config(rig, postmark))
    body = json.dumps({"RecordType": "Bounce"})

    with pytest.raises(ConfigError, match=r"outbox \(outbox\) takes no callbacks"):
        handle.observe("outbox", body=body, url=rig.hook_url("outbox"))
    with pytest.raises(ConfigError, match="takes no callbacks"):
        provider_callbacks(handle, "outbox")


def test_an_unknown_instance_is_a_config_error_naming_it(rig: Rig, postmark: FakePostmark) -> None:
    """A callback for an instance the config does not name is refused, naming the instance."""
    handle = rig.open(postmark_config(rig, postmark))

    with pytest.raises(ConfigError, match="'postmark_us'"):
        handle.observe("postmark_us", body=b"{}", url=rig.hook_url("postmark_us"))
    with pytest.raises(ConfigError, match="'postmark_us'"):
        provider_callbacks(handle, "postmark_us")


# -- nothing secret leaves -------------------------------------------------------------


Flow = Callable[[Rig, pytest.FixtureRequest], None]


def _postmark_flow(rig: Rig, request: pytest.FixtureRequest) -> None:
    postmark: FakePostmark = request.getfixturevalue("postmark")
    _, message_id = postmark_sent(rig, postmark)
    bounce = PostmarkWebhookSender(postmark).bounce(message_id, "HardBounce")
    hook = rig.hook_url("postmark")
    for url in (credentialed(hook, pw="not-the-hook-password-0"), credentialed(hook)):
        rig.responses.append(post_webhook(url, bounce))
    rig.responses.append(post_webhook(credentialed(hook), {"RecordType": 7, "Email": EMAIL}))


def _mailgun_flow(rig: Rig, request: pytest.FixtureRequest) -> None:
    mailgun: FakeMailgun = request.getfixturevalue("mailgun")
    rig.open(mailgun_config(rig, mailgun))
    rig.mount("mailgun_eu")
    _, good = mailgun_failure(rig, mailgun)
    forged = mailgun.webhook(json.loads(good.body)["event-data"], key="not-the-signing-key")
    for webhook in (forged, good, good):
        rig.post(rig.hook_url("mailgun_eu"), webhook)


def _plivo_flow(rig: Rig, request: pytest.FixtureRequest) -> None:
    plivo: FakePlivo = request.getfixturevalue("plivo")
    _, message_uuid, _ = plivo_sent(rig, plivo)
    good = plivo.callback(message_uuid, "delivered")
    forged = CallbackRequest(good.url, good.headers, good.body.replace(b"delivered", b"failed"))
    for callback in (forged, good, good):
        rig.post(good.url, callback)


@pytest.mark.parametrize("flow", [_postmark_flow, _mailgun_flow, _plivo_flow])
def test_no_answer_or_log_line_carries_the_recipient_or_the_link(
    rig: Rig, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, flow: Flow
) -> None:
    """Sends, refused and taken webhooks, sweeps: no answer or log line holds a contact or link."""
    caplog.set_level("DEBUG")
    flow(rig, request)
    assert rig.handle is not None
    rig.handle.sweep()

    assert {r.status_code for r in rig.responses} >= {204, 403}
    answers = "\n".join(f"{r.status_code} {r.headers} {r.text}" for r in rig.responses)
    for secret in SECRETS:
        assert secret not in answers
        assert secret not in caplog.text
    assert "callback" in caplog.text  # the endpoint did log what it did
