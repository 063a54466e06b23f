"""Render reset notices from Mustache templates and count what an SMS costs.

A template version is a directory under the templates root (the operator's
``[templates] dir``, else the built-ins installed with the package). It holds the
version's default copy and may hold one subdirectory per reader locale
(``v2/es/``, ``v2/es-MX/``): a notice's locale picks the most specific match, then
its language, then the default copy. Plural wording and numbers follow CLDR (Babel)
for the language the copy is written in.

Rendering sends nothing. The reset URL is a credential, so no exception raised
here carries a rendered value: errors name template versions, files and counts.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import chevron
from babel import Locale, UnknownLocaleError
from babel.numbers import format_decimal
from babel.units import format_unit
from chevron.tokenizer import ChevronError, tokenize

from resetctl.frozen import fast_init

EMAIL_SUBJECT_FILE = "email_subject.mustache"
EMAIL_TEXT_FILE = "email_text.mustache"
EMAIL_HTML_FILE = "email_html.mustache"
SMS_FILE = "sms.mustache"
#: The longest display name enqueue accepts (a template shows it); `templates check`
#: renders one this long.
MAX_DISPLAY_NAME = 100
#: Every file a template directory (a version's default copy or one locale) must hold.
TEMPLATE_FILES = (EMAIL_SUBJECT_FILE, EMAIL_TEXT_FILE, EMAIL_HTML_FILE, SMS_FILE)
#: Optional, per template directory: the language of a version's default copy
#: (``locale = "de"``; default ``en``) and ``[minutes]`` wording by CLDR plural category.
MESSAGES_FILE = "messages.toml"
#: The language of a version's default copy when its messages.toml does not say.
DEFAULT_COPY_LOCALE = "en"
#: The names a template may use: everything the render model gives it.
MODEL_VARIABLES = frozenset(
    {"reset_url", "minutes_until_expiry", "minutes_phrase", "support_label", "display_name"}
)
#: The names whose value the person (not the operator) chose: `templates check` warns when
#: a header template shows one.
USER_VARIABLES = frozenset({"display_name"})
#: CLDR plural categories a ``[minutes]`` table may name.
PLURAL_CATEGORIES = frozenset({"zero", "one", "two", "few", "many", "other"})

# A version names one directory under the templates root, nothing more: no separators,
# no "..", no leading dot.
_TEMPLATE_VERSION = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")

# BCP 47 as far as template directories go: language, optional script, optional region
# (letters or the UN M.49 digits of es-419). Variants and extensions are refused.
_LOCALE_TAG = re.compile(r"([A-Za-z]{2,3})(?:-([A-Za-z]{4}))?(?:-([A-Za-z]{2}|[0-9]{3}))?")

# GSM 03.38 default alphabet in table order, without 0x1B (the escape to the extension
# table is not a character a message may contain).
_GSM7_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞ"
    "ÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§"
    "¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
# Extension table characters travel as escape + code: two septets each.
_GSM7_EXTENSION = frozenset("\f^{}\\[~]|€")

_GSM7_SINGLE_SEPTETS = 160
_GSM7_SEGMENT_SEPTETS = 153  # 160 less the 7 septets of the concatenation header
_UCS2_SINGLE_UNITS = 70
_UCS2_SEGMENT_UNITS = 67  # 70 less the 3 units of the concatenation header

# Every control character (C0, DEL, C1: CR, LF, VT, FF, NEL among them) and the Unicode
# line and paragraph separators: each ends a line for some reader of a header.
_HEADER_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: What splits an RFC 2047 encoded-word opener: U+2060 WORD JOINER, which shows nothing.
ENCODED_WORD_BREAK = "=\u2060?"


@fast_init
@dataclass(frozen=True, slots=True)
class RenderModel:
    """What the templates may show about one notice."""

    reset_url: str
    minutes_until_expiry: int
    support_label: str
    display_name: str | None = None
    #: the reader's locale as given at enqueue (canonical BCP 47), if any
    locale: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class EmailContent:
    """A rendered email: one-line subject, plain text and HTML bodies."""

    subject: str
    text: str
    html: str
    #: the locale directory rendered, or None for the version's default copy
    locale: str | None = None


class SmsEncoding(enum.StrEnum):
    """The alphabet an SMS travels in, which decides how much fits in a segment."""

    #: GSM 03.38 7-bit default alphabet (with its extension table): 160 septets alone.
    GSM7 = "gsm7"
    #: UTF-16 code units, for text GSM-7 cannot carry: 70 units alone.
    UCS2 = "ucs2"


@fast_init
@dataclass(frozen=True, slots=True)
class SmsContent:
    """A rendered SMS body with the encoding and segment count it will be billed at."""

    body: str
    encoding: SmsEncoding
    segments: int
    #: the locale directory rendered, or None for the version's default copy
    locale: str | None = None


class TemplateError(Exception):
    """A template version or file is missing or not a valid name."""


@dataclass(frozen=True, slots=True)
class TemplateSet:
    """One directory of templates: a version's default copy or one of its locales."""

    #: the templates root the version lives under
    root: Path
    #: the version directory's name
    version: str
    #: the locale subdirectory, or None for the version's default copy
    locale: str | None
    #: the language the copy is written in: its plural rules pick the wording of numbers
    language: str
    #: ``[minutes]`` of messages.toml by CLDR plural category, or None for CLDR's wording
    minutes: Mapping[str, str] | None

    @property
    def path(self) -> Path:
        """The directory holding the template files."""
        version_dir = self.root / self.version
        return version_dir if self.locale is None else version_dir / self.locale

    @property
    def label(self) -> str:
        """``v2`` or ``v2/es``, for messages."""
        return self.version if self.locale is None else f"{self.version}/{self.locale}"


