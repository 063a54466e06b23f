"""README's "Use it from your application" runs as written, block after block."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).parent.parent / "README.md"
SECTION = "## Use it from your application"


def python_blocks() -> list[str]:
    """The section's ```python blocks, in order (its ```sh blocks start servers)."""
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.DOTALL)


def test_the_section_has_an_example_per_method() -> None:
    """Each method of the handle has an example in the section."""
    code = "\n".join(python_blocks())
    for call in ("open(", ".enqueue(", ".inspect(", ".observe(", ".sweep(", ".health("):
        assert call in code, call
    assert ".close()" in code
    assert "with resetctl.open(" in code


def test_the_examples_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Executed in a fresh directory, the examples enqueue, inspect, refuse a forged
    callback, sweep, report health, report bad input and mount the endpoint in Flask."""
    monkeypatch.chdir(tmp_path)
    for name in ("RESETCTL_DB", "RESETCTL_CONFIG", "RESETCTL_HASH_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "readme-token")
    namespace: dict[str, Any] = {"__name__": "readme"}
    try:
        for block in python_blocks():
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 -- README's own code
    finally:
        handle = namespace.get("rc")
        if handle is not None:
            handle.close()
    out = capsys.readouterr().out
    assert re.search(r"^ntc_[0-9a-f]{24} True True$", out, flags=re.MULTILINE), out
    assert "\naccepted " in out
    assert "403: not from Twilio; nothing recorded" in out
    assert "reset_url: must be an absolute https:// URL" in out
    assert (tmp_path / "resetctl.db").exists()
    assert namespace["app"].name == "marketplace"
