#!/usr/bin/env bash
# Issue 12's figures for one commit: lifecycle against both floors and huey, the idle
# tick, and the sweep's profile. The commit (default HEAD) is exported to a temporary
# directory and measured from there, so uncommitted edits in the checkout never leak into
# the figures; the benchmarks are the checkout's bench/ (so an older commit is measured
# the same way), run by the checkout's virtualenv (huey: pip install -e '.[bench]').
#
#   bench/speed.sh                 # HEAD
#   bench/speed.sh 71d5724         # another commit
#   ROUNDS=5 RUNS=25 bench/speed.sh
#   GUARDS=1 bench/speed.sh        # also the targets that must still hold: claim, replay
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse "${1:-HEAD}")
python=$PWD/.venv/bin/python
work=$(mktemp -d "${TMPDIR:-/tmp}/resetctl-speed.XXXXXX")
trap 'rm -rf "$work"' EXIT
git archive "$commit" | tar -x -C "$work"
cp bench/lifecycle.py bench/idle.py bench/profile_sweep.py "$work/bench/"
cd "$work"
export PYTHONPATH=$work  # this tree's resetctl, ahead of the checkout's editable install
echo "commit $commit; load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" -c 'import resetctl, sys; sys.exit(0 if resetctl.__file__.startswith(sys.argv[1]) else "resetctl does not come from the export")' "$work"
echo "== python bench/lifecycle.py --rounds ${ROUNDS:-3}"
"$python" bench/lifecycle.py --rounds "${ROUNDS:-3}"
echo "== python bench/idle.py --runs ${RUNS:-15}"
"$python" bench/idle.py --runs "${RUNS:-15}"
echo "== python bench/profile_sweep.py"
"$python" bench/profile_sweep.py
if [ -n "${GUARDS:-}" ]; then
  echo "== python bench/claim.py"
  "$python" bench/claim.py
  echo "== python bench/replay.py"
  "$python" bench/replay.py
fi
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
