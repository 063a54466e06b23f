"""The reader's language: enqueue's locale, template locale directories, plural forms."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, run_sweep

from resetctl.enqueue import enqueue
from resetctl.errors import InputError
from resetctl.render import (
    TEMPLATE_FILES,
    RenderModel,
    TemplateError,
    canonical_locale,
    minutes_phrase,
    render_email,
    render_sms,
    resolve_templates,
    template_data,
    templates_root,
)
from resetctl.report import notice_report
from resetctl.store import Store

URL = "https://market.example.com/reset?token=Zq3xR7vK2mN8pL4sT6wYb"
KEEP = {"keep_content": True}


def write_copy(directory: Path, label: str, messages: str | None = None) -> None:
    """A complete template directory whose every file says ``label``."""
    directory.mkdir(parents=True)
    for name in TEMPLATE_FILES:
        (directory / name).write_text(f"{label} {{{{{{minutes_phrase}}}}}}\n")
    if messages is not None:
        (directory / "messages.toml").write_text(messages)


def model(minutes: int = 10, locale: str | None = None) -> RenderModel:
    return RenderModel(URL, minutes, "Acme", "Ada", locale)


def attempts(store: Store, notice_id: str, now: float) -> list[dict[str, Any]]:
    report = notice_report(store, notice_id, now)
    return [
        {k: a[k] for k in ("channel", "template_version", "locale")} for a in report["attempts"]
    ]


def email_subject(store: Store, notice_id: str) -> str:
    (row,) = [m for m in store.outbox_messages(notice_id) if m["channel"] == "email"]
    shown = store.outbox_message(row["message_id"])
    assert shown is not None
    return str(shown["subject"])


@pytest.mark.parametrize(
    ("given", "stored"),
    [("es-MX", "es-MX"), ("es-mx", "es-MX"), ("ES", "es"), ("zh-hant-tw", "zh-Hant-TW"),
     ("es-419", "es-419"), ("pl", "pl")],
)  # fmt: skip
def test_enqueue_stores_the_locale_in_canonical_case(
    store: Store, clock: FakeClock, given: str, stored: str
) -> None:
    """A valid BCP 47 locale is stored on the notice in canonical case."""
    [result] = enqueue(store, make_settings(), [reset_request(locale=given)], clock())
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.locale == stored
    assert notice_report(store, result.notice_id, clock())["locale"] == stored


@pytest.mark.parametrize(
    "bad", ["es_MX", "xx", "en-US-x-private", "de-CH-1996", "und", "e", "en-", "", 5, "a" * 36]
)
def test_enqueue_rejects_a_bad_locale_naming_line_and_field(
    store: Store, clock: FakeClock, bad: object
) -> None:
    """A locale that is not a BCP 47 tag CLDR knows is refused by line and field, unechoed."""
    requests = [reset_request(), reset_request(locale=bad)]
    with pytest.raises(InputError) as excinfo:
        enqueue(store, make_settings(), requests, clock())
    [problem] = excinfo.value.problems
    assert problem.startswith("line 2: locale: ")
    if isinstance(bad, str) and len(bad) > 5:  # short ones occur in the message's example
        assert bad not in problem
    assert store.outbox_messages() == []


def test_canonical_locale_refuses_what_enqueue_refuses() -> None:
    """The same parser names template directories and checks enqueue's field."""
    assert canonical_locale("ja-jp") == "ja-JP"
    with pytest.raises(ValueError, match="language"):
        canonical_locale("klingon")


@pytest.mark.parametrize(
    ("present", "requested", "used"),
    [
        (["es-MX", "es"], "es-MX", "es-MX"),
        (["es"], "es-MX", "es"),
        ([], "es-MX", None),
        (["es-MX"], "es", None),  # a region's copy never serves the bare language
        (["es-MX", "es"], None, None),
        (["zh-Hant", "zh"], "zh-Hant-TW", "zh-Hant"),
        (["zh"], "zh-Hant-TW", "zh"),
        (["de"], "es-MX", None),
    ],
)
def test_locale_fallback_order(
    tmp_path: Path, present: list[str], requested: str | None, used: str | None
) -> None:
    """The most specific locale directory wins, then the language, then the default copy."""
    write_copy(tmp_path / "v2", "default")
    for name in present:
        write_copy(tmp_path / "v2" / name, name)

    email = render_email(model(locale=requested), "v2", root=tmp_path)
    sms = render_sms(model(locale=requested), "v2", root=tmp_path)

    assert email.locale == sms.locale == used
    assert email.subject.startswith(used or "default")
    assert resolve_templates("v2", requested, tmp_path).locale == used


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        ("en", {1: "1 minute", 2: "2 minutes", 5: "5 minutes", 21: "21 minutes"}),
        ("es", {1: "1 minuto", 2: "2 minutos", 5: "5 minutos", 21: "21 minutos"}),
        ("pl", {1: "1 minuta", 2: "2 minuty", 5: "5 minut", 12: "12 minut", 22: "22 minuty"}),
        ("ja", {1: "1 分", 2: "2 分", 5: "5 分"}),
    ],
)
def test_cldr_plural_forms(tmp_path: Path, language: str, expected: dict[int, str]) -> None:
    """Without wording of its own, a locale directory says "N minutes" as CLDR does."""
    write_copy(tmp_path / "v2" / language, language)
    templates = resolve_templates("v2", language, tmp_path)
    assert {n: minutes_phrase(n, templates) for n in expected} == expected


