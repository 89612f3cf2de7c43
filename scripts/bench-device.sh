#!/usr/bin/env bash
# The whole benchmark in one device call:
#   1. the Go measurements (cmd/bench, built as .gpu/bench by scripts/build-gpu-tests.sh): copy
#      ceiling, check cases, the decode iteration, every kernel as a cold single launch, every
#      shape as a CUDA graph of many layers with distinct inputs, the engine's Begin/End host cost;
#   2. the proof that the PyTorch peers do equal work (bench/check_peers.py on the cases the Go
#      run wrote after checking them byte for byte against the CPU backend);
#   3. the chain from hidden states (issue 9): ours (.gpu/bench --chain-only: every layer with its
#      own weights in one CUDA graph, with the KV prologue forked, left out, in order and alone)
#      and its PyTorch peer (bench/chain_peer.py: torch._scaled_mm with block-wise scales,
#      torch.compile for the rest, one CUDA graph);
#   4. the PyTorch peers (bench/peers.py): the stronger whole-layer peer compiled and captured in
#      one graph, then the single kernels eager and compiled, within a time budget;
#   5. the tables (bench/report.py) and the plots (.gpu/bench report, gonum/plot).
# With ENGINES_PLUGIN=PLUGIN.py (a plugin that builds the serving engines' kernels from their
# source; not part of this repository), bench/engines.py times them after step 2, on the same
# shapes and check cases, and the tables use its figures instead of the quoted ones.
# No step's failure stops the later ones; each step's exit status is listed at the end, and the
# script exits 1 if any failed. Outputs land in $OUT (default /tmp/bench-out).
#
# Usage (from the repository root on the GPU machine, after scripts/build-gpu-tests.sh):
#   scripts/bench-device.sh [--quick | --chain-only] [extra cmd/bench flags...]
# Full: about 9 minutes on an H200 (each step has a timeout; the chain peer and the peers get what
# is left of a 540 s total, less 50 s for the report and plots; only a run where every earlier
# step hits its timeout goes past 10 minutes). --quick: about 6 minutes. --chain-only: only step 3
# and its tables and plots, about 3.5 minutes, never past 5 (the extra flags then go to the
# chain run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
quick=0 chain_only=0
case "${1:-}" in
--quick)
	quick=1
	shift
	;;
--chain-only)
	chain_only=1
	shift
	;;
esac
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

# The chain (step 3): ours, then the PyTorch peer within what is left of its limit.
run_chain() { # run_chain GO_LIMIT PEER_LIMIT [cmd/bench flags...]
	local go_lim=$1 peer_lim=$2
	shift 2
	step go-chain "$go_lim" bash -o pipefail -c '"$@" 2>&1 | tee "$0/bench-chain.log" | { grep -E "^(chain|copy|device|bench)" || true; }' "$OUT" \
		.gpu/bench --chain-only --out "$OUT/bench-chain.json" "$@"
	step chain-peer "$peer_lim" bash -o pipefail -c '"$@" 2>&1 | tee "$0/chain-peer.log" | { grep -Ei "error|fail|chain|check|device|copy|done" || true; } | tail -60' "$OUT" \
		python3 bench/chain_peer.py --out "$OUT/chain-peer.json" --budget-s $((peer_lim - 35)) "${chain_peer[@]}"
}

if [ "$chain_only" = 1 ]; then
	chain_peer=()
	run_chain 100 170 --graph-reps 20 "$@"
