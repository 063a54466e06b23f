"""`templates preview`: sample copy written to files a person (and a browser) can open."""

from __future__ import annotations

import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import resetctl

from resetctl.templates import PREVIEW_NAME, SAMPLE_URL

CHROMIUM = Path("/usr/bin/chromium")


class _Page(HTMLParser):
    """The text and start tags of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def preview(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    output = tmp_path / "preview"
    done = resetctl("templates", "preview", "--output", str(output), *args)
    return done, output


def test_preview_writes_email_and_sms_in_the_requested_locale(tmp_path: Path) -> None:
    """es-MX renders v1/es: subject and text, HTML, and the SMS with its segment count."""
    done, output = preview(tmp_path, "--version", "v1", "--locale", "es-MX", "--minutes", "1")
    assert done.returncode == 0, done.stderr
    assert "rendered from v1/es" in done.stdout
    assert "sms: gsm7, 2 segments" in done.stdout
    text = (output / "email.txt").read_text()
    assert text.startswith("Subject: Tu enlace para restablecer la contraseña (caduca en 1 minuto)")
    assert f"Hola, {PREVIEW_NAME}:" in text
    assert SAMPLE_URL in (output / "sms.txt").read_text()


def test_preview_refuses_a_bad_locale(tmp_path: Path) -> None:
    """A locale that is not a BCP 47 tag is a one-line error, exit 2, nothing written."""
    done, output = preview(tmp_path, "--locale", "es_MX")
    assert done.returncode == 2
    assert done.stderr == "error: --locale: not a BCP 47 language tag CLDR knows (e.g. es-MX)\n"
    assert not output.exists()


def _distinct_bytes(png: bytes) -> int:
    """How many distinct byte values the decompressed image data holds (1-2: blank)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    offset, data = 8, b""
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        kind = png[offset + 4 : offset + 8]
        if kind == b"IDAT":
            data += png[offset + 8 : offset + 8 + length]
        offset += 12 + length
    return len(set(zlib.decompress(data)))


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_preview_html_displays_in_a_headless_browser(tmp_path: Path) -> None:
    """Chromium renders the preview's HTML to a non-blank screenshot; the name shows as text."""
    done, output = preview(tmp_path, "--version", "v1")
    assert done.returncode == 0, done.stderr
    html = output / "email.html"
    page = _Page()
    page.feed(html.read_text())
    assert "b" not in page.tags  # the name's <b> arrived as text, not markup
    assert f"Hi {PREVIEW_NAME}," in "".join(page.text)

    screenshot = tmp_path / "email.png"
    subprocess.run(
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
            f"--user-data-dir={tmp_path / 'chromium'}",
            f"--screenshot={screenshot}",
            "--window-size=800,1000",
            html.as_uri(),
        ],
        capture_output=True,
        check=True,
        timeout=120,
    )
    png = screenshot.read_bytes()
    assert len(png) > 10_000
    assert _distinct_bytes(png) > 16
