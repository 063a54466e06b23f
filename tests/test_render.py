"""Templates, SMS encoding and segment counts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from resetctl.render import (
    EMAIL_HTML_FILE,
    EMAIL_SUBJECT_FILE,
    EMAIL_TEXT_FILE,
    SMS_FILE,
    EmailContent,
    RenderModel,
    SmsContent,
    SmsEncoding,
    SmsTooLong,
    TemplateError,
    TemplateSet,
    canonical_locale,
    load_messages,
    minutes_until_expiry,
    render_email,
    render_sms,
    sms_encoding,
    sms_segments,
    template_data,
    templates_root,
)

# 60 characters, the length the SMS budget is sized for.
RESET_URL = "https://market.example.com/reset?token=Zq3xR7vK2mN8pL4sT6wYb"
HOSTILE_NAME = "<script>&\"'"
EMOJI = "\U0001f600"  # outside the BMP: a surrogate pair in UTF-16

ModelFactory = Callable[..., RenderModel]


@pytest.fixture
def make_model() -> ModelFactory:
    def make(
        *,
        reset_url: str = RESET_URL,
        minutes_until_expiry: int = 10,
        support_label: str = "Acme Market support",
        display_name: str | None = "Ada Lovelace",
    ) -> RenderModel:
        return RenderModel(reset_url, minutes_until_expiry, support_label, display_name)

    return make


def render_all(model: RenderModel) -> tuple[EmailContent, SmsContent]:
    return render_email(model, "v1"), render_sms(model, "v1")


def test_hostile_display_name_is_escaped_in_html(make_model: ModelFactory) -> None:
    """HTML escapes a display name; the text body and the SMS keep it intact."""
    email, sms = render_all(make_model(display_name=HOSTILE_NAME))

    assert "&lt;script&gt;&amp;&quot;'" in email.html
    assert "<script>" not in email.html
    assert f"Hi {HOSTILE_NAME}," in email.text
    assert f"Hi {HOSTILE_NAME}," in sms.body


def test_reset_url_appears_in_every_body(make_model: ModelFactory) -> None:
    """The reset URL is in the text, the HTML link target and the SMS, never the subject."""
    email, sms = render_all(make_model())

    assert RESET_URL in email.text
    assert f'href="{RESET_URL}"' in email.html
    assert RESET_URL in sms.body
    assert RESET_URL not in email.subject


def test_ampersand_in_url_is_escaped_inside_href(make_model: ModelFactory) -> None:
    """A query string's & becomes &amp; in the HTML attribute and stays raw in text."""
    url = "https://market.example.com/reset?token=abc&lang=en"
    email, sms = render_all(make_model(reset_url=url))

    assert 'href="https://market.example.com/reset?token=abc&amp;lang=en"' in email.html
    assert url in email.text
    assert url in sms.body


@pytest.mark.parametrize("display_name", [None, "", "   "])
def test_missing_display_name_gets_generic_greeting(
    make_model: ModelFactory, display_name: str | None
) -> None:
    """Without a usable display name the greeting is generic and nothing says None."""
    email, sms = render_all(make_model(display_name=display_name))

    assert email.text.startswith("Hi,\n")
    assert "<p>Hi,</p>" in email.html
    for rendered in (email.subject, email.text, email.html, sms.body):
        assert "None" not in rendered


def test_display_name_cannot_add_lines(make_model: ModelFactory) -> None:
    """Whitespace in a display name collapses, so it cannot break the greeting line."""
    email = render_email(make_model(display_name="Ada\n\nClick   here"), "v1")

    assert email.text.startswith("Hi Ada Click here,\n")


def test_display_name_is_not_rendered_as_a_template(make_model: ModelFactory) -> None:
    """Mustache tags inside user text come out literally."""
    email = render_email(make_model(display_name="{{reset_url}}"), "v1")

    assert "Hi {{reset_url}}," in email.text
    assert "Hi {{reset_url}}," in email.html


