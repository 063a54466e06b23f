"""`[providers.<name>]` instances in the config: each mistake named by its key, a region's
own instance list honoured, and a named instance's callbacks routed by its name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep
from providers_twilio import FakeTwilio
from test_transport_twilio import ACCOUNT_SID, AUTH_TOKEN, SENDER

from resetctl.config import load_settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.store import Store
from resetctl.transports import build_transports, close_transports
from resetctl.transports.twilio import callback_url_for_attempt, compute_signature

ENVIRON = {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
BOX = {"kind": "outbox"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"providers": {"Bad-Name": BOX}}, r"^providers\.Bad-Name: an instance name is"),
        ({"providers": {"a": {"from": "x"}}}, r"^providers\.a\.kind: expected a transport kind"),
        ({"providers": {"a": {"kind": "pigeon"}}}, r"^providers\.a\.kind: unknown transport"),
        ({"transport": {"sms": ["a"]}}, r"^transport\.sms: no provider instance a "),
        (
            {"providers": {"a": BOX}, "transport": {"sms": ["a", "a"]}},
            r"^transport\.sms: an instance may appear once",
        ),
        ({"providers": {"a": BOX}, "transport": {"sms": []}}, r"^transport\.sms: expected"),
        (
            {"providers": {"twilio": {"kind": "twilio"}}, "twilio": {"from": SENDER}},
            r"^providers\.twilio: twilio is also a top-level \[twilio\] table",
        ),
        (
            {"policy": {"eu": {"sms": {"providers": ["nowhere"]}}}},
            r"^policy\.eu\.sms\.providers: no provider instance nowhere",
        ),
        ({"failover": {"after": 0}}, r"^failover\.after: expected a whole number"),
        ({"failover": {"cooldown": "2h"}}, r"^failover\.cooldown: expected at most 1h"),
        ({"failover": {"patience": 3}}, r"^failover\.patience: unknown key"),
        (
            {"providers": {"a": {"kind": "outbox", "sms_status": "maybe"}}},
            r"^providers\.a\.sms_status: must be one of",
        ),
        (
            {"providers": {"a": {"kind": "outbox", "max_in_flight": 0}}},
            r"^providers\.a\.max_in_flight: expected a whole number",
        ),
    ],
)
def test_each_mistake_names_its_key(config: dict[str, Any], message: str) -> None:
    """A bad instance table, list or [failover] value is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=message):
        make_settings(**config)


def test_a_config_file_error_names_the_file_and_line(tmp_path: Path) -> None:
    """As every config error does: the file, the line of the offending key, the key."""
    path = tmp_path / "resetctl.toml"
    path.write_text('[transport]\nsms = ["main"]\n\n[providers.main]\nkind = "fax"\n')
    with pytest.raises(ConfigError, match=r"resetctl\.toml, line 5: providers\.main\.kind"):
        load_settings(path)


def test_a_named_instance_of_a_kind_that_cannot_serve_the_channel_fails_the_build(
    store: Store, clock: FakeClock
) -> None:
    """A postmark instance named for SMS is refused before anything is claimed."""
    settings = make_settings(
        providers={"mail": {"kind": "postmark", "from": "no-reply@shop.example"}},
        transport={"sms": ["mail"]},
    )
    with pytest.raises(ConfigError, match=r"transport\.sms: mail \(postmark\) cannot send sms"):
        build_transports(settings, store, clock, {"POSTMARK_SERVER_TOKEN": "t"})


def test_a_region_with_its_own_list_goes_through_it(store: Store, clock: FakeClock) -> None:
    """[policy.eu.sms] providers sends eu's texts through its own instance; other regions
    go through [transport]'s."""
    settings = make_settings(
        providers={"box_us": BOX, "box_eu": BOX},
        transport={"sms": ["box_us"]},
        policy={
            "default": {"channels": ["sms"]},
            "eu": {"channels": ["sms"], "sms": {"providers": ["box_eu"]}},
        },
    )
    (us,) = enqueue(store, settings, [reset_request()], clock())
    (eu,) = enqueue(store, settings, [reset_request(region="eu")], clock())
    transports = build_transports(settings, store, clock, {})
    try:
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)
    assert [a["transport"] for a in store.attempt_rows(us.notice_id or "")] == ["box_us"]
    assert [a["transport"] for a in store.attempt_rows(eu.notice_id or "")] == ["box_eu"]


def test_observe_routes_a_callback_by_the_instance_name(
    db: str, store: Store, twilio: FakeTwilio, tmp_path: Path
) -> None:
    """`resetctl observe sms_main` verifies a Twilio callback for the instance called
    sms_main, the signature given as a --header."""
    callback = "https://hooks.example/sms_main"
    data: dict[str, Any] = {
        "transport": {"sms": ["sms_main"]},
        "providers": {
            "sms_main": {
                "kind": "twilio",
                "base_url": twilio.base_url,
                "from": SENDER,
                "status_callback": callback,
            }
        },
        "policy": {"default": {"channels": ["sms"]}},
    }
    settings = make_settings(**data)
    clock = FakeClock()
    (result,) = enqueue(store, settings, [reset_request()], clock())
    transports = build_transports(settings, store, clock, ENVIRON)
    try:
        run_sweep(store, settings, clock, transports)
    finally:
        close_transports(transports)
    (attempt,) = store.attempt_rows(result.notice_id or "")
    url = callback_url_for_attempt(callback, attempt["attempt_key"])
    params = {"MessageSid": attempt["message_id"], "MessageStatus": "delivered"}
    config = tmp_path / "resetctl.toml"
    config.write_text(
        '[transport]\nsms = ["sms_main"]\n[policy.default]\nchannels = ["sms"]\n'
        f'[providers.sms_main]\nkind = "twilio"\nbase_url = "{twilio.base_url}"\n'
        f'from = "{SENDER}"\nstatus_callback = "{callback}"\n',
        encoding="utf-8",
    )
    signature = compute_signature(url, params, AUTH_TOKEN)
    args = ("observe", "sms_main", "--url", url, "--config", str(config), "--json")
    done = resetctl(
        *args,
        "--header",
        f"X-Twilio-Signature: {signature}",
        db=db,
        input=urlencode(params),
        env=ENVIRON,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["new_phase"] == "accepted"
    wrong = resetctl(*args, "--header", "no colon here", db=db, input="", env=ENVIRON)
    assert wrong.returncode == 2
    assert "--header" in wrong.stderr
    unknown = resetctl(*("observe", "sms_spare", "--url", url, "--config", str(config)), db=db)
    assert unknown.returncode == 2
    assert "sms_spare" in unknown.stderr