def canonical_locale(tag: str) -> str:
    """A BCP 47 tag CLDR knows, in canonical case (``es-mx`` → ``es-MX``).

    Raises ValueError for anything else: a syntax error, a variant or extension, a
    language CLDR has no data for.
    """
    match = _LOCALE_TAG.fullmatch(tag)
    if match is None:
        raise ValueError("not a language tag such as es or es-MX")
    language, script, region = match.groups()
    canonical = "-".join(
        part
        for part in (language.lower(), script and script.title(), region and region.upper())
        if part
    )
    if language.lower() == "und" or _babel_locale(canonical) is None:
        raise ValueError("not a language CLDR knows")
    return canonical


def locale_candidates(locale: str) -> tuple[str, ...]:
    """Directory names to try for a canonical tag, most specific first.

    ``es-MX`` → ``es-MX``, ``es``; ``zh-Hant-TW`` → ``zh-Hant-TW``, ``zh-Hant``, ``zh``.
    """
    parts = locale.split("-")
    found: list[str] = [locale]
    if len(parts) == 3:
        found.append("-".join(parts[:2]))
    if len(parts) > 1:
        found.append(parts[0])
    return tuple(found)


@functools.cache
def _babel_locale(tag: str) -> Locale | None:
    try:
        return Locale.parse(tag, sep="-")
    except (ValueError, UnknownLocaleError):
        return None


def _language(tag: str) -> str:
    return tag.split("-", 1)[0]


class SmsTooLong(Exception):
    """A rendered SMS needs more segments than the policy allows."""

    def __init__(self, segments: int, encoding: SmsEncoding, max_segments: int) -> None:
        # The message holds counts only: the body carries the reset URL.
        super().__init__(
            f"rendered SMS needs {segments} segments ({encoding}), policy allows {max_segments}"
        )
        self.segments = segments
        self.encoding = encoding
        self.max_segments = max_segments


def minutes_until_expiry(expires_at: float, now: float) -> int:
    """Whole minutes left before ``expires_at``, rounded down and never below 0.

    Rounding down means the copy never promises more time than the link has.
    """
    return max(0, math.floor((expires_at - now) / 60))


def sms_encoding(text: str) -> SmsEncoding:
    """GSM-7 if every character is in the GSM 03.38 tables, otherwise UCS-2."""
    if all(char in _GSM7_BASIC or char in _GSM7_EXTENSION for char in text):
        return SmsEncoding.GSM7
    return SmsEncoding.UCS2


def sms_segments(text: str) -> tuple[SmsEncoding, int]:
    """The encoding of ``text`` and how many segments it takes; empty text takes one."""
    encoding = sms_encoding(text)
    if encoding is SmsEncoding.GSM7:
        septets = [2 if char in _GSM7_EXTENSION else 1 for char in text]
        return encoding, _pack(septets, _GSM7_SINGLE_SEPTETS, _GSM7_SEGMENT_SEPTETS)
    # Characters outside the BMP need a surrogate pair: two UTF-16 code units.
    units = [2 if ord(char) > 0xFFFF else 1 for char in text]
    return encoding, _pack(units, _UCS2_SINGLE_UNITS, _UCS2_SEGMENT_UNITS)


def _pack(costs: list[int], single_limit: int, segment_limit: int) -> int:
    """Segments needed when each character's cost must stay within one segment."""
    if sum(costs) <= single_limit:
        return 1
    # Greedy packing, not a plain ceil(total / limit): an escape pair or a surrogate
    # pair split across segments would arrive as garbage, so it moves whole.
    segments, used = 1, 0
    for cost in costs:
        if used + cost > segment_limit:
            segments += 1
            used = 0
        used += cost
    return segments


@functools.cache
def templates_root() -> Path:
    """The templates directory, installed with the package or at the checkout's top."""
    package_dir = Path(__file__).resolve().parent
    # The wheel force-includes the repo's templates/ as resetctl/templates.
    installed = package_dir / "templates"
    if installed.is_dir():
        return installed
    return package_dir.parent / "templates"


