#!/usr/bin/env bash
# Mutation testing of resetctl's core: does the fast suite notice when the code is wrong?
#
#   bench/mutation.sh                 # everything below: under an hour on 2 cores
#   bench/mutation.sh segments        # one small target (SMS segment counting): a smoke run
#   bench/mutation.sh twilio sql      # several targets
#
# Targets:
#   machine   every function of resetctl/machine/ (the transition function, expiry and
#             reserve arithmetic)
#   store     claim_due, claim_notices, write_step and write_steps of
#             resetctl/store/notice_writes.py (the claims and the compare-and-set, shared
#             by both backends)
#   sql       hand-written mutants of the SQLite statements (resetctl/store/sqlite/dialect.py:
#             CLAIM_SQL, STEP_CAS_SQL):
#             mutmut mutates Python, and only inside functions, so it never touches SQL
#   twilio    compute_signature and verify_signature
#   render    resetctl/render.py (escaping data, SMS encoding and segment counting)
#   segments  sms_encoding, sms_segments and _pack only
#
# mutmut (pyproject's [tool.mutmut]) runs, for each mutant, only the tests among the fast
# in-process files listed there that reach the mutated function. It runs in a copy of the
# tree (MUTATION_WORKDIR, default $TMPDIR/resetctl-mutation) so its mutants/ folder never
# lands in the checkout and a run sees one version of the code; the copy is refreshed each
# run and mutmut retests only what changed. Look at a survivor with
#   cd "$MUTATION_WORKDIR" && mutmut show NAME
# Not part of CI: a mutant that survives is a question for a person, not a red build.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
work="${MUTATION_WORKDIR:-${TMPDIR:-/tmp}/resetctl-mutation}"
jobs="${MUTATION_JOBS:-$(nproc)}"

if ! "$python" -c "import mutmut" 2>/dev/null; then
    echo "installing mutmut (pyproject's mutation extra)"
    "$python" -m pip install -q "mutmut>=3.8,<4"
fi
mutmut="$(dirname "$python")/mutmut"

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(machine store sql twilio render)

globs=()
run_sql=0
for target in "${targets[@]}"; do
    case "$target" in
        machine) globs+=("resetctl.machine.*") ;;
        store) globs+=("resetctl.store.notice_writes.xǁNoticeWritesǁclaim_due__mutmut_*"
                       "resetctl.store.notice_writes.xǁNoticeWritesǁclaim_notices__mutmut_*"
                       "resetctl.store.notice_writes.xǁNoticeWritesǁwrite_step__mutmut_*"
                       "resetctl.store.notice_writes.xǁNoticeWritesǁwrite_steps__mutmut_*") ;;
        sql) run_sql=1 ;;
        twilio) globs+=("resetctl.transports.twilio.x_compute_signature__mutmut_*"
                        "resetctl.transports.twilio.x_verify_signature__mutmut_*") ;;
        render) globs+=("resetctl.render.*") ;;
        segments) globs+=("resetctl.render.x_sms_encoding__mutmut_*"
                          "resetctl.render.x_sms_segments__mutmut_*"
                          "resetctl.render.x__pack__mutmut_*") ;;
        *) echo "unknown target: $target" >&2; exit 2 ;;
    esac
done

mkdir -p "$work"
rm -rf "$work/resetctl" "$work/tests" "$work/templates"
cp -a "$repo/resetctl" "$repo/tests" "$repo/templates" "$repo/schema.sql" "$repo/pyproject.toml" "$work/"
cd "$work"
started=$SECONDS

