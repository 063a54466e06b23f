"""contrib/prometheus: the alert rules load, and promtool's unit tests of them pass."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FakeClock, make_settings, reset_request

import resetctl
from resetctl import ops
from resetctl.store import Store

RULES = Path(__file__).parent.parent / "contrib" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=RULES, timeout=300)


@needs_promtool
def test_the_rules_file_is_valid() -> None:
    """`promtool check rules` accepts the rules, lint included."""
    checked = promtool("check", "rules", "resetctl.rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_the_rules_unit_tests_pass() -> None:
    """`promtool test rules`: each alert fires when it should and stays quiet otherwise."""
    tested = promtool("test", "rules", "resetctl.rules.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_use_only_metrics_resetctl_exports(db_path: Path, clock: FakeClock) -> None:
    """Every resetctl_* series a rule reads is one `resetctl metrics` writes."""
    settings = make_settings()
    with resetctl.open(db_path, settings, clock=clock, sleep=clock.sleep) as handle:
        handle.enqueue([reset_request()])
        handle.sweep()
    with Store(db_path) as store:
        chains = settings.provider_chains()
        families = list(ops.metric_families(store, clock(), [("default", 1)], chains))
    exported = {sample.name for family in families for sample in family.samples}
    rules = (RULES / "resetctl.rules.yml").read_text(encoding="utf-8")
    used = set(re.findall(r"\b(resetctl_[a-z_]+)", rules))
    assert used, "no metric found in the rules"
    assert used <= exported, used - exported