def test_default_templates_show_every_field(make_model: ModelFactory) -> None:
    """Every model field reaches the copy it belongs in."""
    email, sms = render_all(make_model(minutes_until_expiry=7))

    assert email.subject == "Your password reset link (expires in 7 minutes)"
    assert "\n" not in email.subject
    for body in (email.text, email.html, sms.body):
        assert "7 min" in body
        assert "Acme Market support" in body
    assert "Hi Ada Lovelace," in email.text
    assert "<p>Hi Ada Lovelace,</p>" in email.html
    assert "{{" not in email.html
    assert "{{" not in email.text


def test_default_sms_fits_two_gsm7_segments(make_model: ModelFactory) -> None:
    """A 60-character URL and a 20-character display name fit in 2 GSM-7 segments."""
    sms = render_sms(make_model(display_name="A" * 20), "v1", max_segments=2)

    assert len(RESET_URL) == 60
    assert sms.encoding is SmsEncoding.GSM7
    assert sms.segments <= 2
    assert not sms.body.endswith("\n")
    assert sms_segments(sms.body) == (sms.encoding, sms.segments)


def test_sms_drops_a_display_name_that_would_exceed_the_limit(make_model: ModelFactory) -> None:
    """A name that would push the SMS over its segment limit is left out, the link kept."""
    name = "Жанна Анатольевна"  # Cyrillic turns the whole text into UCS-2
    with_name = render_sms(make_model(display_name=name), "v1")
    limited = render_sms(make_model(display_name=name), "v1", max_segments=2)

    assert with_name.segments > 2
    assert name not in limited.body
    assert RESET_URL in limited.body
    assert limited.segments <= 2


def test_sms_too_long_names_counts_not_content(make_model: ModelFactory) -> None:
    """Over the policy's segment limit the error gives counts, never the URL or body."""
    model = make_model(support_label="Acme Market support " * 5)
    body = render_sms(model, "v1").body

    with pytest.raises(SmsTooLong) as excinfo:
        render_sms(model, "v1", max_segments=1)

    message = str(excinfo.value)
    assert message == "rendered SMS needs 2 segments (gsm7), policy allows 1"
    assert (excinfo.value.segments, excinfo.value.max_segments) == (2, 1)
    assert excinfo.value.encoding is SmsEncoding.GSM7
    assert RESET_URL not in message
    for line in body.splitlines():
        assert line not in message


@pytest.mark.parametrize("template_version", ["v0", "../etc", "v1/..", "..", "", "v1\\x", ".v1"])
def test_bad_template_version_is_rejected(make_model: ModelFactory, template_version: str) -> None:
    """An unknown version or one that walks out of the templates root is a TemplateError."""
    with pytest.raises(TemplateError, match="template version"):
        render_email(make_model(), template_version)
    with pytest.raises(TemplateError, match="template version"):
        render_sms(make_model(), template_version)


def test_missing_template_file_names_version_and_file(
    make_model: ModelFactory, tmp_path: Path
) -> None:
    """A version without an SMS template names both, and no data values."""
    (tmp_path / "v2").mkdir()

    with pytest.raises(TemplateError) as excinfo:
        render_sms(make_model(), "v2", root=tmp_path)

    message = str(excinfo.value)
    assert "'v2'" in message
    assert SMS_FILE in message
    assert RESET_URL not in message


def test_custom_root_renders_its_own_templates(make_model: ModelFactory, tmp_path: Path) -> None:
    """A root argument replaces the bundled templates; output edges are normalised."""
    version = tmp_path / "v9"
    version.mkdir()
    (version / EMAIL_SUBJECT_FILE).write_text("Reset\n  for {{{support_label}}}\n")
    (version / EMAIL_TEXT_FILE).write_text("{{{reset_url}}}\n")
    (version / EMAIL_HTML_FILE).write_text('<a href="{{reset_url}}">x</a>\n')
    (version / SMS_FILE).write_text("{{{reset_url}}}\n\n")

    email = render_email(make_model(), "v9", root=tmp_path)
    sms = render_sms(make_model(), "v9", root=tmp_path)

    assert email.subject == "Reset for Acme Market support"
    assert email.text == f"{RESET_URL}\n"
    assert sms.body == f"{RESET_URL}\n"