def configured_root(templates_dir: str | None) -> Path:
    """The operator's ``[templates] dir``, else the built-in templates."""
    return Path(templates_dir) if templates_dir else templates_root()


def render_email(
    model: RenderModel, template_version: str, root: Path | None = None
) -> EmailContent:
    """Render the subject, text and HTML of the reset email in the model's locale."""
    templates = resolve_templates(template_version, model.locale, root)
    data = template_data(model, templates)
    subject = _render(templates, EMAIL_SUBJECT_FILE, data)
    return EmailContent(
        subject=header_text(subject),
        text=_render(templates, EMAIL_TEXT_FILE, data),
        html=_render(templates, EMAIL_HTML_FILE, data),
        locale=templates.locale,
    )


def header_text(value: str) -> str:
    """``value`` as the text of an email header, safe on every interpreter: one line, and
    nothing the email package would decode into something else.

    A line break in a header is an injection or a broken header, so every control
    character and Unicode line separator becomes a space and whitespace runs collapse
    (templates may wrap). An RFC 2047 encoded word (``=?utf-8?q?Ada=0D=0AReply-To:…?=``)
    is decoded by the email package wherever it finds one, and CPython before 3.11.10 and
    3.12.5 writes what it decoded unquoted (CVE-2024-6923): a line break, a new header, an
    early body. An invisible word joiner between ``=`` and ``?`` leaves the text as the
    person wrote it and nothing to decode. Applying it twice changes nothing.
    """
    one_line = " ".join(_HEADER_BREAKS.sub(" ", value).split())
    return one_line.replace("=?", ENCODED_WORD_BREAK)


def render_sms(
    model: RenderModel,
    template_version: str,
    max_segments: int | None = None,
    root: Path | None = None,
) -> SmsContent:
    """Render the reset SMS; raise SmsTooLong if it needs more than ``max_segments``.

    A display name is a courtesy, the link is the point: when the name pushes the text
    over the limit (a long name, or one outside GSM-7 that turns the whole text into
    UCS-2), the same template is rendered without it before the text is refused.
    """
    templates = resolve_templates(template_version, model.locale, root)
    content = _render_sms(model, templates)
    if max_segments is None or content.segments <= max_segments:
        return content
    if model.display_name:
        shorter = _render_sms(dataclasses.replace(model, display_name=None), templates)
        if shorter.segments <= max_segments:
            return shorter
    raise SmsTooLong(content.segments, content.encoding, max_segments)


def _render_sms(model: RenderModel, templates: TemplateSet) -> SmsContent:
    rendered = _render(templates, SMS_FILE, template_data(model, templates))
    # Template files end with a newline that is not part of the message.
    body = rendered.removesuffix("\n")
    encoding, segments = sms_segments(body)
    return SmsContent(body=body, encoding=encoding, segments=segments, locale=templates.locale)


def resolve_templates(
    template_version: str, locale: str | None = None, root: Path | None = None
) -> TemplateSet:
    """The directory a notice in ``locale`` is rendered from: ``<version>/<locale>/``,
    else ``<version>/<language>/``, else the version's default copy."""
    return _resolve(root or templates_root(), template_version, locale)


# A sweep renders thousands of notices from the same few directories; templates are
# deployed before the processes that read them start, so one look per process is enough.
@functools.lru_cache(maxsize=256)
def _resolve(root: Path, template_version: str, locale: str | None) -> TemplateSet:
    if not _TEMPLATE_VERSION.fullmatch(template_version) or ".." in template_version:
        raise TemplateError(f"invalid template version {template_version!r}")
    version_dir = root / template_version
    if not version_dir.is_dir():
        raise TemplateError(f"template version {template_version!r} is not a directory in {root}")
    for candidate in locale_candidates(locale) if locale else ():
        if (version_dir / candidate).is_dir():
            language, minutes = load_messages(root, template_version, candidate)
            return TemplateSet(root, template_version, candidate, candidate, minutes)
    language, minutes = load_messages(root, template_version, None)
    return TemplateSet(root, template_version, None, language or DEFAULT_COPY_LOCALE, minutes)


