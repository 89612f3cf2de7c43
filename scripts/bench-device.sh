#!/usr/bin/env bash
# The whole benchmark in one device call:
#   1. the Go measurements (cmd/bench, built as .gpu/bench by scripts/build-gpu-tests.sh): copy
#      ceiling, check cases, the decode iteration, every kernel as a cold single launch, every
#      shape as a CUDA graph of many layers with distinct inputs, the engine's Begin/End host cost;
#   2. the proof that the PyTorch peers do equal work (bench/check_peers.py on the cases the Go
#      run wrote after checking them byte for byte against the CPU backend);
#   3. the PyTorch peers (bench/peers.py): the stronger whole-layer peer compiled and captured in
#      one graph, then the single kernels eager and compiled, within a time budget;
#   4. the tables (bench/report.py) and the plots (.gpu/bench report, gonum/plot).
# No step's failure stops the later ones; each step's exit status is listed at the end, and the
# script exits 1 if any failed. Outputs land in $OUT (default /tmp/bench-out).
#
# Usage (from the repository root on the GPU machine, after scripts/build-gpu-tests.sh):
#   scripts/bench-device.sh [--quick] [extra cmd/bench flags...]
# Full: about 8 minutes on an H200, never past 9.5 (each step has a timeout, and the peers get
# what is left of the total, less a reserve for the report). --quick: about 4-5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
quick=0
if [ "${1:-}" = "--quick" ]; then
	quick=1
	shift
fi
# The check cases are ~200 MB of safetensors: kept out of $OUT.
check=${CHECK_DIR:-/tmp/prologue-check}
rm -rf "$check"
declare -a summary
fail=0
step() { # step NAME TIMEOUT_S COMMAND...: runs it, records its exit status
	local name=$1 limit=$2
	shift 2
	local t0=$SECONDS
	echo "=== $name"
	timeout --kill-after=10 "$limit" "$@"
	local rc=$?
	summary+=("$(printf '%-12s exit %3d  %4ds' "$name" "$rc" $((SECONDS - t0)))")
	[ "$rc" -eq 0 ] || fail=1
	return 0
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee "$OUT/device.txt"

if [ "$quick" = 1 ]; then
	gobench=(--quick --reps 30 --graph-reps 20 --host-reps 10 --host-prefill 512)
	peers=(--gen-batches 1,32 --ctx-tokens 4096 --graph-batches 8,32 --min-reps 20 --max-reps 50 --target-s 0.05)
	go_limit=150 total=290
else
	gobench=(--variants separate --variant-kernels=false)
	peers=()
	go_limit=210 total=560
fi

# 1. Go. The log keeps every line; the console gets all but the per-kernel rows.
step go-bench "$go_limit" bash -o pipefail -c '"$@" 2>&1 | tee "$0/bench-go.log" | { grep -Ev "^(kv|q) " || true; }' "$OUT" \
	.gpu/bench --out "$OUT/bench-go.json" --check-dir "$check" "${gobench[@]}" "$@"

# 2. Equal work. The checker's self-test first, then the cases (the whole-layer peer compiled too
# in the full run).
compile=()
[ "$quick" = 1 ] || compile=(--compile)
step check-self 40 bash -o pipefail -c 'python3 bench/check_peers.py --self-test 2>&1 | tail -3'
step check 90 bash -o pipefail -c 'python3 bench/check_peers.py "$@" 2>&1 | tail -30' _ "$check" --json "$OUT/check.json" "${compile[@]}"

# 3. The peers (the JSON is rewritten after every entry: a timeout keeps what was measured). They
# get what is left of the total but 40 s for the report; past --budget-s they skip the compiled
# single kernels, past it + slack every entry.
peers_limit=$((total - SECONDS - 40))
[ "$peers_limit" -ge 60 ] || peers_limit=60
peers+=(--budget-s $((peers_limit - 50)) --budget-slack-s 25)
step peers "$peers_limit" bash -o pipefail -c '"$@" 2>&1 | tee "$0/peers.log" | { grep -Ei "error|iteration|layer graph|device|copy|selftest|done" || true; } | tail -40' "$OUT" \
	python3 bench/peers.py --out "$OUT/bench-peers.json" --back-to-back "${peers[@]}"

# 4. Tables and plots.
report=(--go "$OUT/bench-go.json")
[ -s "$OUT/bench-peers.json" ] && report+=(--peers "$OUT/bench-peers.json")
check_json=()
[ -s "$OUT/check.json" ] && check_json=(--check "$OUT/check.json")
step report 15 bash -c 'python3 bench/report.py "$@" --markdown "$0/tables.md" >/dev/null && { grep -A60 -i "^### goals" "$0/tables.md" | head -80; true; }' "$OUT" "${report[@]}" "${check_json[@]}"
step plots 25 .gpu/bench report "${report[@]}" --out-dir "$OUT"

echo "=== summary (outputs in $OUT)"
printf '%s\n' "${summary[@]}"
exit $fail