def test_messages_toml_wording_follows_cldr_plural_categories(tmp_path: Path) -> None:
    """A [minutes] table is chosen by the language's plural category (Polish one/few/many)."""
    wording = '[minutes]\none = "{n} minuta"\nfew = "{n} minuty"\nmany = "{n} minut"\nother = "?"\n'
    write_copy(tmp_path / "v2" / "pl", "pl", wording)
    templates = resolve_templates("v2", "pl", tmp_path)
    said = {n: minutes_phrase(n, templates) for n in (1, 2, 4, 5, 11, 22, 25, 112)}
    assert said == {
        1: "1 minuta",
        2: "2 minuty",
        4: "4 minuty",
        5: "5 minut",
        11: "11 minut",
        22: "22 minuty",
        25: "25 minut",
        112: "112 minut",
    }


def test_numbers_follow_the_readers_locale(tmp_path: Path) -> None:
    """es-MX reading the es copy groups 1440 as 1,440; Spain's reader sees 1.440."""
    write_copy(tmp_path / "v2" / "es", "es")
    spain = resolve_templates("v2", "es-ES", tmp_path)
    mexico = resolve_templates("v2", "es-MX", tmp_path)
    assert spain.locale == mexico.locale == "es"
    assert template_data(model(1440, "es-ES"), spain)["minutes_phrase"] == "1.440 minutos"
    assert template_data(model(1440, "es-MX"), mexico)["minutes_until_expiry"] == "1,440"


def test_default_copy_declares_its_language(tmp_path: Path) -> None:
    """A version's messages.toml names the default copy's language: German plurals there."""
    write_copy(tmp_path / "v2", "Standard", 'locale = "de"\n')
    email = render_email(model(1, locale="fr"), "v2", root=tmp_path)
    assert email.subject == "Standard 1 Minute"
    assert email.locale is None


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ('[minutes]\none = "{n} minuta"\n', "'other' is required"),
        ('[minutes]\nsome = "x"\nother = "y"\n', "CLDR plural categories"),
        ('colour = "blue"\n', "unknown key"),
        ('locale = "klingon"\n', "locale"),
        ("not toml = = \n", "messages.toml"),
    ],
)
def test_bad_messages_toml_is_a_template_error(tmp_path: Path, messages: str, problem: str) -> None:
    """A messages.toml mistake names the file and the key, not the data."""
    write_copy(tmp_path / "v2", "x", messages)
    with pytest.raises(TemplateError, match=problem):
        render_email(model(), "v2", root=tmp_path)


def test_built_in_spanish_copy(tmp_path: Path) -> None:
    """The built-in v1 has Spanish copy; its SMS stays in GSM-7 and within 2 segments."""
    reader = RenderModel(URL, 1, "Acme Market support", "Ana María", "es-MX")
    email = render_email(reader, "v1")
    sms = render_sms(reader, "v1", max_segments=2)
    assert email.subject == "Tu enlace para restablecer la contraseña (caduca en 1 minuto)"
    assert email.locale == sms.locale == "es"
    assert "Hola, Ana María:" in email.text
    assert '<html lang="es">' in email.html
    assert "1 min con este enlace" in sms.body
    assert (sms.encoding, sms.segments) == ("gsm7", 2)


def test_sweep_renders_in_the_readers_locale_and_records_it(store: Store, clock: FakeClock) -> None:
    """The attempt records the locale directory actually rendered (None: default copy)."""
    settings = make_settings(outbox=KEEP)
    spanish, japanese, unset = (
        enqueue(store, settings, [reset_request(locale=tag)], clock())[0].notice_id
        for tag in ("es-MX", "ja", None)
    )
    run_sweep(store, settings, clock)

    assert attempts(store, spanish, clock()) == [
        {"channel": "email", "template_version": "v1", "locale": "es"}
    ]
    assert email_subject(store, spanish).startswith("Tu enlace")
    for notice_id in (japanese, unset):
        assert attempts(store, notice_id, clock())[0]["locale"] is None
        assert email_subject(store, notice_id) == "Your password reset link (expires in 10 minutes)"


def test_operator_directory_overrides_the_built_ins(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """With [templates] dir set, a policy's version is read from there, not the package."""
    write_copy(tmp_path / "v1", "Acme copy")
    settings = make_settings(outbox=KEEP, templates={"dir": str(tmp_path)})
    [result] = enqueue(store, settings, [reset_request()], clock())
    run_sweep(store, settings, clock)
    assert email_subject(store, result.notice_id) == "Acme copy 10 minutes"


def test_template_version_change_affects_new_notices_only(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """Notices keep the template version of the policy they were enqueued under."""
    shutil.copytree(templates_root() / "v1", tmp_path / "v1")
    write_copy(tmp_path / "v2", "Nueva", None)
    write_copy(tmp_path / "v2" / "es", "Nueva es", None)
    first = make_settings(outbox=KEEP, templates={"dir": str(tmp_path)})
    second = make_settings(
        outbox=KEEP,
        templates={"dir": str(tmp_path)},
        policy={"default": {"version": 2, "template_version": "v2"}},
    )
    old = enqueue(store, first, [reset_request(locale="es")], clock())[0].notice_id
    new = enqueue(store, second, [reset_request(locale="es")], clock())[0].notice_id
    run_sweep(store, second, clock)

    assert attempts(store, old, clock()) == [
        {"channel": "email", "template_version": "v1", "locale": "es"}
    ]
    assert attempts(store, new, clock()) == [
        {"channel": "email", "template_version": "v2", "locale": "es"}
    ]
    assert email_subject(store, old).startswith("Tu enlace")
    assert email_subject(store, new).startswith("Nueva es 10 minutos")