def load_messages(
    root: Path, template_version: str, locale: str | None
) -> tuple[str | None, Mapping[str, str] | None]:
    """A template directory's messages.toml: (declared language, ``[minutes]`` wording).

    Both are None when the file is absent. A locale directory's language is its name,
    so only a version's default copy may declare one.
    """
    where = template_version if locale is None else f"{template_version}/{locale}"
    path = root / where / MESSAGES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError):
        raise TemplateError(f"{where}/{MESSAGES_FILE}: not readable UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TemplateError(f"{where}/{MESSAGES_FILE}: {exc}") from None
    for key in data:
        if key not in ("locale", "minutes"):
            raise TemplateError(f"{where}/{MESSAGES_FILE}: {key!r}: unknown key")
    language = data.get("locale")
    if language is not None:
        if locale is not None:
            raise TemplateError(
                f"{where}/{MESSAGES_FILE}: locale: only a version's default copy declares"
                " one (a locale directory's name is its locale)"
            )
        try:
            language = canonical_locale(language) if isinstance(language, str) else None
        except ValueError:
            language = None
        if language is None:
            raise TemplateError(f"{where}/{MESSAGES_FILE}: locale: expected a tag such as 'en'")
    minutes = data.get("minutes")
    if minutes is not None:
        if not isinstance(minutes, dict) or not all(
            key in PLURAL_CATEGORIES and isinstance(value, str) for key, value in minutes.items()
        ):
            raise TemplateError(
                f"{where}/{MESSAGES_FILE}: minutes: expected CLDR plural categories"
                f" ({', '.join(sorted(PLURAL_CATEGORIES))}) with text such as '{{n}} minutes'"
            )
        if "other" not in minutes:
            raise TemplateError(f"{where}/{MESSAGES_FILE}: minutes: 'other' is required")
    return language, minutes


def template_data(model: RenderModel, templates: TemplateSet) -> dict[str, object]:
    """The values a template sees for ``model`` when rendered from ``templates``."""
    # Plural rules are the copy's language; number formats follow the reader's own locale
    # when it is a variant of that language (es-MX reading the es copy), else the copy's.
    number_locale = templates.language
    if model.locale and _language(model.locale) == _language(templates.language):
        number_locale = model.locale
    minutes = model.minutes_until_expiry
    data: dict[str, object] = {
        "reset_url": model.reset_url,
        "minutes_until_expiry": _decimal(minutes, number_locale),
        "minutes_phrase": minutes_phrase(minutes, templates, number_locale),
        "support_label": model.support_label,
    }
    # A display name is user text: collapsing its whitespace keeps it from adding
    # lines to the copy, and a blank one gets the generic greeting.
    display_name = " ".join((model.display_name or "").split())
    if display_name:
        data["display_name"] = display_name
    return data


def minutes_phrase(minutes: int, templates: TemplateSet, number_locale: str | None = None) -> str:
    """ "1 minute", "5 minutes", "5 minut", "5 分": the directory's ``[minutes]`` wording
    under its language's CLDR plural rules, else CLDR's own wording of the unit."""
    number_locale = number_locale or templates.language
    if templates.minutes is None:
        return _unit_minutes(minutes, number_locale)
    language = _babel_locale(templates.language)
    assert language is not None
    wording = templates.minutes.get(language.plural_form(minutes), templates.minutes["other"])
    # A plain replacement, not str.format: the wording is data, not a format program.
    return wording.replace("{n}", _decimal(minutes, number_locale))


# A sweep formats the same few minute counts in the same few locales thousands of times:
# CLDR's formatting is deterministic, so each (count, locale) is formatted once.
@functools.lru_cache(maxsize=4096)
def _decimal(number: int, locale: str) -> str:
    formatted: str = format_decimal(number, locale=_babel_locale(locale))
    return formatted


@functools.lru_cache(maxsize=4096)
def _unit_minutes(minutes: int, locale: str) -> str:
    worded: str = format_unit(
        minutes, "duration-minute", length="long", locale=_babel_locale(locale)
    )
    return worded


def _render(templates: TemplateSet, file_name: str, data: dict[str, object]) -> str:
    tokens = _tokens(templates.root, templates.version, templates.locale, file_name)
    # partials_path=None: a "{{> name}}" tag must never read files from the working
    # directory.
    rendered: str = chevron.render(tokens, data, partials_path=None)
    return rendered


@functools.lru_cache(maxsize=256)
def _tokens(root: Path, version: str, locale: str | None, file_name: str) -> tuple[object, ...]:
    # chevron re-tokenizes a string template on every render; a sweep renders thousands
    # of messages from the same few templates, so they are tokenized once (keyed by
    # names, not a Path built per render).
    directory = root / version if locale is None else root / version / locale
    label = version if locale is None else f"{version}/{locale}"
    try:
        template = _read_template(directory / file_name)
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"template version {label!r} has no readable {file_name}") from exc
    try:
        return tuple(tokenize(template))
    except ChevronError as exc:
        # chevron's message says what and where ("unclosed tag at line 3"), never the data.
        detail = "; ".join(str(exc).splitlines())
        raise TemplateError(f"{label}/{file_name}: Mustache syntax error: {detail}") from None


# A sweep renders thousands of notices from the same few files; templates are
# deployed before the processes that read them start, so a process never needs to see
# them change.
@functools.lru_cache(maxsize=256)
def _read_template(path: Path) -> str:
    return path.read_text(encoding="utf-8")