def test_partials_are_not_read_from_the_working_directory(
    make_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial tag renders nothing rather than reading a file from the cwd."""
    (tmp_path / "leak.mustache").write_text("leaked")
    version = tmp_path / "v1"
    version.mkdir()
    (version / SMS_FILE).write_text("a{{> leak}}b")
    monkeypatch.chdir(tmp_path)

    assert render_sms(make_model(), "v1", root=tmp_path).body == "ab"


def test_templates_root_finds_the_checkout_templates() -> None:
    """In a checkout the templates root is the repo's top-level templates directory."""
    assert (templates_root() / "v1" / SMS_FILE).is_file()


@pytest.mark.parametrize(
    ("expires_at", "now", "expected"),
    [
        (1_000.0 + 600, 1_000.0, 10),
        (1_000.0 + 599.9, 1_000.0, 9),
        (1_000.0 + 60, 1_000.0, 1),
        (1_000.0 + 59.9, 1_000.0, 0),
        (1_000.0, 1_000.0, 0),
        (1_000.0 - 0.5, 1_000.0, 0),
        (1_000.0 - 3_600, 1_000.0, 0),
    ],
)
def test_minutes_until_expiry_rounds_down_and_clamps(
    expires_at: float, now: float, expected: int
) -> None:
    """Minutes left round down, so the copy never promises time the link lacks, and stop at 0."""
    assert minutes_until_expiry(expires_at, now) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", SmsEncoding.GSM7),
        ("Hello @ £5, é à ñ Δ Ω\n", SmsEncoding.GSM7),
        ("{[~^|\\]} €\f", SmsEncoding.GSM7),
        ("Ça coûte", SmsEncoding.UCS2),  # û is not in GSM-7
        ("price \u2019quoted\u2019", SmsEncoding.UCS2),  # curly quotes
        ("`", SmsEncoding.UCS2),
        ("\x1b", SmsEncoding.UCS2),  # the escape itself is not a character
        ("привет", SmsEncoding.UCS2),
        (EMOJI, SmsEncoding.UCS2),
    ],
)
def test_sms_encoding(text: str, expected: SmsEncoding) -> None:
    """Text stays GSM-7 only if every character is in the basic or extension table."""
    assert sms_encoding(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", (SmsEncoding.GSM7, 1)),
        ("a" * 160, (SmsEncoding.GSM7, 1)),
        ("a" * 161, (SmsEncoding.GSM7, 2)),
        ("a" * 306, (SmsEncoding.GSM7, 2)),
        ("a" * 307, (SmsEncoding.GSM7, 3)),
        ("a" * 158 + "€", (SmsEncoding.GSM7, 1)),  # 160 septets
        ("a" * 159 + "€", (SmsEncoding.GSM7, 2)),  # 161 septets
        ("€" * 80, (SmsEncoding.GSM7, 1)),
        # 306 septets would fit in 2 segments, but the escape pair at 153/154 moves whole.
        ("a" * 152 + "€" + "a" * 152, (SmsEncoding.GSM7, 3)),
        ("a" * 151 + "€" + "a" * 153, (SmsEncoding.GSM7, 2)),
        ("ж" * 70, (SmsEncoding.UCS2, 1)),
        ("ж" * 71, (SmsEncoding.UCS2, 2)),
        ("ж" * 134, (SmsEncoding.UCS2, 2)),
        ("ж" * 135, (SmsEncoding.UCS2, 3)),
        ("a" * 69 + "ж", (SmsEncoding.UCS2, 1)),
        ("ж" * 68 + EMOJI, (SmsEncoding.UCS2, 1)),  # 70 units
        ("ж" * 69 + EMOJI, (SmsEncoding.UCS2, 2)),  # 71 units
        # 134 units would fit in 2 segments, but the surrogate pair at 67/68 moves whole.
        ("ж" * 66 + EMOJI + "ж" * 66, (SmsEncoding.UCS2, 3)),
        ("ж" * 65 + EMOJI + "ж" * 67, (SmsEncoding.UCS2, 2)),
        # The last BMP character is one unit; the first one beyond it is a surrogate pair.
        ("\uffff" * 70, (SmsEncoding.UCS2, 1)),
        ("\U00010000" * 35, (SmsEncoding.UCS2, 1)),
        ("\U00010000" * 36, (SmsEncoding.UCS2, 2)),
    ],
)
def test_sms_segments(text: str, expected: tuple[SmsEncoding, int]) -> None:
    """Segments pack whole characters: 160/153 septets for GSM-7, 70/67 units for UCS-2."""
    assert sms_segments(text) == expected


