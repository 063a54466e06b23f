"""Templates the operator owns: copy the built-ins, check every version, preview one.

A check renders each version and locale directory with hostile and extreme sample
data and reports what would go wrong in production: a missing file, a Mustache syntax
error, a variable the render model lacks, the reset URL in a subject, an SMS over the
policy's segment limit, user text put into HTML unescaped. It warns (without failing)
when the subject, a header, shows text the person chose. Only sample data is ever
rendered here: never a notice's contact data or reset URL.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from babel import Locale
from chevron.tokenizer import ChevronError, tokenize

from resetctl.config import Settings
from resetctl.errors import ConfigError, label
from resetctl.policy import Policy
from resetctl.render import (
    EMAIL_HTML_FILE,
    EMAIL_SUBJECT_FILE,
    MAX_DISPLAY_NAME,
    MESSAGES_FILE,
    MODEL_VARIABLES,
    SMS_FILE,
    TEMPLATE_FILES,
    USER_VARIABLES,
    RenderModel,
    SmsEncoding,
    SmsTooLong,
    TemplateError,
    canonical_locale,
    configured_root,
    header_text,
    load_messages,
    render_email,
    render_sms,
    templates_root,
)

#: A sample reset URL of the length the SMS budget is sized for (60 characters).
SAMPLE_URL = "https://market.example.com/reset?token=SAMPLE0k2mN8pL4sT6wYb"
#: Display names a check renders: none, the longest enqueue accepts in and outside
#: GSM-7, characters outside the BMP, and markup aimed at the HTML.
SAMPLE_NAMES: tuple[tuple[str, str | None], ...] = (
    ("no display name", None),
    (
        f"a {MAX_DISPLAY_NAME}-character GSM-7 name",
        ("Maximiliane Wolkenstein " * 5)[:MAX_DISPLAY_NAME],
    ),
    (
        f"a {MAX_DISPLAY_NAME}-character name outside GSM-7",
        ("Жанна Анатольевна Ōtsuka " * 5)[:MAX_DISPLAY_NAME],
    ),
    (f"a name of {MAX_DISPLAY_NAME} emoji", "\U0001f600" * MAX_DISPLAY_NAME),
    ("a name with markup", "<script>alert('x')</script> & \"{{reset_url}}\""),
)
#: What a preview greets: markup, so a person sees it arrive as text.
PREVIEW_NAME = "Ada <b>Lovelace</b> & Co"
_MARKUP_SAMPLE = SAMPLE_NAMES[-1][1]
# Tag kinds chevron's tokenizer yields for well-formed templates; anything else (its
# "no escape?" for an unbalanced triple mustache) is a syntax error.
_NAMED_TAGS = frozenset({"variable", "no escape", "section", "inverted section"})
_OTHER_TAGS = frozenset({"literal", "end", "set delimiter", "partial"})
_VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: What a retired version's notices need until they end.
KEEP_ADVICE = "keep a version until health shows no live notice on it"

#: The stored policies live notices were enqueued under, each with its live-notice count
#: (:meth:`resetctl.store.Store.live_policy_counts`).
LivePolicies = Sequence[tuple[Policy, int]]


@dataclass(frozen=True, slots=True)
class CheckLimits:
    """What the configuration gives a version: its policies' limits, the support label."""

    #: the smallest sms.max_segments among the policies naming it
    max_segments: int
    #: the most minutes a link lasts under them (their longest ttl)
    max_minutes: int
    #: the configured support_label, rendered as it will be
    support_label: str = "Support"


@dataclass(frozen=True, slots=True)
class SmsSample:
    """How the SMS of one directory came out for one sample display name."""

    sample: str
    encoding: SmsEncoding
    segments: int
    #: False when the renderer dropped the name to stay within the segment limit
    name_kept: bool