else
	if [ "$quick" = 1 ]; then
		gobench=(--quick --reps 30 --graph-reps 20 --host-reps 10 --host-prefill 512)
		peers=(--gen-batches 1,32 --ctx-tokens 4096 --graph-batches 8,32 --min-reps 20 --max-reps 50 --target-s 0.05)
		chain_go=(--graph-reps 10)
		chain_peer=(--gen-batches 1,32 --ctx-tokens 4096 --min-reps 10 --max-reps 30 --target-s 0.05)
		go_limit=150 total=430 chain_go_limit=100 chain_peer_limit=90
	else
		gobench=(--variants separate --variant-kernels=false)
		peers=()
		chain_go=(--graph-reps 20)
		chain_peer=(--min-reps 15 --max-reps 40 --target-s 0.1)
		go_limit=210 total=540 chain_go_limit=90 chain_peer_limit=130
	fi

	# 1. Go. The log keeps every line; the console gets all but the per-kernel rows.
	step go-bench "$go_limit" bash -o pipefail -c '"$@" 2>&1 | tee "$0/bench-go.log" | { grep -Ev "^(kv|q) " || true; }' "$OUT" \
		.gpu/bench --out "$OUT/bench-go.json" --check-dir "$check" --chain=false "${gobench[@]}" "$@"

	# 2. Equal work. The checker's self-test first, then the cases (the whole-layer peer compiled too
	# in the full run).
	compile=()
	[ "$quick" = 1 ] || compile=(--compile)
	step check-self 40 bash -o pipefail -c 'python3 bench/check_peers.py --self-test 2>&1 | tail -3'
	step check 90 bash -o pipefail -c 'python3 bench/check_peers.py "$@" 2>&1 | tail -30' _ "$check" --json "$OUT/check.json" "${compile[@]}"

	# 2b. The serving engines' kernels, when a plugin builds them (their JSON is rewritten after
	# every entry; past --budget-s the remaining shapes are skipped).
	if [ -n "${ENGINES_PLUGIN:-}" ]; then
		step engines 150 bash -o pipefail -c '"$@" 2>&1 | tee "$0/engines.log" | { grep -Ei "error|fail|check|engine" || true; } | tail -40' "$OUT" \
			python3 bench/engines.py --peers "$ENGINES_PLUGIN" --check-dir "$check" --ours "$OUT/bench-go.json" \
			--out "$OUT/engines.json" --markdown "$OUT/engines.md" --budget-s 110
	fi

	# 3. The chain. The peer gets at most its limit, and leaves the peers 60 s and the report 50.
	left=$((total - SECONDS - chain_go_limit - 110))
	[ "$left" -lt "$chain_peer_limit" ] && chain_peer_limit=$left
	[ "$chain_peer_limit" -ge 60 ] || chain_peer_limit=60
	run_chain "$chain_go_limit" "$chain_peer_limit" "${chain_go[@]}"

	# 4. The peers (the JSON is rewritten after every entry: a timeout keeps what was measured). They
	# get what is left of the total but 50 s for the report and plots; past --budget-s they skip the
	# compiled single kernels, past it + slack every entry.
	peers_limit=$((total - SECONDS - 50))
	[ "$peers_limit" -ge 60 ] || peers_limit=60
	peers+=(--budget-s $((peers_limit - 50)) --budget-slack-s 25)
	step peers "$peers_limit" bash -o pipefail -c '"$@" 2>&1 | tee "$0/peers.log" | { grep -Ei "error|iteration|layer graph|device|copy|selftest|done" || true; } | tail -40' "$OUT" \
		python3 bench/peers.py --out "$OUT/bench-peers.json" --back-to-back "${peers[@]}"
fi

# 5. Tables and plots. A chain-only run's report is the chain JSON itself.
report=()
if [ "$chain_only" = 1 ]; then
	[ -s "$OUT/bench-chain.json" ] && report=(--go "$OUT/bench-chain.json")
else
	report=(--go "$OUT/bench-go.json")
	[ -s "$OUT/bench-peers.json" ] && report+=(--peers "$OUT/bench-peers.json")
	[ -s "$OUT/bench-chain.json" ] && report+=(--chain "$OUT/bench-chain.json")
	[ -s "$OUT/engines.json" ] && report+=(--engines "$OUT/engines.json")
fi
chain_peer_json=()
[ -s "$OUT/chain-peer.json" ] && chain_peer_json=(--chain-peer "$OUT/chain-peer.json")
check_json=()
[ -s "$OUT/check.json" ] && check_json=(--check "$OUT/check.json")
if [ "${#report[@]}" -gt 0 ]; then
	step report 15 bash -c 'python3 bench/report.py "$@" --markdown "$0/tables.md" >/dev/null && { grep -A60 -i "^### goals" "$0/tables.md" | head -80; true; }' "$OUT" \
		"${report[@]}" "${check_json[@]}" "${chain_peer_json[@]}"
fi
if [ "$chain_only" = 0 ]; then
	plots=(--go "$OUT/bench-go.json")
	[ -s "$OUT/bench-peers.json" ] && plots+=(--peers "$OUT/bench-peers.json")
	[ -s "$OUT/engines.json" ] && plots+=(--engines "$OUT/engines.json")
	step plots 25 .gpu/bench report "${plots[@]}" --out-dir "$OUT"
fi
if [ -s "$OUT/bench-chain.json" ]; then
	step chain-plots 15 .gpu/bench report --go "$OUT/bench-chain.json" "${chain_peer_json[@]}" --out-dir "$OUT"
fi

echo "=== summary (outputs in $OUT)"
printf '%s\n' "${summary[@]}"
exit $fail
