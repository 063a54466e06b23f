#!/usr/bin/env bash
# The race, fault and soak tests, run N times (default 10) with two CPU-burning processes
# beside them: the tests must hold on a loaded machine, so this counts their failures.
#
#     bash bench/stress.sh          # 10 runs
#     bash bench/stress.sh 3
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
py=.venv/bin/python
burn() { "$py" -c 'while True: pass' & }
burn; b1=$!
burn; b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
failed=0
for i in $(seq 1 "$runs"); do
    started=$(date +%s)
    if "$py" -m pytest -q -p no:cacheprovider tests/test_races.py tests/test_faults.py \
        tests/test_soak.py tests/test_sweep_processes.py >"/tmp/resetctl-stress-$i.log" 2>&1; then
        result=passed
    else
        result=FAILED
        failed=$((failed + 1))
    fi
    echo "run $i: $result in $(( $(date +%s) - started )) s ($(tail -n 1 "/tmp/resetctl-stress-$i.log"))"
done
echo "$failed of $runs runs failed (logs: /tmp/resetctl-stress-*.log)"
[ "$failed" -eq 0 ]
