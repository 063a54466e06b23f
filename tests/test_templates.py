"""Operator-owned templates: `templates init`, `templates check`, and the sweep's refusal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.errors import ConfigError
from resetctl.render import templates_root
from resetctl.store import Store
from resetctl.templates import (
    SAMPLE_URL,
    CheckedCopy,
    check_templates,
    init_templates,
    require_templates,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An operator's templates dir holding the built-in v1 (with its es/) as v2."""
    operator = tmp_path / "templates"
    shutil.copytree(templates_root() / "v1", operator / "v2")
    return operator


def owned(root: Path, **policy: Any) -> Settings:
    """Settings whose default policy renders v2 from ``root``."""
    return make_settings(
        templates={"dir": str(root)},
        policy={"default": {"template_version": "v2", **policy}},
    )


def problems(checked: list[CheckedCopy]) -> list[str]:
    return [problem for copy in checked for problem in copy.problems]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_built_ins_pass_the_check() -> None:
    """Every built-in version and locale passes; each SMS reports encoding and segments."""
    checked = check_templates(make_settings())
    assert {copy.label for copy in checked} >= {"v1", "v1/es"}
    assert problems(checked) == []
    for copy in checked:
        assert copy.sms
        assert all(s.encoding == "gsm7" and 1 <= s.segments <= 2 for s in copy.sms)
        assert all(SAMPLE_URL not in s.sample for s in copy.sms)


def test_missing_file_fails_the_check(root: Path) -> None:
    """A locale directory without one of the four files is named with that file."""
    (root / "v2" / "es" / "sms.mustache").unlink()
    assert problems(check_templates(owned(root), "v2")) == ["v2/es/sms.mustache: missing"]


def test_missing_version_fails_the_check(root: Path) -> None:
    """A policy naming a version the directory lacks fails, naming the directory."""
    assert problems(check_templates(owned(root), "v3")) == [f"v3: not a directory in {root}"]


def test_mustache_syntax_error_fails_the_check(root: Path) -> None:
    """An unclosed section is a syntax error, with chevron's line."""
    edit(
        root / "v2" / "email_text.mustache",
        "{{/display_name}}{{^display_name}}",
        "{{^display_name}}",
    )
    [problem] = problems(check_templates(owned(root), "v2"))
    assert problem.startswith("v2/email_text.mustache: Mustache syntax error: ")
    assert "line" in problem
    assert "\n" not in problem


def test_unknown_variable_fails_the_check(root: Path) -> None:
    """A tag the render model does not give (a typo) is named with its file and line."""
    edit(root / "v2" / "es" / "email_text.mustache", "{{{support_label}}}", "{{{suport_label}}}")
    [problem] = problems(check_templates(owned(root), "v2"))
    assert problem.startswith("v2/es/email_text.mustache line 12: unknown variable suport_label")


def test_a_dotted_name_fails_the_check(root: Path) -> None:
    """The model is flat: {{#reset_url.split}} would reach str.split (chevron calls it as
    a lambda), so a dotted name is refused, with its file and line."""
    edit(
        root / "v2" / "es" / "email_text.mustache",
        "{{{support_label}}}",
        "{{#reset_url.split}}x{{/reset_url.split}}",
    )
    [problem] = problems(check_templates(owned(root), "v2"))
    assert problem.startswith('v2/es/email_text.mustache line 12: dotted name "reset_url.split"')


def test_reset_url_in_subject_fails_the_check(root: Path) -> None:
    """The reset URL may never be in a subject, escaped or not."""
    edit(root / "v2" / "email_subject.mustache", "(expires", "{{reset_url}} (expires")
    [problem] = problems(check_templates(owned(root), "v2"))
    assert problem == "v2/email_subject.mustache line 2: the reset URL must never be in a subject"


def test_sms_over_max_segments_fails_the_check(root: Path) -> None:
    """An SMS that exceeds sms.max_segments even without the name fails, with its counts."""
    settings = make_settings(
        support_label="Acme Market customer support",
        templates={"dir": str(root)},
        policy={"default": {"template_version": "v2", "sms": {"max_segments": 1}}},
    )
    [problem, spanish] = problems(check_templates(settings, "v2"))
    assert problem.startswith("v2/sms.mustache: needs 2 segments (gsm7) even without the display")
    assert problem.endswith("sms.max_segments is 1")
    assert spanish.startswith("v2/es/sms.mustache: needs 2 segments")