def test_an_sms_exactly_at_the_segment_limit_keeps_the_display_name(
    make_model: ModelFactory,
) -> None:
    """The limit is inclusive: a text that needs exactly max_segments is sent as rendered."""
    model = make_model(display_name="Ada Lovelace")
    full = render_sms(model, "v1")
    assert "Ada Lovelace" in full.body
    assert render_sms(model, "v1", max_segments=full.segments) == full


def _version_with_messages(tmp_path: Path, messages: str) -> Path:
    """A copy of the built-in v1 templates under tmp_path with the given messages.toml."""
    version = tmp_path / "v1"
    version.mkdir()
    for name in (EMAIL_SUBJECT_FILE, EMAIL_TEXT_FILE, EMAIL_HTML_FILE, SMS_FILE):
        (version / name).write_text((templates_root() / "v1" / name).read_text())
    (version / "messages.toml").write_text(messages)
    return tmp_path


def test_minutes_wording_falls_back_to_other_for_a_missing_plural_category(
    make_model: ModelFactory, tmp_path: Path
) -> None:
    """A [minutes] table with only 'other' words every count with it, 1 included."""
    root = _version_with_messages(tmp_path, '[minutes]\nother = "{n} Minuten-Rest"\n')
    email = render_email(make_model(minutes_until_expiry=1), "v1", root)
    assert "1 Minuten-Rest" in email.text


@pytest.mark.parametrize("declared", ["5", "true", '["en"]'])
def test_a_default_copy_locale_that_is_not_a_string_is_a_template_error(
    tmp_path: Path, declared: str
) -> None:
    """messages.toml's locale must be a tag: a number or a list is refused with its file named."""
    root = _version_with_messages(tmp_path, f"locale = {declared}\n")
    with pytest.raises(TemplateError, match=r"v1/messages\.toml: locale: expected a tag"):
        load_messages(root, "v1", None)


@pytest.mark.parametrize(
    ("reader", "copy", "number"),
    [("es-MX", "es", "1,440"), ("es", "es", "1.440"), ("uz-Arab-AF", "uz", "1.440")],
)
def test_a_day_long_link_counts_minutes_in_the_readers_regional_format(
    reader: str, copy: str, number: str
) -> None:
    """Count and phrase group digits as the reader's region does, in the copy's language."""
    templates = TemplateSet(templates_root(), "v1", None, copy, None)
    data = template_data(RenderModel(RESET_URL, 1440, "support", None, reader), templates)
    assert data["minutes_until_expiry"] == number
    assert str(data["minutes_phrase"]).startswith(number + " ")


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("e", "not a language tag such as es or es-MX"),
        ("es-MX-x-private", "not a language tag such as es or es-MX"),
        ("qq", "not a language CLDR knows"),
        ("und", "not a language CLDR knows"),
    ],
)
def test_a_refused_locale_says_why(tag: str, message: str) -> None:
    """A malformed tag and an unknown language get different, exact explanations."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        canonical_locale(tag)


@pytest.mark.parametrize(
    ("where", "content", "message"),
    [
        (
            "v1",
            b'locale = "\xff"',
            "v1/messages.toml: not readable UTF-8 text",
        ),
        (
            "v1/es",
            b'locale = "es"',
            "v1/es/messages.toml: locale: only a version's default copy declares one"
            " (a locale directory's name is its locale)",
        ),
        (
            "v1",
            b'[minutes]\nmany = "{n}"\nlots = "{n}"',
            "v1/messages.toml: minutes: expected CLDR plural categories"
            " (few, many, one, other, two, zero) with text such as '{n} minutes'",
        ),
    ],
)
def test_a_bad_messages_file_is_named_with_what_is_wrong(
    tmp_path: Path, where: str, content: bytes, message: str
) -> None:
    """messages.toml errors name the file and the rule broken, for the operator to fix."""
    (tmp_path / where).mkdir(parents=True)
    (tmp_path / where / "messages.toml").write_bytes(content)
    locale = where.partition("/")[2] or None
    with pytest.raises(TemplateError) as excinfo:
        load_messages(tmp_path, "v1", locale)
    assert str(excinfo.value) == message
