#!/usr/bin/env bash
# The whole benchmark in one device call: the Go kernels and decode
# iteration (cmd/bench), the proof that the PyTorch peers do equal work
# (bench/check_peers.py on cases cmd/bench checked against the CPU backend),
# the peers eager and under torch.compile (bench/peers.py), and the merged
# tables (bench/report.py). Outputs land in $OUT (default /tmp/bench-out).
# Run from the repository root on the GPU machine after
# scripts/build-gpu-tests.sh built .gpu/bench here.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
check=/tmp/prologue-check
rm -rf "$check"
.gpu/bench --out "$OUT/bench-go.json" --check-dir "$check" --variants separate --variant-kernels=false "$@" | tee "$OUT/bench-go.log" | grep -Ev '^(kv|q) '
python3 bench/check_peers.py --self-test 2>&1 | tail -3
python3 bench/check_peers.py "$check" --json "$OUT/check.json" 2>&1 | tail -12
timeout 330 python3 bench/peers.py --out "$OUT/bench-peers.json" --back-to-back 2>&1 | tee "$OUT/peers.log" | grep -Ei 'error|iteration|device|copy' | tail -20
python3 bench/report.py --go "$OUT/bench-go.json" --peers "$OUT/bench-peers.json" --check "$OUT/check.json" --markdown "$OUT/tables.md" >/dev/null
grep -A40 -i 'goals' "$OUT/tables.md" | head -60
