#!/usr/bin/env bash
# idxkeys: the indexer's key step (indexer_step: compress_step + indexer_step_finish in one
# kernel, plan read before the PDL wait) and query step (indexer_query_early: metadata before
# the wait) against the old kernels. Run from the repository root; at most ~150 s.
#   1. conformance: TestCUDACompress* and TestCUDAIndexer* (the default kernels, and
#      TestCUDAIndexerKernels/{keys=fused,query=early,query=lean}: the new kernels through the
#      same suites; lean = early with fewer instructions: Hadamard sign by xor, e2m1 by integer rounding)
#   2. BenchmarkCUDAIndexer: query late/early/lean, keys split/fused at b32-mtp3, b1-mtp3, prefill-4K
#   3. cmd/bench --indexer-only (V4-Flash ratio-4 layer through the graph, b=32 MTP 3 and 4K
#      prefill) with the old kernels (ikeys=1 iquery=1) and the new (ikeys=2 iquery=3: fused, lean); its
#      (b-k) column is (b) without the key step: (b) - (b-k) is what the key step costs the layer
#   4. compute-sanitizer racecheck of indexer_step on three indexer scenarios
# Log: $OUT/idxkeys.log (summary lines also on stdout); each step's full output in $OUT/<step>.txt.
set -u
OUT=${OUT:-/tmp/idxkeys-out}
mkdir -p "$OUT"
D=$(cd "$(dirname "$0")" && pwd)
B=/tmp/idxkeys-bin
mkdir -p "$B"
log=$OUT/idxkeys.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
fail=0
step() { # name limit cmd...
	local name=$1 lim=$2; shift 2
	local t0=$SECONDS
	timeout --kill-after=3 "$lim" "$@" >"$OUT/$name.txt" 2>&1
	local rc=$?
	say "=== $name rc=$rc ($((SECONDS - t0)) s)"
	[ $rc -eq 0 ] || fail=1
	return $rc
}
gunzip -c "$D/cuda.test.gz" >"$B/cuda.test" && gunzip -c "$D/bench.gz" >"$B/bench" && chmod +x "$B/cuda.test" "$B/bench" || { say "unpack failed"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$log"
R=$(pwd)

# 1. Conformance (TestCUDAIndexerKernels' keys=split and query=late are the default kernels,
#    which the plain tests already run).
step conformance 60 env -C "$R/attention/mla/cuda" "$B/cuda.test" -test.v -test.count 1 \
	-test.run 'TestCUDAIndexer|TestCUDACompress' -test.skip 'TestCUDAIndexerKernels/(keys=split|query=late)$'
grep -E '^(--- |FAIL|ok|PASS|panic)' "$OUT/conformance.txt" | tee -a "$log" | head -20
say "conformance subtests: $(grep -c -- '--- PASS' "$OUT/conformance.txt") pass, $(grep -c -- '--- FAIL' "$OUT/conformance.txt") fail"
grep -E -B8 -- '--- FAIL' "$OUT/conformance.txt" | cut -c1-400 | head -60 | tee -a "$log"

# 2. Kernel times, old against new, 20 calls in a graph, best of 20 replays.
step kernels 35 env -C "$R/attention/mla/cuda" "$B/cuda.test" -test.run XXX \
	-test.bench '^BenchmarkCUDAIndexer$/^(query|keys)$/^(b32-mtp3|b1-mtp3|prefill-4K)$/' -test.benchtime 20x
grep -E 'copy:|indexer (query|keys) ' "$OUT/kernels.txt" | sed 's/^ *//' | tee -a "$log"

# 3. The layer through the graph (issue 23's goal), old kernels then new.
for v in "old:ikeys=1 iquery=1" "new:ikeys=2 iquery=3"; do
	n=${v%%:*}
	step "layer-$n" 20 "$B/bench" --indexer-only --models flash --graph-reps 20 --indexer-batches 32 \
		--indexer-ctx-tokens 4096 --variant "${v#*:}" --out "$OUT/layer-$n.json"
	grep -E '^indexer flash|^\| flash' "$OUT/layer-$n.txt" | sed "s/^/$n: /" | tee -a "$log"
done
# 4. racecheck of indexer_step's shared memory (pooled row, barriers) on three scenarios.
step racecheck 15 env -C "$R/attention/mla/cuda" compute-sanitizer --tool racecheck --error-exitcode 9 "$B/cuda.test" -test.v \
	-test.run 'TestCUDAIndexerKernels/keys=fused/CompressStep/indexer/r4/(prompt257|mixed-full|decode)$'
grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^(--- |FAIL|ok|PASS)' "$OUT/racecheck.txt" | head -5 | tee -a "$log"
say "=== done in $SECONDS s, fail=$fail"
exit $fail