def test_sms_outside_gsm7_is_caught_and_reported(root: Path) -> None:
    """One ó turns the Spanish SMS into UCS-2: over 2 segments it fails; at 3 it is reported."""
    edit(root / "v2" / "es" / "sms.mustache", "Ignora este mensaje.", "Ignóralo.")
    [problem] = problems(check_templates(owned(root), "v2"))
    assert problem.startswith("v2/es/sms.mustache: needs 3 segments (ucs2) even without")

    [default, spanish] = check_templates(owned(root, sms={"max_segments": 3}), "v2")
    assert spanish.problems == ()
    longest = {s.sample: s for s in spanish.sms}["a 100-character GSM-7 name"]
    assert (longest.encoding, longest.segments, longest.name_kept) == ("ucs2", 3, False)
    assert {s.encoding for s in default.sms} == {"gsm7"}


@pytest.mark.parametrize("tag", ["{{{display_name}}}", "{{& display_name}}"])
def test_unescaped_user_text_in_html_fails_the_check(root: Path, tag: str) -> None:
    """HTML that puts the display name in a triple mustache (or {{& }}) fails."""
    edit(root / "v2" / "email_html.mustache", "Hi {{display_name}},", f"Hi {tag},")
    found = problems(check_templates(owned(root), "v2"))
    assert "v2/email_html.mustache line 10: {{{display_name}}} puts user text into HTML" in found[0]
    assert len(found) == 1


def test_bad_locale_directory_name_fails_the_check(root: Path) -> None:
    """A locale directory must be named as the tag it serves (es-MX, not es_mx)."""
    (root / "v2" / "es").rename(root / "v2" / "es-mx")
    assert problems(check_templates(owned(root), "v2")) == [
        "v2/es-mx: not a locale directory name; name it es-MX"
    ]


def test_minutes_wording_must_cover_the_languages_plural_categories(root: Path) -> None:
    """A [minutes] table missing a category the language needs (Polish few) fails."""
    shutil.copytree(root / "v2" / "es", root / "v2" / "pl")
    (root / "v2" / "pl" / "messages.toml").write_text(
        '[minutes]\none = "{n} minuta"\nother = "{n} minut"\n'
    )
    [problem] = problems(check_templates(owned(root), "v2"))
    assert problem == (
        "v2/pl/messages.toml: minutes: no wording for the CLDR plural categories few, many"
        " (numbers up to 10)"
    )


def test_require_templates_names_the_policy_in_one_line(root: Path) -> None:
    """The sweep's guard names the policy, the version and the first problem."""
    (root / "v2" / "sms.mustache").unlink()
    (root / "v2" / "email_text.mustache").unlink()
    with pytest.raises(ConfigError) as excinfo:
        require_templates(owned(root))
    assert str(excinfo.value) == (
        "policy.default.template_version: 'v2' fails its check: v2/email_text.mustache:"
        " missing (+1 more); see resetctl templates check --version v2"
    )


def test_init_copies_the_built_ins_and_never_overwrites(tmp_path: Path) -> None:
    """init copies every built-in version; a second init refuses and changes nothing."""
    target = tmp_path / "etc" / "templates"
    assert init_templates(target) == ["v1"]
    assert (target / "v1" / "es" / "sms.mustache").is_file()
    (target / "v1" / "sms.mustache").write_text("ours\n")

    with pytest.raises(ConfigError, match="never overwrites"):
        init_templates(target)
    assert (target / "v1" / "sms.mustache").read_text() == "ours\n"


@pytest.mark.slow
def test_cli_check_and_sweep_refusal(tmp_path: Path, root: Path, clock: FakeClock) -> None:
    """`templates check` exits 2 listing problems; a sweep on that config exits 2 unclaimed."""
    config = tmp_path / "resetctl.toml"
    config.write_text(f'[templates]\ndir = "{root}"\n[policy.default]\ntemplate_version = "v2"\n')
    db = tmp_path / "resetctl.db"
    good = resetctl("templates", "check", "--config", str(config), "--json")
    assert good.returncode == 0, good.stderr
    assert [c["ok"] for c in json.loads(good.stdout)] == [True, True]

    edit(root / "v2" / "es" / "email_html.mustache", "{{reset_url}}</a>", "{{{reset_url}}}</a>")
    with Store(db) as store:
        [result] = enqueue(store, owned(root), [reset_request()], clock())
    bad = resetctl("templates", "check", "--config", str(config))
    swept = resetctl("sweep", "--config", str(config), db=db)

    assert bad.returncode == 2
    assert "v1" not in bad.stdout.split(":")[0]
    assert "v2/es: FAIL" in bad.stdout
    assert "{{{reset_url}}} puts into HTML unescaped" in bad.stdout
    assert swept.returncode == 2
    assert swept.stdout == ""
    assert swept.stderr.count("\n") == 1
    assert swept.stderr.startswith("error: policy.default.template_version: 'v2' fails its check")
    with Store(db) as store:
        loaded = store.load_notice(result.notice_id)
        assert loaded is not None
        assert (loaded.state.phase.value, loaded.lease_owner) == ("queued", None)
        assert store.event_rows(result.notice_id) == []
