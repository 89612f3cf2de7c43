#!/usr/bin/env bash
# idx (issue 23: the indexer's share of a ratio-4 layer), binaries built from branch idx (COMMIT).
# Run from the repository root: bash .gpu-idx/run.sh   (<= 97 s in all; log $OUT/idx.log, each step's
# full output $OUT/<step>.txt, bench JSON $OUT/*.json). Steps, in priority order (each with its own
# timeout, cut to the time left; a step that cannot get 5 s is skipped and logged as such):
#  1. conformance: cuda.test TestCUDAIndexer* + TestCUDACompressStep (the default kernels, and
#     TestCUDAIndexerKernels/query=wide and query=wide,maxblocks=2: indexer_query_wide through the
#     query suite and rotate both or neither, every byte against mlatest's reference), and
#     TestCUDAGEMMWorkspaceReserve (the third stream's GEMM workspaces counted: 216 MiB + 60 KiB)
#  2. kernels: BenchmarkCUDAIndexer query lean vs wide at b32-mtp3, b1-mtp3, prefill-4K, prefill-16K
#     (20 calls in a graph, best replay, us a call; the copy floor beside)
#  3. layer-flash-{main,wide}: cmd/bench --indexer-only V4-Flash, b=32 MTP 3, 4K, 16K prefill, graphs of
#     8 layers, L2 flushed, median: (a) without the indexer, (b) the engine's way (query path on the main
#     stream), (b3) the query path (indexer wq_b GEMM + query step) on the third stream, (b3g) only the
#     wq_b GEMM there; "main" = default kernels (indexer_query_lean), "wide" = --variant iquery=4
#  4. streams: tests.test TestChainCUDAIndexerStreams/*/cuda-istream-aux (the engine with
#     cudatune.IndexerStreamAux, tiny + V4-Flash, graphs + eager, --verify byte for byte incl. the
#     indexer's buffers; the main-stream way is decode's, step 6)
#  5. layer-pro-{main,wide}: as 3 for V4-Pro (b=32 MTP 3, 4K)
#  6. decode-flash: decode --backend cuda --verify --summary-only --input hidden (defaults)
set -u
OUT=${OUT:-/tmp/idx-out}
mkdir -p "$OUT"
G=$(cd "$(dirname "$0")" && pwd)
R=$(pwd)
B=/tmp/idx-bin
mkdir -p "$B"
log=$OUT/idx.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
T0=$SECONDS
BUDGET=97
fail=0
# The kernels' cubin cache stays the default one (a warm machine's compiles are reused).
export GOTRACEBACK=all
step() { # name limit cmd...
	local name=$1 lim=$2; shift 2
	local left=$((BUDGET - (SECONDS - T0)))
	[ $lim -gt $left ] && lim=$left
	if [ $lim -lt 5 ]; then
		say "=== $name skipped: $left s left"
		return 0
	fi
	local t0=$SECONDS
	timeout -s QUIT --kill-after=2 "$lim" "$@" >"$OUT/$name.txt" 2>&1
	local rc=$?
	say "=== $name rc=$rc ($((SECONDS - t0)) s of $lim)"
	[ $rc -eq 0 ] || fail=1
	return $rc
}
for f in cuda.test tests.test bench decode; do
	gunzip -c "$G/$f.gz" >"$B/$f" && chmod +x "$B/$f" || { say "unpack of $f failed"; exit 2; }
done
say "# idx: binaries of $(cat "$G/COMMIT" 2>/dev/null), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$log"

# 1. Conformance.
step conformance 40 env -C "$R/attention/mla/cuda" "$B/cuda.test" -test.v -test.count 1 \
	-test.run 'TestCUDAIndexer|TestCUDACompressStep|TestCUDAGEMMWorkspaceReserve' -test.skip 'TestCUDAIndexerKernels/(keys=split|query=late|query=early)$'
grep -E '^(--- |FAIL|ok|PASS|panic)' "$OUT/conformance.txt" | tee -a "$log" | head -20
say "conformance subtests: $(grep -c -- '--- PASS' "$OUT/conformance.txt") pass, $(grep -c -- '--- FAIL' "$OUT/conformance.txt") fail"
grep -E -B6 -- '--- FAIL' "$OUT/conformance.txt" | cut -c1-300 | head -40 | tee -a "$log"

# 2. Kernel times: lean against wide.
step kernels 14 env -C "$R/attention/mla/cuda" "$B/cuda.test" -test.run XXX \
	-test.bench '^BenchmarkCUDAIndexer$/^query$/^(b32-mtp3|b1-mtp3|prefill-4K|prefill-16K)$/^(lean|wide)$' -test.benchtime 20x
grep -E 'copy:|indexer query ' "$OUT/kernels.txt" | sed 's/^ *//' | tee -a "$log"

# 3. V4-Flash's ratio-4 layer through the graph.
layer() { # model name variant shapes...
	local md=$1 n=$2 v=$3 lim=$4; shift 4
	step "layer-$md-$n" "$lim" "$B/bench" --indexer-only --indexer-no-topk --models "$md" --graph-reps 15 --variant "$v" "$@" \
		--out "$OUT/layer-$md-$n.json"
	grep -E '^  indexer .*us/layer' "$OUT/layer-$md-$n.txt" | sed "s/^/$md-$n: /" >>"$log"
	grep -E '^\| |^bench:' "$OUT/layer-$md-$n.txt" | sed "s/^/$md-$n: /" | tee -a "$log"
}
layer flash main "" 30 --indexer-batches 32 --indexer-ctx-tokens 4096,16384
layer flash wide "iquery=4" 15 --indexer-batches 32 --indexer-ctx-tokens 4096,16384

# 4. The engine's third stream, verified.
step streams 25 env -C "$R/tests" "$B/tests.test" -test.v -test.count 1 -test.run 'TestChainCUDAIndexerStreams/.*/cuda-istream-aux'
grep -E '^(\s*--- |FAIL|ok|PASS|panic)' "$OUT/streams.txt" | tee -a "$log" | head -12
grep -E -A8 -- '--- FAIL' "$OUT/streams.txt" | cut -c1-300 | head -30 | tee -a "$log"

# 5. V4-Pro.
layer pro main "" 14 --indexer-batches 32 --indexer-ctx-tokens 4096
layer pro wide "iquery=4" 14 --indexer-batches 32 --indexer-ctx-tokens 4096

# 6. decode --verify, V4-Flash (the defaults).
step decode-flash 30 "$B/decode" --backend cuda --verify --summary-only --input hidden
grep -E '^(replayed|engine:|verified|verify|error|Error)|mismatch|differ' "$OUT/decode-flash.txt" | head -6 | tee -a "$log"
tail -3 "$OUT/decode-flash.txt" | tee -a "$log"

say "=== done in $((SECONDS - T0)) s, fail=$fail"
exit $fail
