"""The reset email's HTML, parsed as a browser would read it, with hostile URLs and names.

Substring checks on the rendered HTML cannot tell which of the link's places (the
button's href, the fallback link's href, its visible text) was escaped, so these tests
parse the HTML with html.parser and check each place on its own: a template that drops
the escaping in any one of them fails at least one test here.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from html.parser import HTMLParser
from pathlib import Path

import pytest

from resetctl.render import (
    EMAIL_HTML_FILE,
    EmailContent,
    RenderModel,
    render_email,
    render_sms,
    templates_root,
)

#: Breaks out of a double-quoted attribute, opens a script, and ends in a single quote.
BREAKOUT_URL = "https://x.example/r?a=1&b=\"><script>x</script>'"
#: Ampersands an unescaped template would let the parser decode: "&amp;" and "&lt" read
#: back as "&" and "<" unless the template wrote them as "&amp;amp;" and "&amp;lt".
ENTITY_URL = "https://x.example/r?a=1&amp;b=2&lt=3&copy=4"
HOSTILE_URLS = [BREAKOUT_URL, ENTITY_URL]
PLAIN_URL = "https://x.example/r/token-abc"
HOSTILE_NAME = 'Ada "<b>Bold</b>" & <script>alert(1)</script> O\'Neil &amp; co'
#: Every element the v1 template itself writes; anything else came from a value.
TEMPLATE_TAGS = {"html", "head", "meta", "title", "body", "p", "a", "br"}


@dataclass
class _Anchor:
    href: str | None
    text: str = ""


class ParsedEmail(HTMLParser):
    """The start tags, anchors, attribute values and text nodes of an HTML document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.anchors: list[_Anchor] = []
        self.attribute_values: list[str] = []
        self.texts: list[str] = []
        self._open_anchor: _Anchor | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attribute_values += [value for _, value in attrs if value is not None]
        if tag == "a":
            self._open_anchor = _Anchor(dict(attrs).get("href"))
            self.anchors.append(self._open_anchor)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._open_anchor = None

    def handle_data(self, data: str) -> None:
        self.texts.append(data)
        if self._open_anchor is not None:
            self._open_anchor.text += data


def parse(html: str) -> ParsedEmail:
    parsed = ParsedEmail()
    parsed.feed(html)
    parsed.close()
    return parsed


def _render(url: str, name: str | None = HOSTILE_NAME, root: Path | None = None) -> EmailContent:
    return render_email(RenderModel(url, 10, "Acme Market support", name), "v1", root=root)


# Each check raises AssertionError; the tests below run them one by one, and the last
# test runs all of them against templates with one place unescaped.


def check_every_href_is_the_url(html: str, url: str) -> None:
    anchors = parse(html).anchors
    assert len(anchors) == 2, anchors  # the button and the copy-this-link fallback
    assert [a.href for a in anchors] == [url, url]


def check_link_text_is_the_url(html: str, url: str) -> None:
    anchors = parse(html).anchors
    assert len(anchors) == 2, anchors
    assert anchors[0].text == "Reset your password"
    assert anchors[1].text == url


def check_no_script_element(html: str) -> None:
    tags = parse(html).tags
    assert "script" not in tags
    assert set(tags) <= TEMPLATE_TAGS, set(tags) - TEMPLATE_TAGS


def check_display_name_only_as_text(html: str, name: str) -> None:
    parsed = parse(html)
    assert f"Hi {name}," in parsed.texts
    assert not any(name in value for value in parsed.attribute_values)
    assert set(parsed.tags) <= TEMPLATE_TAGS, set(parsed.tags) - TEMPLATE_TAGS


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_every_href_carries_the_url_exactly(url: str) -> None:
    """Both links' href attributes, as a parser unescapes them, are exactly the reset URL."""
    check_every_href_is_the_url(_render(url).html, url)


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_the_visible_link_text_is_the_url(url: str) -> None:
    """The copy-this-link text node is exactly the URL; the button says what it does."""
    check_link_text_is_the_url(_render(url).html, url)


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_no_script_element_comes_from_the_url_or_the_name(url: str) -> None:
    """A URL and a name full of markup add no element to the document."""
    check_no_script_element(_render(url).html)


def test_the_display_name_appears_only_as_text() -> None:
    """The display name is one text node in the greeting, never markup or an attribute."""
    # A plain URL, so that only the name can put markup into the document here.
    check_display_name_only_as_text(_render(PLAIN_URL).html, HOSTILE_NAME)


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_the_text_part_carries_the_url_and_name_verbatim(url: str) -> None:
    """Plain text is not HTML: the URL is a line of its own and the name is unescaped."""
    text = _render(url).text
    assert url in text.splitlines()
    assert f"Hi {HOSTILE_NAME}," in text.splitlines()
    assert "&amp;amp;" not in text
    assert "&quot;" not in text


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_the_sms_carries_the_url_verbatim(url: str) -> None:
    """The SMS holds the URL, unescaped, on a line of its own."""
    body = render_sms(RenderModel(url, 10, "Acme Market support", None), "v1").body
    assert url in body.split("\n")


def _unescaped_variants(tmp_path: Path) -> list[tuple[str, Path]]:
    """Copies of the v1 templates, each with one value in the HTML left unescaped."""
    source = (templates_root() / "v1" / EMAIL_HTML_FILE).read_text(encoding="utf-8")
    variants: list[tuple[str, Path]] = []
    for tag in ("{{reset_url}}", "{{display_name}}"):
        start = 0
        while (found := source.find(tag, start)) >= 0:
            start = found + len(tag)
            mutated = source[:found] + "{" + tag + "}" + source[start:]
            root = tmp_path / f"variant{len(variants)}"
            shutil.copytree(templates_root() / "v1", root / "v1")
            (root / "v1" / EMAIL_HTML_FILE).write_text(mutated, encoding="utf-8")
            variants.append((f"{tag} #{len(variants)}", root))
    return variants


def test_each_check_catches_one_unescaped_place(tmp_path: Path) -> None:
    """Unescaping any one value in the HTML template makes at least one check above fail."""
    variants = _unescaped_variants(tmp_path)
    assert len(variants) == 4  # the URL in two hrefs and one text node, and the name
    for label, root in variants:
        failures = 0
        for url in HOSTILE_URLS:
            html = _render(url, root=root).html
            checks: list[Callable[[], None]] = [
                partial(check_every_href_is_the_url, html, url),
                partial(check_link_text_is_the_url, html, url),
                partial(check_no_script_element, html),
                partial(check_display_name_only_as_text, html, HOSTILE_NAME),
            ]
            for check in checks:
                try:
                    check()
                except AssertionError:
                    failures += 1
        assert failures, f"{label}: every check passed with the value unescaped"