@dataclass(frozen=True, slots=True)
class CheckedCopy:
    """The check of one template directory: a version's default copy or one locale."""

    version: str
    #: the locale directory, or None for the version's default copy
    locale: str | None
    problems: tuple[str, ...]
    sms: tuple[SmsSample, ...]
    #: what works but deserves a second look (the check still passes)
    warnings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``v2`` or ``v2/es``."""
        return self.version if self.locale is None else f"{self.version}/{self.locale}"

    def to_json(self) -> dict[str, object]:
        """The ``--json`` shape."""
        return {
            "version": self.version,
            "locale": self.locale,
            "ok": not self.problems,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "sms": [
                {
                    "sample": s.sample,
                    "encoding": str(s.encoding),
                    "segments": s.segments,
                    "name_kept": s.name_kept,
                }
                for s in self.sms
            ],
        }


def init_templates(destination: Path) -> list[str]:
    """Copy the built-in versions into ``destination``; returns the versions copied.

    Never overwrites: copy an operator already owns is refused whole. Directories are
    made 0755 and files 0644 whatever the umask or the installed files' modes: a copy
    anyone else could edit would let them point every reset link elsewhere (a sweep
    refuses to render from one).
    """
    from resetctl.files import SHARED_DIR, SHARED_FILE, copy_tree, make_directories

    source = templates_root()
    versions = sorted(p.name for p in source.iterdir() if p.is_dir())
    taken = [v for v in versions if (destination / v).exists()]
    if taken:
        raise ConfigError(
            f"templates init: {destination} already has {', '.join(taken)}; init never"
            " overwrites templates you own"
        )
    try:
        make_directories(destination, SHARED_DIR)
        for version in versions:
            copy_tree(source / version, destination / version, SHARED_DIR, SHARED_FILE)
    except OSError as exc:
        raise ConfigError(f"templates init: cannot write {destination} ({exc.strerror})") from None
    return versions


def limits_for(settings: Settings, version: str, live: LivePolicies = ()) -> CheckLimits:
    """The limits of the policies naming ``version``: the configured ones and the stored
    ones live notices were enqueued under (the default policy's if none does)."""
    naming = [p for p in settings.policies.values() if p.template_version == version]
    naming += [p for p, _ in live if p.template_version == version]
    policies = naming or [settings.default_policy]
    return CheckLimits(
        max_segments=min(p.sms_max_segments for p in policies),
        max_minutes=max(math.floor(p.ttl / 60) for p in policies),
        support_label=settings.support_label,
    )


def live_by_version(live: LivePolicies) -> dict[str, int]:
    """Live notices per template version (their stored policy's)."""
    counts: dict[str, int] = {}
    for policy, count in live:
        counts[policy.template_version] = counts.get(policy.template_version, 0) + count
    return dict(sorted(counts.items()))


@dataclass(frozen=True, slots=True)
class VersionUse:
    """Who renders a template version: configured policies, and live notices."""

    version: str
    #: the configured policies naming it (new notices render it)
    policies: tuple[str, ...]
    #: live notices whose stored policy names it; None when no database was read
    live_notices: int | None


@dataclass(frozen=True, slots=True)
class TemplatesReport:
    """``templates check``: each directory checked, and who uses each version."""

    copies: tuple[CheckedCopy, ...]
    #: every version configured or in use, by name
    uses: tuple[VersionUse, ...]
    #: one line per checked version live notices use that is missing or fails its check
    in_use_failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when every copy checked passes (so no version in use is missing)."""
        return not self.in_use_failures and not any(copy.problems for copy in self.copies)

    def to_json(self) -> list[dict[str, object]]:
        """The ``--json`` shape: one entry per copy, with its version's policies and
        live notices (null when no database was read)."""
        uses = {use.version: use for use in self.uses}
        shown = []
        for copy in self.copies:
            use = uses.get(copy.version)
            shown.append(
                {
                    **copy.to_json(),
                    "policies": list(use.policies) if use else [],
                    "live_notices": use.live_notices if use else None,
                }
            )
        return shown


def templates_report(
    settings: Settings, version: str | None = None, live: LivePolicies | None = None
) -> TemplatesReport:
    """Check ``version`` (or every version on disk, configured or in use) and say who
    uses each; ``live`` is None when there is no database to read."""
    configured: dict[str, list[str]] = {}
    for name, policy in sorted(settings.policies.items()):
        configured.setdefault(policy.template_version, []).append(name)
    counts = live_by_version(live or ())
    uses = tuple(
        VersionUse(v, tuple(configured.get(v, ())), None if live is None else counts.get(v, 0))
        for v in sorted(configured.keys() | counts.keys())
    )
    copies = tuple(check_templates(settings, version, live or ()))
    failures = tuple(
        failure
        for used, failure in in_use_failures(settings, live or ())
        if version is None or used == version
    )
    return TemplatesReport(copies, uses, failures)


def check_templates(
    settings: Settings, version: str | None = None, live: LivePolicies = ()
) -> list[CheckedCopy]:
    """Check ``version``, or every version under the templates root, named by a policy
    or used by a live notice (``live``)."""
    root = configured_root(settings.templates_dir)
    if version is not None:
        versions = [version]
    elif root.is_dir():
        on_disk = {p.name for p in root.iterdir() if p.is_dir() and _VERSION_NAME.fullmatch(p.name)}
        named = {p.template_version for p in settings.policies.values()}
        versions = sorted(on_disk | named | live_by_version(live).keys())
    else:
        return [CheckedCopy("(none)", None, (f"templates dir {root} is not a directory",), ())]
    return [
        copy
        for name in versions
        for copy in check_version(root, name, limits_for(settings, name, live))
    ]


def require_templates(settings: Settings, live: LivePolicies = ()) -> None:
    """Raise ConfigError unless every template version a policy names, or a live notice
    uses (``live``: the store's live policy counts), passes its check.

    A sweep calls this before it claims anything: a broken or retired version would
    otherwise fail every notice it renders, one by one, while their links run out.
    Copy that group or others may change is refused (see :func:`require_owned_copy`).
    """
    root = configured_root(settings.templates_dir)
    require_owned_copy(root)
    counts = live_by_version(live)
    for name, policy in sorted(settings.policies.items()):
        version = policy.template_version
        problems = _version_problems(root, version, limits_for(settings, version, live))
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            used = f", and {_live_notices(counts[version])}" if counts.get(version) else ""
            raise ConfigError(
                f"policy.{label(name)}.template_version: {version!r} fails its check: "
                f"{problems[0]}{more}{used}; see resetctl templates check --version {version}"
            )
    for _, failure in in_use_failures(settings, live):
        raise ConfigError(failure)


def require_owned_copy(root: Path) -> None:
    """ConfigError when group or others may change the templates under ``root`` (or a
    directory above it, short of a sticky one such as /tmp).

    Refused, not warned about: whoever can edit the copy can replace ``{{reset_url}}``
    with a link to their own host and receive every reset link a sweep sends, which is
    every account's password. A warning would sit in a cron log while the links went
    out; a sweep that exits 2 stops the sending and its stalled-sweep alert pages.
    """
    from resetctl.files import writable_by_others

    loose = writable_by_others(root)
    if loose:
        path, mode = loose[0]
        more = f" (+{len(loose) - 1} more)" if len(loose) > 1 else ""
        raise ConfigError(
            f"templates: {path} can be changed by group or others (mode {mode:04o}){more};"
            " whoever edits the copy can redirect every reset link: run chmod go-w on it"
        )


def in_use_failures(settings: Settings, live: LivePolicies) -> list[tuple[str, str]]:
    """(version, one line) for each version live notices use that is missing from the
    templates dir or fails its check."""
    root = configured_root(settings.templates_dir)
    failures = []
    for version, count in live_by_version(live).items():
        used = f"and {_live_notices(count)}"
        if _VERSION_NAME.fullmatch(version) and not (root / version).is_dir():
            failures.append(
                (
                    version,
                    f"templates: version {version} is missing from {root}, {used};"
                    f" restore it ({KEEP_ADVICE})",
                )
            )
            continue
        problems = _version_problems(root, version, limits_for(settings, version, live))
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            failures.append(
                (
                    version,
                    f"templates: version {version} fails its check ({problems[0]}{more}),"
                    f" {used}; restore it (see resetctl templates check --version {version};"
                    f" {KEEP_ADVICE})",
                )
            )
    return failures


def _live_notices(count: int) -> str:
    """``1 live notice uses it`` or ``3 live notices use it``."""
    return "1 live notice uses it" if count == 1 else f"{count} live notices use it"


def _version_problems(root: Path, version: str, limits: CheckLimits) -> list[str]:
    return [problem for copy in check_version(root, version, limits) for problem in copy.problems]


# A sweep process checks each version once; templates are deployed before it starts.
@functools.lru_cache(maxsize=64)
def check_version(root: Path, version: str, limits: CheckLimits) -> tuple[CheckedCopy, ...]:
    """Check a version's default copy and every locale directory in it."""
    version_dir = root / version
    if not _VERSION_NAME.fullmatch(version) or ".." in version:
        return (CheckedCopy(version, None, (f"{label(version)}: not a version name",), ()),)
    if not version_dir.is_dir():
        return (CheckedCopy(version, None, (f"{version}: not a directory in {root}",), ()),)
    checked = [_check_copy(root, version, None, limits)]
    for entry in sorted(version_dir.iterdir()):
        if not entry.is_dir():
            continue
        try:
            locale = canonical_locale(entry.name)
        except ValueError:
            locale = None
        if locale != entry.name:
            hint = f"; name it {locale}" if locale else " such as es or es-MX"
            problem = f"{version}/{label(entry.name)}: not a locale directory name{hint}"
            checked.append(CheckedCopy(version, entry.name, (problem,), ()))
            continue
        checked.append(_check_copy(root, version, locale, limits))
    return tuple(checked)


def _check_copy(root: Path, version: str, locale: str | None, limits: CheckLimits) -> CheckedCopy:
    where = version if locale is None else f"{version}/{locale}"
    problems: list[str] = []
    try:
        language, minutes = load_messages(root, version, locale)
    except TemplateError as exc:
        return CheckedCopy(version, locale, (str(exc),), ())
    if minutes is not None:
        plural = Locale.parse(locale or language or "en", sep="-").plural_form
        needed = {plural(n) for n in range(limits.max_minutes + 1)} - set(minutes)
        if needed:
            problems.append(
                f"{where}/{MESSAGES_FILE}: minutes: no wording for the CLDR plural"
                f" categories {', '.join(sorted(needed))} (numbers up to {limits.max_minutes})"
            )
    for file_name in TEMPLATE_FILES:
        problems += _tag_problems(root / where / file_name, f"{where}/{file_name}")
    if problems:
        return CheckedCopy(version, locale, tuple(problems), ())
    rendered_problems, sms, shown = _render_samples(root, version, locale, where, limits)
    warnings = () if not shown else (_user_text_in_subject(root / where, where),)
    return CheckedCopy(version, locale, tuple(rendered_problems), tuple(sms), warnings)


def _user_text_in_subject(directory: Path, where: str) -> str:
    """The warning for a subject that shows a sample display name, at its first tag."""
    text = (directory / EMAIL_SUBJECT_FILE).read_text(encoding="utf-8")
    found = [_line_of(text, kind, name) for name in USER_VARIABLES for kind in _TAG_OPENINGS]
    at = min((line for line in found if line), key=lambda line: int(line.split()[-1]), default="")
    return (
        f"{where}/{EMAIL_SUBJECT_FILE}{at}: the subject shows the display name, text the"
        " person chose, in a header of your marketplace's email (resetctl keeps it to one"
        " line with no encoded word, but the words are theirs); consider greeting in the body"
    )


def _tag_problems(path: Path, where: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [f"{where}: missing"]
    except (OSError, UnicodeDecodeError):
        return [f"{where}: not readable UTF-8 text"]
    try:
        tokens = list(tokenize(text))
    except ChevronError as exc:
        return [f"{where}: Mustache syntax error: {'; '.join(str(exc).splitlines())}"]
    problems: list[str] = []
    file_name = path.name
    for kind, key in _tags(tokens):
        at = f"{where}{_line_of(text, kind, key)}"
        name = key.split(".", 1)[0]
        if kind not in _NAMED_TAGS and kind not in _OTHER_TAGS:
            problems.append(
                f"{at}: Mustache syntax error: unbalanced {{{{{{…}}}}}} near {label(key)}"
            )
        elif kind == "partial":
            problems.append(f"{at}: partials ({{{{> {label(key)}}}}}) are not supported")
        elif kind in _NAMED_TAGS and key != "." and "." in key:
            # The model is flat: a dotted name would reach a string's Python attributes
            # ({{#reset_url.split}} calls str.split as a lambda).
            problems.append(f"{at}: dotted name {label(key)}: the template model is flat")
        elif kind in _NAMED_TAGS and key != "." and name not in MODEL_VARIABLES:
            problems.append(
                f"{at}: unknown variable {label(key)} (known: {', '.join(sorted(MODEL_VARIABLES))})"
            )
        elif kind in _NAMED_TAGS and file_name == EMAIL_SUBJECT_FILE and name == "reset_url":
            problems.append(f"{at}: the reset URL must never be in a subject")
        elif kind == "no escape" and file_name == EMAIL_HTML_FILE:
            whose = "user text " if name == "display_name" else ""
            problems.append(
                f"{at}: {{{{{{{label(key)}}}}}}} puts {whose}into HTML unescaped;"
                f" use {{{{{label(key)}}}}}"
            )
    return problems


def _tags(tokens: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    for kind, key in tokens:
        if kind != "literal":
            yield kind, key.strip()


_TAG_OPENINGS = {
    "variable": r"\{\{\s*",
    "no escape": r"\{\{(?:\{|&)\s*",
    "section": r"\{\{#\s*",
    "inverted section": r"\{\{\^\s*",
    "partial": r"\{\{>\s*",
}


def _line_of(text: str, kind: str, key: str) -> str:
    """`` line N`` of the first such tag naming ``key``, else nothing (a tag written with
    other delimiters is not looked for)."""
    opening = _TAG_OPENINGS.get(kind, r"\{\{\{?\s*")
    match = re.search(opening + re.escape(key) + r"\s*\}", text)
    return f" line {text.count(chr(10), 0, match.start()) + 1}" if match else ""


def _render_samples(
    root: Path, version: str, locale: str | None, where: str, limits: CheckLimits
) -> tuple[list[str], list[SmsSample], bool]:
    """Problems, SMS samples, and whether a sample display name reached the subject."""
    problems: list[str] = []
    sms_samples: list[SmsSample] = []
    name_in_subject = False
    for sample, name in SAMPLE_NAMES:
        for minutes in sorted({0, 1, 2, 5, limits.max_minutes}):
            model = RenderModel(SAMPLE_URL, minutes, limits.support_label, name, locale)
            try:
                email = render_email(model, version, root)
                sms = render_sms(model, version, limits.max_segments, root)
            except SmsTooLong as exc:
                if any(p.startswith(f"{where}/{SMS_FILE}: needs") for p in problems):
                    continue  # the first (shortest) case says it
                problems.append(
                    f"{where}/{SMS_FILE}: needs {exc.segments} segments ({exc.encoding}) even"
                    f" without the display name ({sample}, {minutes} minutes, a"
                    f" {len(SAMPLE_URL)}-character URL); sms.max_segments is {exc.max_segments}"
                )
                continue
            except TemplateError as exc:
                problems.append(str(exc))
                continue
            if SAMPLE_URL in email.subject:
                problems.append(f"{where}/{EMAIL_SUBJECT_FILE}: the reset URL reaches the subject")
            if name and header_text(name) in email.subject:
                name_in_subject = True
            if name == _MARKUP_SAMPLE and "<script>" in email.html:
                problems.append(
                    f"{where}/{EMAIL_HTML_FILE}: the display name reaches the HTML unescaped"
                )
            if minutes == limits.max_minutes:
                collapsed = " ".join((name or "").split())
                kept = bool(collapsed) and collapsed in sms.body
                sms_samples.append(SmsSample(sample, sms.encoding, sms.segments, kept))
    return list(dict.fromkeys(problems)), sms_samples, name_in_subject


@dataclass(frozen=True, slots=True)
class Preview:
    """What ``templates preview`` wrote."""

    #: the template version rendered
    version: str
    files: Mapping[str, Path]
    #: the locale directory rendered, or None for the version's default copy
    locale: str | None
    encoding: SmsEncoding
    segments: int
    max_segments: int


def preview(
    settings: Settings,
    version: str,
    locale: str | None,
    output: Path,
    *,
    minutes: int = 10,
    display_name: str = PREVIEW_NAME,
) -> Preview:
    """Render sample data into ``output``: email.html, email.txt (with its subject), sms.txt."""
    if locale is not None:
        try:
            locale = canonical_locale(locale)
        except ValueError:
            raise ConfigError(
                "--locale: not a BCP 47 language tag CLDR knows (e.g. es-MX)"
            ) from None
    root = configured_root(settings.templates_dir)
    limits = limits_for(settings, version)
    model = RenderModel(SAMPLE_URL, minutes, settings.support_label, display_name, locale)
    try:
        email = render_email(model, version, root)
        # The SMS as written, even over the limit: the person previewing should see it.
        sms = render_sms(model, version, None, root)
    except TemplateError as exc:
        raise ConfigError(f"templates: {exc}") from None
    files = {
        "html": output / "email.html",
        "text": output / "email.txt",
        "sms": output / "sms.txt",
    }
    try:
        output.mkdir(parents=True, exist_ok=True)
        files["html"].write_text(email.html, encoding="utf-8")
        files["text"].write_text(f"Subject: {email.subject}\n\n{email.text}", encoding="utf-8")
        files["sms"].write_text(sms.body + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--output: cannot write {output} ({exc.strerror})") from None
    return Preview(version, files, email.locale, sms.encoding, sms.segments, limits.max_segments)
