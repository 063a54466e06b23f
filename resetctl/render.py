"""Render reset notices from Mustache templates and count what an SMS costs.

Rendering sends nothing. The reset URL is a credential, so no exception raised
here carries a rendered value: errors name template versions, files and counts.
"""

from __future__ import annotations

import enum
import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import chevron
from chevron.tokenizer import tokenize

EMAIL_SUBJECT_FILE = "email_subject.mustache"
EMAIL_TEXT_FILE = "email_text.mustache"
EMAIL_HTML_FILE = "email_html.mustache"
SMS_FILE = "sms.mustache"

# A version names one directory under the templates root, nothing more: no separators,
# no "..", no leading dot.
_TEMPLATE_VERSION = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")

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


@dataclass(frozen=True, slots=True)
class RenderModel:
    """What the templates may show about one notice."""

    reset_url: str
    minutes_until_expiry: int
    support_label: str
    display_name: str | None = None


@dataclass(frozen=True, slots=True)
class EmailContent:
    """A rendered email: one-line subject, plain text and HTML bodies."""

    subject: str
    text: str
    html: str


class SmsEncoding(enum.StrEnum):
    """The alphabet an SMS travels in, which decides how much fits in a segment."""

    #: GSM 03.38 7-bit default alphabet (with its extension table): 160 septets alone.
    GSM7 = "gsm7"
    #: UTF-16 code units, for text GSM-7 cannot carry: 70 units alone.
    UCS2 = "ucs2"


@dataclass(frozen=True, slots=True)
class SmsContent:
    """A rendered SMS body with the encoding and segment count it will be billed at."""

    body: str
    encoding: SmsEncoding
    segments: int


class TemplateError(Exception):
    """A template version or file is missing or not a valid name."""


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


def render_email(
    model: RenderModel, template_version: str, root: Path | None = None
) -> EmailContent:
    """Render the subject, text and HTML of the reset email."""
    data = _template_data(model)
    subject = _render(root, template_version, EMAIL_SUBJECT_FILE, data)
    return EmailContent(
        # A newline in a subject is a header injection or a broken header; templates
        # may wrap, so all whitespace runs collapse to single spaces.
        subject=" ".join(subject.split()),
        text=_render(root, template_version, EMAIL_TEXT_FILE, data),
        html=_render(root, template_version, EMAIL_HTML_FILE, data),
    )


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
    content = _render_sms(model, template_version, root)
    if max_segments is None or content.segments <= max_segments:
        return content
    if model.display_name:
        anonymous = RenderModel(model.reset_url, model.minutes_until_expiry, model.support_label)
        shorter = _render_sms(anonymous, template_version, root)
        if shorter.segments <= max_segments:
            return shorter
    raise SmsTooLong(content.segments, content.encoding, max_segments)


def _render_sms(model: RenderModel, template_version: str, root: Path | None) -> SmsContent:
    rendered = _render(root, template_version, SMS_FILE, _template_data(model))
    # Template files end with a newline that is not part of the message.
    body = rendered.removesuffix("\n")
    encoding, segments = sms_segments(body)
    return SmsContent(body=body, encoding=encoding, segments=segments)


def _template_data(model: RenderModel) -> dict[str, object]:
    data: dict[str, object] = {
        "reset_url": model.reset_url,
        "minutes_until_expiry": model.minutes_until_expiry,
        "support_label": model.support_label,
    }
    # A display name is user text: collapsing its whitespace keeps it from adding
    # lines to the copy, and a blank one gets the generic greeting.
    display_name = " ".join((model.display_name or "").split())
    if display_name:
        data["display_name"] = display_name
    return data


def _render(
    root: Path | None, template_version: str, file_name: str, data: dict[str, object]
) -> str:
    tokens = _tokens(root or templates_root(), template_version, file_name)
    # partials_path=None: a "{{> name}}" tag must never read files from the working
    # directory.
    rendered: str = chevron.render(tokens, data, partials_path=None)
    return rendered


@functools.lru_cache(maxsize=64)
def _tokens(root: Path, template_version: str, file_name: str) -> tuple[object, ...]:
    # chevron re-tokenizes a string template on every render; a sweep renders thousands
    # of messages from the same few templates, so they are tokenized once.
    template = _load_template(root, template_version, file_name)
    return tuple(tokenize(template))


def _load_template(root: Path, template_version: str, file_name: str) -> str:
    if not _TEMPLATE_VERSION.fullmatch(template_version) or ".." in template_version:
        raise TemplateError(f"invalid template version {template_version!r}")
    try:
        return _read_template(root / template_version / file_name)
    except OSError as exc:
        raise TemplateError(
            f"template version {template_version!r} has no readable {file_name}"
        ) from exc


# A sweep renders thousands of notices from the same few files; templates are
# deployed with the code, so a process never needs to see them change.
@functools.lru_cache(maxsize=64)
def _read_template(path: Path) -> str:
    return path.read_text(encoding="utf-8")
