"""README's examples run as written: every ```sh, ```bash, ```console and ```python block,
in document order, in one scratch directory, so a block gets what the blocks before it
made (the database, the exported week, the copied templates). A block that cannot run
here says so right above its fence (``<!-- not run: why -->``); any other block runs, so
a new example is run by default and one that cannot run fails this file.

How the run stands in for a reader's machine, and nothing more:

- A shell block runs as one script under ``bash -e -o pipefail`` with the test venv's
  ``bin`` first on PATH (``resetctl`` resolves to this checkout), HOME in the scratch
  directory, no RESETCTL_ variable, TWILIO_AUTH_TOKEN set (the API section says it comes
  from there) and EDITOR=true (an edit that changes nothing). It must exit 0.
- A block whose lines start with ``$ `` is a transcript: each command runs on its own and
  what it prints must have the shape shown (the same keys in the same order, the same
  flags and words; ids, times and counts may differ; ``...`` stands for more keys).
- Absolute paths under ROOTS are moved under a scratch root, where the directories the
  server block makes already exist; any other absolute path is refused before anything
  runs. A block of another language (```toml, ```mustache) whose first line is a comment
  naming such a path is that file as the reader ends up with it: it is written there.
- An id README shows (``ntc_…``, ``obx_…``) stands for the latest id of that kind an
  earlier block printed.
- ``resetctl sweep --max-runtime 55s`` sweeps for 1 s.
- GIVEN holds the files README's prose leaves to the reader (the candidates' policies).
- Python blocks under one heading share a namespace (a section is one program); a new
  heading starts a fresh one, so a snippet that forgets its imports fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import resetctl
from resetctl import ops
from resetctl.ops_providers import NO_HEALTHY_PROVIDER

README = Path(__file__).resolve().parent.parent / "README.md"
RUN = ("sh", "bash", "console", "python")
BASH = "/bin/bash"
NOT_RUN = re.compile(r"^<!-- not run: (?P<why>.*?) -->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)$")
#: Absolute paths README's examples use, each moved under the scratch root.
ROOTS = (
    "/etc/resetctl",
    "/var/lib/resetctl",
    "/var/log/resetctl",
    "/var/lib/node_exporter",
    "/opt/resetctl",
    "/tmp/preview",
)
#: What the server block leaves behind that later blocks write into.
MADE_BY_THE_SERVER_BLOCK = (
    "/etc/resetctl",
    "/var/lib/resetctl",
    "/var/log/resetctl",
    "/var/lib/node_exporter/textfile",
)
ABSOLUTE = re.compile(r"(?<![\w.:/~$-])/(?:etc|var|opt|srv|home|root|tmp|usr)/[\w./*-]*")
RELOCATE = re.compile(r"(?<![\w.:/~$-])(?:" + "|".join(map(re.escape, ROOTS)) + r")(?![\w.-])")
FILE_COMMENT = re.compile(r"^(?:#|\{\{!)\s*(?P<path>/[\w./-]*[\w-])")
IDS = re.compile(r"\b(?P<kind>ntc|obx)_[0-9a-f]{12,}\b")
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)$")
#: The candidates `replay --policy strict.toml --policy loose.toml` compares.
GIVEN = {
    "strict.toml": '[policy.default]\nversion = 2\nfallback_reserve = "4m"\n',
    "loose.toml": '[policy.default]\nversion = 2\nfallback_reserve = "2m"\n',
}


@dataclass(frozen=True)
class Block:
    """One fenced block of README."""

    #: line of the opening fence, counted from 1
    line: int
    lang: str
    text: str
    #: the nearest heading above it
    heading: str
    #: the marker's reason, when the block says it is not run
    not_run: str | None

    def where(self) -> str:
        return f"README.md:{self.line} (```{self.lang} under {self.heading!r})"


def blocks(markdown: str) -> list[Block]:
    """Every fenced block, in order; a ``not run`` marker anywhere but right above a
    fence is an error (it would silently mark nothing)."""
    lines = markdown.splitlines()
    found: list[Block] = []
    heading = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = FENCE.match(line)
        if fence is None:
            if line.startswith("#"):
                heading = line
            marker = NOT_RUN.match(line)
            if marker is not None or line.startswith("<!-- not run"):
                following = lines[index + 1] if index + 1 < len(lines) else ""
                where = f"README.md:{index + 1}"
                assert marker is not None, f"{where}: a marker reads <!-- not run: why -->"
                assert FENCE.match(following), (
                    f"{where}: a 'not run' marker belongs right above a fence"
                )
                assert marker.group("why").strip(), f"README.md:{index + 1}: say why not"
            index += 1
            continue
        end = lines.index("```", index + 1)
        marker = NOT_RUN.match(lines[index - 1]) if index else None
        found.append(
            Block(
                line=index + 1,
                lang=fence.group("lang"),
                text="\n".join(lines[index + 1 : end]) + "\n",
                heading=heading,
                not_run=marker.group("why") if marker else None,
            )
        )
        index = end + 1
    return found


class ExampleFailed(AssertionError):
    """A README example did not run as written."""


@dataclass
class Run:
    """What running README's examples left: each block's output, the Python sections'
    namespaces and the scratch directory they ran in."""

    scratch: Path
    root: Path
    env: dict[str, str]
    outputs: dict[int, str] = field(default_factory=dict)
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    ran: list[Block] = field(default_factory=list)
    failure: str | None = None
    #: the latest id of each kind the examples printed
    latest: dict[str, str] = field(default_factory=dict)

    def relocated(self, block: Block) -> str:
        """The block's text with README's absolute paths moved under the scratch root; a
        path outside ROOTS is refused before it can touch the machine."""
        outside = [p for p in ABSOLUTE.findall(block.text) if not p.startswith(ROOTS)]
        if outside:
            raise ExampleFailed(f"{block.where()}: {outside} is outside the scratch root")
        return RELOCATE.sub(lambda m: f"{self.root}{m.group(0)}", block.text)

    def with_ids(self, text: str, block: Block) -> str:
        """README's ids replaced by the latest the examples printed of their kind."""

        def real(match: re.Match[str]) -> str:
            kind = match.group("kind")
            if kind not in self.latest:
                raise ExampleFailed(f"{block.where()}: no earlier example printed a {kind}_ id")
            return self.latest[kind]

        return IDS.sub(real, text)

    def saw(self, output: str) -> None:
        for match in IDS.finditer(output):
            self.latest[match.group("kind")] = match.group(0)