if [ ${#globs[@]} -gt 0 ]; then
    "$mutmut" run --max-children "$jobs" "${globs[@]}" > mutmut.log 2>&1 || {
        tail -40 mutmut.log >&2
        echo "mutmut failed; its log: $work/mutmut.log" >&2
        exit 1
    }
fi

"$python" - "$run_sql" "${globs[@]}" <<'PY'
"""Kill rate of the mutmut mutants named by the globs, then of the SQL mutants."""
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

run_sql, globs = sys.argv[1] == "1", sys.argv[2:]
KILLED = {"killed", "timeout", "caught by type check"}
#: The fast tests every SQL mutant is judged by (the ones mutmut uses for the store).
FAST_TESTS = [
    "tests/test_store.py",
    "tests/test_terminal_guard.py",
    "tests/test_sweep.py",
    "tests/test_machine.py",
]
#: (what it breaks, file, regular expression, replacement): one mutant each, the first
#: match replaced. SQL literals are split over Python lines (`"` and line breaks between
#: words: J matches that) and columns may be qualified (`notices.`: Q matches that).
J = r'[\s"]*'
Q = r"(?:notices\.)?"
TERMINAL = r"\('accepted', 'failed', 'expired'\)"
#: Where the SQLite backend's claim and compare-and-set statements live.
STATEMENTS = "resetctl/store/sqlite/dialect.py"
SQL_MUTANTS = [
    ("claim boundary: due_at <= now becomes <",
     STATEMENTS, r"WHERE due_at <= :now", "WHERE due_at < :now"),
    ("claim order: oldest due first becomes newest first",
     STATEMENTS, rf"ORDER BY due_at{J}LIMIT :limit", "ORDER BY due_at DESC LIMIT :limit"),
    ("claim limit ignored",
     STATEMENTS, rf"ORDER BY due_at{J}LIMIT :limit", "ORDER BY due_at LIMIT -1"),
    ("claim keeps no record of the previous lease holder",
     STATEMENTS, r"SET taken_over_from = lease_owner,", "SET taken_over_from = NULL,"),
    ("claim counts no lease recovery",
     STATEMENTS, r"lease_recoveries \+ \(lease_owner IS NOT NULL\)", "lease_recoveries"),
    ("claim leaves the version alone",
     STATEMENTS, rf"version = version \+ 1({J}WHERE id IN)", r"version = version\1"),
    ("terminal guard on phase removed",
     STATEMENTS, rf"( phase = CASE WHEN )({Q}phase IN)", r"\g<1>0 AND \g<2>"),
    ("terminal guard on reason removed",
     STATEMENTS, rf"( reason = CASE WHEN )({Q}phase IN)", r"\g<1>0 AND \g<2>"),
    ("terminal guard on phase forgets 'expired'",
     STATEMENTS,
     rf"( phase = CASE WHEN {Q}phase IN{J}\('accepted', 'failed'), 'expired'\)", r"\1)"),
    ("terminal guard on phase_since removed",
     STATEMENTS, rf"( OR {Q}phase IN{J}){TERMINAL}({J}THEN {Q}phase_since)",
     r"\1('none')\2"),
    ("phase_since restarts on a write that keeps the phase",
     STATEMENTS, rf"(phase_since = CASE WHEN ){Q}phase = (?::phase|j\.phase) OR ", r"\1"),
    ("terminal notice made due again by a refused move",
     STATEMENTS, rf"(due_at = CASE WHEN ){Q}phase IN{J}{TERMINAL}", r"\g<1>0"),
    ("compare-and-set ignores the row version",
     STATEMENTS, rf"AND {Q}version = (?::version|j\.version)", "AND 1 = 1"),
    ("compare-and-set ignores the lease token",
     STATEMENTS, rf"(AND|OR) {Q}lease_token = (?::token|j\.token)", r"\1 1 = 1"),
]  # fmt: skip


def mutmut_rate() -> tuple[int, int]:
    statuses: Counter[str] = Counter()
    survivors = []
    for meta in Path("mutants").rglob("*.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if not any(fnmatch.fnmatchcase(name, glob) for glob in globs):
                continue
            status = status_by_exit_code[code]
            statuses[status] += 1
            if status not in KILLED:
                survivors.append(f"{status}: {name}")
    checked = sum(n for s, n in statuses.items() if s not in ("not checked", "skipped"))
    killed = sum(statuses[s] for s in KILLED)
    print(f"mutmut: {dict(statuses.most_common())}")
    if checked:
        print(f"mutmut kill rate: {killed}/{checked} = {killed / checked:.1%}")
    for line in sorted(survivors)[:60]:
        print("  ", line)
    if len(survivors) > 60:
        print(f"   ... and {len(survivors) - 60} more (mutmut results)")
    return killed, checked


def sql_rate() -> tuple[int, int]:
    killed = 0
    python = os.environ.get("PYTHON") or sys.executable
    missing = 0
    for what, file, pattern, replacement in SQL_MUTANTS:
        with tempfile.TemporaryDirectory() as tmp:
            for item in ("resetctl", "tests", "templates", "schema.sql", "pyproject.toml"):
                copy = shutil.copytree if Path(item).is_dir() else shutil.copy2
                copy(item, Path(tmp) / item)
            source = (Path(tmp) / file).read_text()
            mutated, applied = re.subn(pattern, replacement, source, count=1)
            if not applied:
                # Not counted: the SQL changed shape and this list needs updating.
                print(f"  NOT APPLIED (update SQL_MUTANTS): {what}")
                missing += 1
                continue
            (Path(tmp) / file).write_text(mutated)
            env = {**os.environ, "PYTHONPATH": tmp}
            done = subprocess.run(
                [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                 "-o", "timeout=60", *FAST_TESTS],
                cwd=tmp, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            status = "killed" if done.returncode != 0 else "SURVIVED"
            killed += done.returncode != 0
            print(f"  {status}: {what}")
    total = len(SQL_MUTANTS) - missing
    print(f"SQL kill rate: {killed}/{total} = {killed / max(total, 1):.1%}")
    return killed, total


killed = checked = 0
if globs:
    k, c = mutmut_rate()
    killed, checked = killed + k, checked + c
if run_sql:
    print("SQL mutants:")
    k, c = sql_rate()
    killed, checked = killed + k, checked + c
if checked:
    print(f"overall kill rate: {killed}/{checked} = {killed / checked:.1%}")
PY
echo "took $((SECONDS - started)) s; work directory: $work"