def _shell(run: Run, script: str, block: Block) -> str:
    script = re.sub(r"(resetctl\b.*\bsweep\b.*--max-runtime )55s\b", r"\g<1>1s", script)
    done = subprocess.run(
        [BASH, "-e", "-o", "pipefail", "-c", script],
        cwd=run.scratch,
        env=run.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise ExampleFailed(
            f"{block.where()}: exit {done.returncode}\n$ {script}\n{done.stdout}{done.stderr}"
        )
    run.saw(done.stdout)
    return done.stdout


def transcript(text: str) -> list[tuple[str, list[str]]]:
    """A ``$`` transcript's commands (continued lines joined) and the lines each shows."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command += "\n" + next(lines)
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _same_value(shown: Any, printed: Any) -> bool:
    if isinstance(shown, bool) or shown is None:
        return printed is shown
    if isinstance(shown, int | float):
        return isinstance(printed, int | float) and not isinstance(printed, bool)
    if isinstance(shown, str) and isinstance(printed, str):
        shown_id, printed_id = IDS.fullmatch(shown), IDS.fullmatch(printed)
        if shown_id is not None:
            return printed_id is not None and printed_id["kind"] == shown_id["kind"]
        if TIME.match(shown):
            return TIME.match(printed) is not None
        return shown == printed
    return type(shown) is type(printed)


def same_shape(shown: str, printed: str) -> bool:
    """Whether a printed line has the shape of the line README shows."""
    open_ended = shown.endswith(", ...}")
    try:
        expected = json.loads(shown.removesuffix(", ...}") + "}" if open_ended else shown)
        actual = json.loads(printed)
    except ValueError:
        normal = [re.sub(r"\d+(\.\d+)?", "<n>", IDS.sub("<id>", s)) for s in (shown, printed)]
        return normal[0] == normal[1]
    if not (isinstance(expected, dict) and isinstance(actual, dict)):
        return _same_value(expected, actual)
    keys = list(actual)[: len(expected)] if open_ended else list(actual)
    return keys == list(expected) and all(_same_value(v, actual[k]) for k, v in expected.items())


def _run_shell(run: Run, block: Block) -> str:
    text = run.relocated(block)
    steps = transcript(text)
    if not steps:
        return _shell(run, run.with_ids(text, block), block)
    printed = []
    for command, shown in steps:
        output = _shell(run, run.with_ids(command, block), block)
        lines = output.splitlines()
        if len(lines) != len(shown) or not all(map(same_shape, shown, lines)):
            raise ExampleFailed(f"{block.where()}: $ {command}\nshows {shown}\nprints {lines}")
        printed.append(output)
    return "".join(printed)


def _run_python(run: Run, block: Block) -> str:
    namespace = run.namespaces.setdefault(block.heading, {"__name__": "readme"})
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(run.relocated(block), block.where(), "exec"), namespace)  # noqa: S102 -- README's own code
    except Exception as exc:
        raise ExampleFailed(f"{block.where()}: {type(exc).__name__}: {exc}") from exc
    run.saw(out.getvalue())
    return out.getvalue()


def _write_file(run: Run, block: Block, path: str) -> None:
    target = Path(RELOCATE.sub(lambda m: f"{run.root}{m.group(0)}", path))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(run.relocated(block), encoding="utf-8")


def run_examples(markdown: str, scratch: Path) -> Run:
    """Run every block of ``markdown`` that README does not mark, in order, in
    ``scratch``; the first failure stops the run and is kept in ``failure``."""
    root = scratch / "root"
    home = scratch / "home"
    for made in MADE_BY_THE_SERVER_BLOCK:
        (root / made.lstrip("/")).mkdir(parents=True, exist_ok=True)
    home.mkdir()
    for name, content in GIVEN.items():
        (scratch / name).write_text(content, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env |= {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
        "HOME": str(home),
        "EDITOR": "true",
        "TWILIO_AUTH_TOKEN": "readme-token",
    }
    run = Run(scratch=scratch, root=root, env=env)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(scratch)
        for name in list(os.environ):
            if name.startswith("RESETCTL_"):
                patch.delenv(name)
        patch.setenv("TWILIO_AUTH_TOKEN", env["TWILIO_AUTH_TOKEN"])
        for block in blocks(markdown):
            if block.not_run is not None:
                continue
            first = block.text.splitlines()[0] if block.text.strip() else ""
            named = FILE_COMMENT.match(first)
            try:
                if block.lang not in RUN:
                    if named is not None and named.group("path").startswith(ROOTS):
                        _write_file(run, block, named.group("path"))
                    continue
                if block.lang == "python":
                    run.outputs[block.line] = _run_python(run, block)
                else:
                    run.outputs[block.line] = _run_shell(run, block)
                run.ran.append(block)
            except ExampleFailed as exc:
                run.failure = str(exc)
                break
    return run


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """README's examples, run once for this file's tests."""
    scratch = tmp_path_factory.mktemp("readme")
    run = run_examples(README.read_text(encoding="utf-8"), scratch)
    try:
        yield run
    finally:
        for namespace in run.namespaces.values():
            for value in namespace.values():
                if isinstance(value, resetctl.Handle):
                    value.close()


def _ran_through(run: Run) -> None:
    """Fail with the first example that did not run, as the run reported it."""
    if run.failure is not None:
        pytest.fail(run.failure, pytrace=False)


def _output(run: Run, *, heading: str, contains: str) -> str:
    """The output of the one block under ``heading`` whose text holds ``contains``."""
    (block,) = [b for b in run.ran if b.heading == heading and contains in b.text]
    return run.outputs[block.line]


def test_every_example_runs_or_says_why_not(readme_run: Run) -> None:
    """Each shell and Python block of README runs as written, in order, unless a marker
    right above it says why it cannot run here."""
    _ran_through(readme_run)
    examples = [b for b in blocks(README.read_text(encoding="utf-8")) if b.lang in RUN]
    assert {b.line for b in readme_run.ran} == {b.line for b in examples if b.not_run is None}
    assert len(readme_run.ran) >= 20


def test_an_unmarked_example_that_cannot_run_fails(tmp_path: Path) -> None:
    """An example that fails is reported with its line, and the same block marked as not
    run is left alone."""
    example = "# Inspect\n\n```sh\nresetctl health --db missing.db\n```\n"
    failed = run_examples(example, tmp_path / "a")
    assert failed.failure is not None
    assert failed.failure.startswith("README.md:3 (```sh under '# Inspect'): exit 1")
    assert "missing.db" in failed.failure
    marked = run_examples(
        example.replace("```sh", "<!-- not run: no db -->\n```sh"), tmp_path / "b"
    )
    assert (marked.failure, marked.ran) == (None, [])


def test_a_python_section_runs_as_its_own_program(tmp_path: Path) -> None:
    """A Python block under a new heading starts without the previous section's names."""
    example = "# One\n\n```python\nimport json\n```\n\n# Two\n\n```python\njson.dumps(1)\n```\n"
    run = run_examples(example, tmp_path)
    assert run.failure is not None
    assert "README.md:9 (```python under '# Two'): NameError" in run.failure


def test_a_stray_marker_is_refused() -> None:
    """A 'not run' marker that is not right above a fence marks nothing, so it is an error."""
    with pytest.raises(AssertionError, match="belongs right above a fence"):
        blocks("<!-- not run: why -->\n\ntext\n")


def test_shown_output_is_compared_by_shape() -> None:
    """Ids, times and counts may differ from what README shows; keys, flags and words not."""
    shown = '{"id": "ntc_1a230f089c07c1e0f3", "created": true, "at": "2026-01-01T00:00:55Z", ...}'
    printed = {"id": "ntc_ffff0000ffff0000ff", "created": True, "at": "2027-02-02T01:02:03Z"}
    assert same_shape(shown, json.dumps({**printed, "more": 1}))
    assert not same_shape(shown, json.dumps({**printed, "created": False}))
    assert not same_shape(shown, json.dumps({**printed, "id": "obx_ffff0000ffff0000ff"}))
    assert not same_shape('{"claimed": 3}', '{"claimed": 3, "submitted": 1}')
    assert same_shape('{"claimed": 3}', '{"claimed": 0}')
    assert same_shape("ntc_1a230f089c07c1e0f3: 3 failed", "ntc_ffff0000ffff0000ff: 12 failed")
    assert not same_shape("3 failed", "3 accepted")


def test_the_api_section_has_an_example_per_method() -> None:
    """Each method of the handle has an example in "Use it from your application"."""
    section = "## Use it from your application"
    code = "\n".join(
        b.text
        for b in blocks(README.read_text(encoding="utf-8"))
        if b.lang == "python" and b.heading == section
    )
    for call in ("open(", ".enqueue(", ".inspect(", ".observe(", ".sweep(", ".health("):
        assert call in code, call
    assert ".close()" in code
    assert "with resetctl.open(" in code


def test_the_api_examples_do_what_the_section_says(readme_run: Run) -> None:
    """Run after the command line's examples, the API's enqueue finds the notice the
    command line made (one path, one idempotency key), a forged callback is refused and
    bad input names its problem."""
    _ran_through(readme_run)
    enqueued = _output(readme_run, heading="### Enqueue", contains="resetctl enqueue")
    notice_id = json.loads(enqueued)["notice_id"]
    section = "## Use it from your application"
    assert f"{notice_id} False False\n" in _output(
        readme_run, heading=section, contains="send=True"
    )
    observed = _output(readme_run, heading=section, contains="rc.observe(")
    assert observed == "403: not from Twilio; nothing recorded\n"
    refused = _output(readme_run, heading=section, contains="except resetctl.InputError")
    assert "reset_url: must be an absolute https:// URL" in refused
    assert (readme_run.scratch / "resetctl.db").is_file()


def test_the_flask_example_mounts_the_endpoint(readme_run: Run) -> None:
    """README's Flask application routes /hooks/twilio to the callback endpoint (a forged
    callback: 403) and keeps its own routes (404 here: it has none)."""
    _ran_through(readme_run)
    app = readme_run.namespaces["### Twilio's callbacks over HTTP"]["app"]
    client = app.test_client()
    forged = client.post(
        "/hooks/twilio?attempt=ntc_0%3Asms%3A1",
        data={"MessageSid": "SM" + "0" * 32, "MessageStatus": "delivered"},
        headers={"X-Twilio-Signature": "bm90LWEtc2lnbmF0dXJl"},
    )
    assert forged.status_code == 403
    assert client.get("/").status_code == 404


#: A metric README names, with the labels it says the metric carries.
METRIC = re.compile(r"`(?P<name>resetctl_[a-z_]+\*?)(?:\{(?P<labels>[a-z_, ]+)\})?`")
#: Names README gives `alerts`' checks (not metrics).
ALERT_NAMES = {
    ops.DEADLINE_AT_RISK,
    ops.ENDED_WITHOUT_SUCCESS,
    ops.SWEEP_STALLED,
    ops.COUNTRY_CAP_HIT,
    NO_HEALTHY_PROVIDER,
}


def test_every_metric_readme_names_is_one_resetctl_metrics_writes(readme_run: Run) -> None:
    """Each resetctl_* metric README names (a trailing * for a family) is in the file
    README's `resetctl metrics` example wrote over the examples' notices, with the labels
    README gives it."""
    _ran_through(readme_run)
    textfile = readme_run.root / "var/lib/node_exporter/textfile/resetctl.prom"
    samples = [
        sample
        for family in text_string_to_metric_families(textfile.read_text(encoding="utf-8"))
        for sample in family.samples
    ]
    named = [
        m
        for m in METRIC.finditer(README.read_text(encoding="utf-8"))
        if m["name"] not in ALERT_NAMES
    ]
    assert len(named) >= 5
    for mention in named:
        name = mention["name"]
        matching = [
            s
            for s in samples
            if s.name == name or (name.endswith("*") and s.name.startswith(name[:-1]))
        ]
        assert matching, f"README names {name}, which `resetctl metrics` does not write"
        for label in (
            (mention["labels"] or "").replace(" ", "").split(",") if mention["labels"] else []
        ):
            assert all(label in s.labels for s in matching), f"{name} has no label {label}"
